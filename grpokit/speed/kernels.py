"""C kernels for the decode loop (``decode_step.c``), the training attention
(``attention_train.c``), the output layer's log-softmax (``head_softmax.c``; shared float
helpers in ``kernel_math.h``), the training RMSNorm (``rms_norm.c``) and, on CPUs with AMX
or AVX512-BF16, the decode loop's bf16 matrix products (``amx_linear.c``,
:func:`packed_linear_packer`), compiled on first use into one library with the machine's C
compiler for the machine's own CPU, and loaded with ctypes.

Why: a decode step of SmolLM2-135M at 32 rows does a few ms of matrix products, and around
them ~20 small torch operations a layer (norms, rotary, cache writes, attention, SiLU,
residual adds), 30 layers a step, each a Python dispatch and most of them single-threaded.
The profile of a bench generation phase (config (a), AMD EPYC family 26 model 2) gave torch's
attention (``scaled_dot_product_attention``) 34% of it (1.66 of 4.86 s): it blocks its
queries for prefill-sized work. :func:`decode_attention` reads each row's keys and values
once for the g query heads that share them, with an online softmax in float32; measured at
32 rows x 3 key/value heads x 3 queries x 64 dims, bf16, 2 threads (25689c5, one process):
0.22 -> 0.053 ms at 60 slots, 0.44 -> 0.17 ms at 200 (``bench/decode_attention.py``). :class:`StepKernels` does
the rest of a layer's work between its products in three calls: rotary + cache write +
attention, residual add + RMSNorm, SiLU x up; the completions of one prompt (its cached keys
and values copied to each row) read the prompt's slots once for all their queries
(:func:`row_chunks`). :func:`sample_tokens` draws the step's tokens
from its float32 logits (temperature, min-p, inverse transform) in one call where torch ran
softmax, a single-threaded cumsum and a search over (n, V).

:func:`attention_forward` is the training (and reference) attention's forward, in place of
SDPA's CPU flash forward, and :func:`attention_grad_scores` the middle of its backward
(``grpokit/speed/attention.py``): from the saved q, k, v, output and the output's gradient, the
softmax P and its gradient dS in the inputs' dtype. Each is one pass per key/value head;
the backward's replaces ~12 torch passes over float32 (rows, heads, queries, keys) tensors.
:func:`head_log_softmax` gives ``grpokit.algo.linear_logprobs`` each token chunk's
log-probs, entropies and kept softmax from the chunk's bf16 logits in three passes a row:
measured (AMD EPYC family 26 model 2, 2 threads, 170 tokens x 49,152 vocabulary, bf16) 2.4
ms against ~10 ms for torch's upcast, scaling, log-softmax, exp, dots and cast.

Nothing here is required: no compiler, a failed build, another platform, or
``GRPOKIT_NO_KERNELS=1`` leave :func:`decode_attention`, :func:`step_kernels`,
:func:`attention_forward` and :func:`attention_grad_scores` returning None, and the caller keeps torch's operations (the
same numbers up to float summation order).
The build runs once per source and CPU into ``$GRPOKIT_CACHE`` (default ``~/.cache/grpokit``)
``/kernels``: the flag ``-march=native`` makes the library specific to the CPU that built it,
so the CPU's model and flags are part of the file name. It links OpenMP by the name torch's
own runtime has (``libgomp.so.1``), so the kernels' threads are torch's thread pool, not a
second one.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from grpokit.models import grpokit_cache

log = logging.getLogger("grpokit")

SOURCES = tuple(
    Path(__file__).with_name(n)
    for n in ("decode_step.c", "attention_train.c", "head_softmax.c", "rms_norm.c", "amx_linear.c",
              "elementwise_train.c", "decode_layers.c")
)  # fmt: skip
HEADERS = (Path(__file__).with_name("kernel_math.h"),)  # included by the sources
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fassociative-math",
         "-fno-signed-zeros", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC"]  # fmt: skip
_lib: ctypes.CDLL | None | bool = None  # False: tried, unavailable


def _cpu_key() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    keep = [ln for ln in text.splitlines() if ln.split(":")[0].strip() in ("model name", "flags")]
    return "\n".join(sorted(set(keep)))


def library_path() -> Path:
    """Where the build for these sources, these flags and this CPU lives."""
    h = hashlib.sha256()
    files = (*SOURCES, *HEADERS)
    for part in (*(f.read_bytes() for f in files), " ".join(FLAGS).encode(), _cpu_key().encode()):
        h.update(part)
    return grpokit_cache() / "kernels" / f"kernels-{h.hexdigest()[:16]}.so"


def build_library(dest: Path, compile_to) -> None:
    """Run ``compile_to(out)`` (a command line writing a library to ``out``) into a
    temporary file beside ``dest``, then move it to ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        out = Path(tmp) / dest.name
        cmd = compile_to(out)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
        os.replace(out, dest)  # atomic: a concurrent build or load sees a whole file


def _build(dest: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc, gcc or $CC)")
    build_library(dest, lambda out: [cc, *FLAGS, *map(str, SOURCES), "-o", str(out), "-lm"])


def _declare(lib: ctypes.CDLL) -> None:
    """The argument and return types of the library's functions."""
    ptr, i, long_, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
    signatures = {
        "decode_attention": [ptr, long_, ptr, ptr, ptr, long_, ptr, i, i, i, i, long_,
                             long_, f],
        "decode_rope_attention": [ptr, long_, i, i, i, ptr, ptr, ptr, ptr, ptr, long_,
                                  long_, ptr, long_, long_, f, ptr, ptr, i, long_],
        "decode_add_rms": [ptr, ptr, ptr, f, ptr, i, i],
        "decode_silu_mul": [ptr, ptr, i, i],
        "keep_times": [ptr, ptr, long_, ptr],
        "rope_forward": [ptr, long_, long_, long_, i, i, i, i, ptr, ptr, long_, long_, ptr,
                         long_, long_, long_],
        "rope_backward": [ptr, long_, long_, long_, i, i, i, i, ptr, ptr, long_, long_, ptr,
                          long_, long_, long_],
        "silu_mul_forward": [ptr, ptr, ptr, long_],
        "silu_mul_backward": [ptr] * 5 + [long_],
        "silu_mul_backward_remake": [ptr] * 6 + [long_],
    }  # fmt: skip
    for name, args in signatures.items():
        for suffix in ("bf16", "f32"):
            fn = getattr(lib, f"{name}_{suffix}")
            fn.argtypes, fn.restype = args, None
    lib.amx_linear_ready.argtypes, lib.amx_linear_ready.restype = [], i
    lib.amx_pack_bf16.argtypes, lib.amx_pack_bf16.restype = [ptr, long_, long_, ptr], None
    lib.packed_linear_isa.argtypes, lib.packed_linear_isa.restype = [], i
    lib.packed_linear_bf16.argtypes = [i, ptr, long_, long_, ptr, long_, ptr, ptr]
    lib.packed_linear_bf16.restype = i
    lib.attention_forward_amx_bf16.argtypes = [ptr] * 4 + [long_, i, i, i, i, i, f, ptr]
    lib.attention_forward_amx_bf16.restype = i
    lib.dropout_keep.argtypes = [long_, ctypes.c_uint64, ctypes.c_uint64, ptr]
    lib.dropout_keep.restype = None
    lib.transpose_u16.argtypes, lib.transpose_u16.restype = [ptr, long_, long_, long_, ptr], None
    lib.sum_bf16_as_f32.argtypes, lib.sum_bf16_as_f32.restype = [ptr, ptr, i, long_, ptr], None
    lib.bf16_into_f32.argtypes = [ptr, long_, long_, long_, i, i, ptr]
    lib.bf16_into_f32.restype = None
    lib.attention_grad_scores_amx_bf16.argtypes = [ptr] * 6 + [long_, i, i, i, i, i, f,
                                                                ptr, ptr]  # fmt: skip
    lib.attention_grad_scores_amx_bf16.restype = i
    lib.decode_layers_bf16.argtypes = [i, ptr, i, ptr, f, i, i, i, i, i, i, ptr, ptr, ptr, ptr,
                                       ptr, ptr, ptr, ptr, long_, long_, ptr, long_, f, ptr,
                                       i, long_]  # fmt: skip
    lib.decode_layers_bf16.restype = i
    for fn in (lib.decode_sample_f32, lib.decode_sample_bf16):
        fn.argtypes, fn.restype = [ptr, long_, i, i, f, f, ptr, ptr], long_
    for suffix in ("bf16", "f32"):
        fn = getattr(lib, f"attention_grad_scores_{suffix}")
        fn.argtypes = [ptr] * 6 + [long_, i, i, i, i, i, f, ptr, ptr]
        fn.restype = i
        fn = getattr(lib, f"attention_forward_{suffix}")
        fn.argtypes = [ptr] * 4 + [long_, i, i, i, i, i, f, ptr]
        fn.restype = i
        fn = getattr(lib, f"head_log_softmax_{suffix}")
        fn.argtypes = [ptr, long_, i, i, f, ptr, ptr, ptr, ptr, ptr, long_]
        fn.restype = long_
        fn = getattr(lib, f"rms_norm_forward_{suffix}")
        fn.argtypes, fn.restype = [ptr, ptr, f, ptr, ptr, long_, i], None
        fn = getattr(lib, f"rms_norm_backward_{suffix}")
        fn.argtypes, fn.restype = [ptr] * 6 + [long_, i], i


def _load() -> ctypes.CDLL | None:
    global _lib
    if _lib is None:
        _lib = False
        if os.environ.get("GRPOKIT_NO_KERNELS") or not sys.platform.startswith("linux"):
            return None
        try:
            path = library_path()
            if not path.exists():
                _build(path)
            lib = ctypes.CDLL(str(path))
            _declare(lib)
            _lib = lib
        except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
            log.info("C kernels unavailable (%s); using torch's operations", e)
    return _lib or None


MAX_G, MAX_D, MAX_Q = 16, 256, 64  # decode_step.c's MAX_G, MAX_D, MAX_Q


class RowChunks:
    """Which rows of a decode batch :meth:`StepKernels.rope_attention` takes together: chunk
    c is rows ``starts[c] .. starts[c + 1] - 1``, whose first ``prefix`` cache slots hold the
    same keys, values and mask bits (completions of one prompt), read once for the chunk.
    Made only by :func:`row_chunks`, which bounds every chunk by what the kernel holds."""

    def __init__(self, starts: torch.Tensor, prefix: int, n: int):
        self.starts, self.prefix, self.n = starts, prefix, n
        self.count = starts.numel() - 1


def row_chunks(group: torch.Tensor | None, n: int, prefix: int, g: int, KV: int) -> RowChunks:
    """Chunks of the ``n`` rows for :meth:`StepKernels.rope_attention`. ``group`` (n,): rows
    with equal ids, contiguous, share their first ``prefix`` cache slots; None: no row shares
    (every row its own chunk). A run of equal ids is split into chunks of at most MAX_Q // g
    rows, and smaller ones while there would be fewer than two (chunk, head) items a thread."""
    if group is None or prefix <= 0 or n == 0:
        return RowChunks(torch.arange(n + 1, dtype=torch.int64), 0, n)
    ids = group.tolist()
    if len(ids) != n:
        raise ValueError(f"row_chunks: {len(ids)} group ids for {n} rows")
    cap = max(1, min(MAX_Q // g, (n * KV) // max(1, 2 * torch.get_num_threads())))
    starts, seen = [0], {ids[0]}
    for i in range(1, n):
        if ids[i] != ids[i - 1]:
            if ids[i] in seen:
                raise ValueError("row_chunks: a group's rows are not contiguous")
            seen.add(ids[i])
            starts.append(i)
        elif i - starts[-1] >= cap:
            starts.append(i)
    starts.append(n)
    return RowChunks(torch.tensor(starts, dtype=torch.int64), int(prefix), n)


def _onednn_allows_amx() -> bool:
    """False when ``ONEDNN_MAX_CPU_ISA`` caps oneDNN below AMX (as the bf16 golden runs do,
    tests/trainer/golden_runs.py): the decode products then stay on oneDNN too."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    return cap in ("", "ALL", "DEFAULT") or "AMX" in cap


def amx_products() -> bool:
    """Whether bf16 products run on AMX in this process: the library built with AMX, the
    kernel granted the tile data, and oneDNN not capped below it."""
    lib = _load()
    return lib is not None and _onednn_allows_amx() and bool(lib.amx_linear_ready())


# The decode products on AVX512-BF16 where there is no AMX (or oneDNN is capped below it):
# amx_linear.c's avx512_linear_bf16 (False: oneDNN's packed product, for comparisons).
# Measured at 32 rows (AMD EPYC family 25 model 17, 2 threads, SmolLM2-135M's shapes):
# 409-440 GFLOP/s against oneDNN's 309-410, the same 355 on the 49,152-row output layer.
AVX512_PRODUCTS = True


def packed_linear_isa() -> int:
    """Where the decode loop's packed bf16 products run in this process: 2 on AMX
    (:func:`amx_products`), 1 on AVX512-BF16, 0 nowhere (oneDNN's product stays)."""
    if amx_products():
        return 2
    lib = _load()
    return 1 if lib is not None and AVX512_PRODUCTS and lib.packed_linear_isa() >= 1 else 0


def packed_linear_packer():
    """``(w, b) -> callable`` for the decode loop's bf16 products (``amx_linear.c``) on AMX
    or AVX512-BF16 (:func:`packed_linear_isa`): the weight (N, K) packed once into AMX's
    tile layout (both read it), each call ``x (M, K) -> x w^T + b`` in bf16, summed in
    float32. None where this machine, build or process has neither, or the kernels are off;
    the returned function gives None for a weight whose shape the kernel does not take
    (K % 32, N % 16), and the caller keeps its own product for that one."""
    isa = packed_linear_isa()
    if not isa:
        return None
    lib = _load()

    def pack(w: torch.Tensor, b: torch.Tensor | None):
        n, k = w.shape
        if w.dtype != torch.bfloat16 or k % 32 or n % 16 or (b is not None and b.dtype != w.dtype):
            return None
        w = w.contiguous()
        packed = torch.empty_like(w)
        lib.amx_pack_bf16(w.data_ptr(), n, k, packed.data_ptr())
        bias = None if b is None else b.contiguous()
        bias_ptr = None if bias is None else bias.data_ptr()

        def linear(x: torch.Tensor) -> torch.Tensor:
            x = x.contiguous()
            if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != k:
                raise ValueError(
                    f"packed_linear: x {tuple(x.shape)} {x.dtype} for a ({n}, {k}) bf16 weight"
                )
            y = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
            if x.shape[0] and lib.packed_linear_bf16(
                isa, x.data_ptr(), x.shape[0], k, packed.data_ptr(), n, bias_ptr, y.data_ptr()
            ):
                raise RuntimeError("packed_linear_bf16 refused its arguments")
            return y

        linear.keep = (packed, bias)  # alive as long as the callable; StepLayers reads them
        linear.shape = (n, k)
        linear.isa = isa
        return linear

    return pack


def decode_attention(
    q: torch.Tensor,  # (n, KV, g, D): the step's queries, g query heads per key/value head
    keys: torch.Tensor,  # (n, KV, T, D) the cache
    values: torch.Tensor,
    attend: torch.Tensor,  # (n, S) bool, S <= T: which of the first S slots each row sees
    scale: float,
) -> torch.Tensor | None:
    """``scaled_dot_product_attention(q, keys[:, :, :S], values[:, :, :S], attn_mask=attend[:,
    None, None], scale=scale)`` from the C kernel, or None when it does not apply (no kernel,
    another dtype or device, shapes past its limits, layouts it does not read)."""
    n, KV, g, D = q.shape
    S = attend.shape[1]
    dt = q.dtype
    if (
        dt not in (torch.bfloat16, torch.float32)
        or q.device.type != "cpu"
        or keys.dtype != dt
        or values.dtype != dt
        or attend.dtype != torch.bool
        or g > MAX_G
        or D > MAX_D
        or not (keys.is_contiguous() and values.is_contiguous() and attend.is_contiguous())
        or keys.shape != values.shape
        or keys.shape[:2] != (n, KV)
        or keys.shape[3] != D
        or attend.shape[0] != n
        or S > keys.shape[2]
        or q.stride()[1:] != (g * D, D, 1)
    ):
        return None
    lib = _load()
    if lib is None:
        return None
    out = torch.empty((n, KV, g, D), dtype=dt)
    fn = lib.decode_attention_bf16 if dt == torch.bfloat16 else lib.decode_attention_f32
    fn(q.data_ptr(), q.stride(0), keys.data_ptr(), values.data_ptr(), attend.data_ptr(), S,
       out.data_ptr(), n, KV, g, D, keys.shape[2], S, scale)  # fmt: skip
    return out


_SUFFIX = {torch.bfloat16: "bf16", torch.float32: "f32"}


def _step_args_ok(cos, sin, pos, attend, chunks, n: int, D: int, slot: int, slots: int) -> bool:
    """What a decode step's attention reads besides q/k/v and the cache, as the kernels read
    it: rotary tables (P, D), positions (n,) int64, the mask (n, S) bool with slot < S <=
    ``slots`` (the cache's), and :func:`row_chunks` of the n rows sharing at most ``slot``."""
    S = attend.shape[1]
    return (
        cos.shape == sin.shape
        and cos.shape[1] == D
        and cos.is_contiguous()
        and sin.is_contiguous()
        and pos.dtype == torch.int64
        and pos.shape == (n,)
        and pos.is_contiguous()
        and attend.dtype == torch.bool
        and attend.shape[0] == n
        and attend.is_contiguous()
        and 0 <= slot < S <= slots
        and isinstance(chunks, RowChunks)
        and chunks.n == n
        and chunks.prefix <= slot
    )


class StepKernels:
    """A decode layer's work between its products, for one dtype (bf16 or float32) and one
    model's head layout: :meth:`rope_attention`, :meth:`add_rms`, :meth:`silu_mul`. Each
    checks the shapes, dtypes and strides it reads, and raises ValueError on anything else
    (the decode loop builds its tensors to fit; a mismatch is a bug, not a fallback)."""

    def __init__(self, lib, dtype: torch.dtype, n_heads: int, n_kv: int, head_dim: int):
        sfx = _SUFFIX[dtype]
        self.dtype, self.H, self.KV, self.D = dtype, n_heads, n_kv, head_dim
        self._rope_attention = getattr(lib, f"decode_rope_attention_{sfx}")
        self._add_rms = getattr(lib, f"decode_add_rms_{sfx}")
        self._silu_mul = getattr(lib, f"decode_silu_mul_{sfx}")

    def _need(self, ok: bool, what) -> None:
        if not ok:
            raise ValueError(f"decode kernel: {what() if callable(what) else what}")

    def rope_attention(
        self, qkv, cos, sin, pos, kc, vc, slot: int, attend, scale: float, chunks=None
    ):
        """Rotary on the q and k heads of ``qkv`` (n, (H + 2 KV) D) at each row's position
        ``pos`` (n,) int64 (rows of the (P, D) ``cos``/``sin`` tables), k and v written into
        the caches ``kc``/``vc`` (n, KV, T, D) at ``slot``, then every query head's attention
        over the first S slots that ``attend`` (n, S) bool allows. ``chunks``
        (:func:`row_chunks`): rows whose first slots are the same, read once for them all
        (None: every row alone). Returns (n, H D)."""
        n = qkv.shape[0]
        if chunks is None:
            chunks = row_chunks(None, n, 0, self.H // self.KV, self.KV)
        H, KV, D = self.H, self.KV, self.D
        S = attend.shape[1]
        dt = self.dtype
        self._need(
            qkv.dtype == kc.dtype == vc.dtype == cos.dtype == sin.dtype == dt
            and qkv.device.type == "cpu"
            and qkv.shape == (n, (H + 2 * KV) * D)
            and qkv.stride(1) == 1
            and kc.shape == vc.shape
            and kc.shape[:2] == (n, KV)
            and kc.shape[3] == D
            and kc.is_contiguous()
            and vc.is_contiguous()
            and _step_args_ok(cos, sin, pos, attend, chunks, n, D, slot, kc.shape[2]),
            lambda: (
                f"rope_attention got qkv {tuple(qkv.shape)} {qkv.dtype}, cache "
                f"{tuple(kc.shape)}, slot {slot}, mask {tuple(attend.shape)}, chunks {chunks!r}"
            ),
        )
        out = torch.empty((n, H * D), dtype=dt)
        self._rope_attention(
            qkv.data_ptr(), qkv.stride(0), H, KV, D, cos.data_ptr(), sin.data_ptr(),
            pos.data_ptr(), kc.data_ptr(), vc.data_ptr(), kc.shape[2], slot, attend.data_ptr(),
            S, S, scale, out.data_ptr(), chunks.starts.data_ptr(), chunks.count, chunks.prefix,
        )  # fmt: skip
        return out

    def add_rms(self, x, y, w, eps: float, h) -> None:
        """In place: ``x += y`` (rounded to x's dtype; no add when ``y`` is None), then
        ``h = w * rms_norm(x)`` as transformers' LlamaRMSNorm (float32 norm, cast, scale).
        x, y, h: (n, C) contiguous; w: (C,)."""
        n, C = x.shape
        self._need(
            x.dtype == w.dtype == h.dtype == self.dtype
            and x.is_contiguous()
            and h.is_contiguous()
            and w.is_contiguous()
            and h.shape == x.shape
            and w.shape == (C,)
            and (y is None or (y.dtype == self.dtype and y.shape == x.shape and y.is_contiguous())),
            "add_rms: shapes or dtypes differ",
        )
        self._add_rms(x.data_ptr(), None if y is None else y.data_ptr(), w.data_ptr(), eps,
                      h.data_ptr(), n, C)  # fmt: skip

    def silu_mul(self, gu):
        """``silu(gu[:, :I]) * gu[:, I:]`` for the fused (n, 2 I) gate/up output."""
        n, I2 = gu.shape
        self._need(
            gu.dtype == self.dtype and gu.is_contiguous() and I2 % 2 == 0,
            "silu_mul: the gate/up output is not a contiguous (n, 2 I) tensor",
        )
        out = torch.empty((n, I2 // 2), dtype=self.dtype)
        self._silu_mul(gu.data_ptr(), out.data_ptr(), n, I2 // 2)
        return out


class _DecodeLayer(ctypes.Structure):
    """decode_layers.c's ``decode_layer_bf16``: one layer's packed products and norms."""

    _fields_ = [
        ("w", ctypes.c_void_p * 4),
        ("b", ctypes.c_void_p * 4),
        ("ln1", ctypes.c_void_p),
        ("ln2", ctypes.c_void_p),
        ("eps1", ctypes.c_float),
        ("eps2", ctypes.c_float),
    ]


class StepLayers:
    """Every decoder layer of a bf16 decode step in one C call (``decode_layers.c``): the
    kernels :class:`StepKernels` offers and the packed products (AMX or AVX512-BF16), in the
    order the per-layer loop calls them (so the same values), without the seven Python calls
    a layer between them. Made by :func:`step_layers` from layers whose four products are
    packed ones of one kind (:func:`packed_linear_packer`'s callables)."""

    def __init__(self, lib, layers, norm_w, norm_eps: float, H: int, KV: int, D: int, inter: int):
        self._fn = lib.decode_layers_bf16
        self.isa = layers[0].qkv.isa
        self.H, self.KV, self.D, self.I = H, KV, D, inter
        self.C = norm_w.shape[0]
        self.L = len(layers)
        self._keep = [norm_w]  # the tensors the structs point into
        self._layers = (_DecodeLayer * self.L)()
        for st, ly in zip(self._layers, layers, strict=True):
            for j, f in enumerate((ly.qkv, ly.o, ly.gu, ly.down)):
                packed, bias = f.keep
                st.w[j] = packed.data_ptr()
                st.b[j] = None if bias is None else bias.data_ptr()
                self._keep.append(f.keep)
            st.ln1, st.ln2 = ly.ln1.data_ptr(), ly.ln2.data_ptr()
            st.eps1, st.eps2 = ly.eps1, ly.eps2
            self._keep += [ly.ln1, ly.ln2]
        self._norm = (norm_w.data_ptr(), float(norm_eps))
        self._per_row = (H + 2 * KV) * D + H * D + self.C + 3 * inter

    def __call__(self, x, h, cos, sin, pos, keys, values, slot: int, attend, scale, chunks):
        """In place: ``x`` (n, C) the residual stream (in: the embeddings), ``h`` (n, C) the
        final norm of the last layer's output; keys and values written at ``slot``. The other
        arguments as :meth:`StepKernels.rope_attention` takes them, one cache tensor a layer
        in ``keys`` and ``values``."""
        n, C = x.shape
        S = attend.shape[1]
        k0 = keys[0]
        bf = torch.bfloat16
        ok = (
            x.dtype == h.dtype == cos.dtype == sin.dtype == bf
            and C == self.C
            and h.shape == x.shape
            and x.is_contiguous()
            and h.is_contiguous()
            and len(keys) == len(values) == self.L
            and k0.shape[:2] == (n, self.KV)
            and k0.shape[3] == self.D
            and _step_args_ok(cos, sin, pos, attend, chunks, n, self.D, slot, k0.shape[2])
            and all(
                t.shape == k0.shape and t.dtype == bf and t.is_contiguous()
                for t in (*keys, *values)
            )
        )
        if not ok:
            raise ValueError(
                f"decode layers got x {tuple(x.shape)} {x.dtype}, cache {tuple(k0.shape)}, "
                f"slot {slot}, mask {tuple(attend.shape)}, chunks {chunks!r}"
            )
        kp = (ctypes.c_void_p * self.L)(*(t.data_ptr() for t in keys))
        vp = (ctypes.c_void_p * self.L)(*(t.data_ptr() for t in values))
        work = torch.empty(n * self._per_row, dtype=bf)
        if self._fn(
            self.isa, self._layers, self.L, self._norm[0], self._norm[1], n, C, self.H, self.KV, self.D,
            self.I, x.data_ptr(), h.data_ptr(), work.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            pos.data_ptr(), kp, vp, k0.shape[2], slot, attend.data_ptr(), S, scale,
            chunks.starts.data_ptr(), chunks.count, chunks.prefix,
        ):  # fmt: skip
            raise RuntimeError("decode_layers_bf16: a packed product refused its arguments")


def step_layers(layers, norm_w, norm_eps: float, n_heads: int, n_kv: int, head_dim: int):
    """:class:`StepLayers` for these decoder layers (fastdecode's ``_Layer``: norms and
    packed products), or None where it does not apply: no library, or a product that is not
    a packed bf16 one (of the first's kind) of the shape the layer's position needs."""
    lib = _load()
    if lib is None or not layers or norm_w.dtype != torch.bfloat16 or n_heads % n_kv:
        return None
    if norm_w.dim() != 1 or not norm_w.is_contiguous():
        return None
    if head_dim > MAX_D or n_heads // n_kv > MAX_G or head_dim % 2:
        return None
    C = norm_w.shape[0]
    qkv = (n_heads + 2 * n_kv) * head_dim
    first = getattr(layers[0].gu, "shape", None)
    if first is None or first[0] % 2:
        return None
    inter = first[0] // 2
    want = ((qkv, C), (C, n_heads * head_dim), (2 * inter, C), (C, inter))
    for ly in layers:
        prods = (ly.qkv, ly.o, ly.gu, ly.down)
        if any(
            getattr(f, "shape", None) != s
            or not hasattr(f, "keep")
            or getattr(f, "isa", None) != layers[0].qkv.isa
            for f, s in zip(prods, want)
        ):
            return None
        if any(w.dtype != torch.bfloat16 or w.shape != (C,) or not w.is_contiguous()
               for w in (ly.ln1, ly.ln2)):  # fmt: skip
            return None
    return StepLayers(lib, layers, norm_w, norm_eps, n_heads, n_kv, head_dim, inter)


def sample_tokens(
    logits: torch.Tensor, temperature: float, min_p: float | None, u: torch.Tensor
) -> torch.Tensor | None:
    """One token a row of ``logits`` (n, V) float32 or bf16, drawn from ``softmax(logits /
    temperature)`` with min-p applied (None or 0: off), by inverse transform with the row's
    uniform ``u`` (n, 1) float32: the sampler's torch path (``filter_min_p``, softmax, cumsum,
    searchsorted) in one C call, the same draw up to float rounding at a token's boundary.
    bf16 logits draw what their float32 copy (``.float()``) draws, without making it.
    None when the kernel does not apply (no library, another dtype, device or layout) or a
    row is not finite (NaN, +inf, all -inf): the caller keeps torch's operations."""
    if (
        logits.dtype not in (torch.float32, torch.bfloat16)
        or logits.device.type != "cpu"
        or logits.dim() != 2
        or logits.stride(1) != 1
        or u.dtype != torch.float32
        or not u.is_contiguous()
        or u.numel() != logits.shape[0]
        or not temperature > 0
    ):
        return None
    lib = _load()
    if lib is None:
        return None
    n, V = logits.shape
    out = torch.empty(n, dtype=torch.int64)
    log_min_p = math.log(min_p) if min_p else -math.inf
    fn = lib.decode_sample_bf16 if logits.dtype == torch.bfloat16 else lib.decode_sample_f32
    bad = fn(logits.data_ptr(), logits.stride(0), n, V, temperature, log_min_p, u.data_ptr(),
             out.data_ptr())  # fmt: skip
    return None if bad else out


def step_kernels(dtype: torch.dtype, n_heads: int, n_kv: int, head_dim: int):
    """:class:`StepKernels` for ``dtype`` and this head layout, or None where they do not
    apply (no library; fp16 or another dtype; more than MAX_G query heads a key/value head
    or head_dim past MAX_D)."""
    if dtype not in _SUFFIX or n_heads % n_kv or n_heads // n_kv > MAX_G or head_dim > MAX_D:
        return None
    if head_dim % 2:
        return None
    lib = _load()
    return None if lib is None else StepKernels(lib, dtype, n_heads, n_kv, head_dim)


# The training attention's bf16 forward on AMX tiles where the build and process have them
# (attention_train.c's attention_forward_amx_bf16); False: the FMA forward (for comparisons)
USE_AMX_ATTENTION = True


def _attention_call(lib, name: str, dtype, args) -> int:
    """Run ``name``'s AMX kernel for bf16 where allowed (it returns -1 where this build or
    process has no AMX, or for another head size), else the FMA kernel; 0 when done."""
    if dtype == torch.bfloat16 and USE_AMX_ATTENTION and _onednn_allows_amx():
        done = getattr(lib, f"{name}_amx_bf16")(*args)
        if done >= 0:
            return done
    return getattr(lib, f"{name}_{_SUFFIX[dtype]}")(*args)


def _attention_args(q, k, v, mask, extra=()):
    """Contiguous copies (where needed) of the training attention kernels' inputs, or None
    where they do not apply (another dtype or device, shapes that do not match)."""
    B, G, M, D = q.shape
    N = k.shape[2]
    dt = q.dtype
    if (
        dt not in _SUFFIX
        or q.device.type != "cpu"
        or any(t.dtype != dt or t.device.type != "cpu" for t in (k, v, *extra))
        or k.shape != (B, G, N, D)
        or v.shape != k.shape
        or any(t.shape != q.shape for t in extra)
        or (mask is not None and (mask.dtype != torch.bool
                                  or mask.shape not in ((B, 1, M, N), (1, 1, M, N))))
    ):  # fmt: skip
        return None
    if mask is not None:
        mask = mask.contiguous()
    return [t.contiguous() for t in (q, k, v, *extra)], mask


def attention_forward(q, k, v, mask, scale: float):
    """Attention over q (B, G, M, D) and k, v (B, G, N, D) with ``mask`` (B or 1, 1, M, N) bool
    (True = attend) or None: SDPA's CPU flash forward for these lengths (exp(s - max) rounded
    to the inputs' dtype before the product with v, divided by the sum of the unrounded exps),
    in one pass per key/value head; a query row that sees no key gives 0 (SDPA: NaN). Returns
    (B, G, M, D) in q's dtype, or None when the kernel does not apply."""
    args = _attention_args(q, k, v, mask)
    lib = _load() if args is not None else None
    if lib is None:
        return None
    (q, k, v), mask = args
    B, G, M, D = q.shape
    N = k.shape[2]
    out = torch.empty_like(q)
    mask_b = 0 if mask is None or mask.shape[0] == 1 else M * N
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), None if mask is None else mask.data_ptr(),
            mask_b, G, B * G, M, N, D, scale, out.data_ptr())  # fmt: skip
    return None if _attention_call(lib, "attention_forward", q.dtype, args) else out


def attention_grad_scores(q, k, v, out, g_out, mask, scale: float):
    """The softmax P and its gradient dS of attention over q (B, G, M, D) and k, v (B, G, N,
    D) with ``mask`` (B or 1, 1, M, N) bool (True = attend) or None, given the attention's
    output ``out`` and its gradient ``g_out`` (B, G, M, D): ``P = softmax(scale q k^T)`` over
    the allowed keys (rows that allow none: 0) and ``dS = P (g_out v^T - rowsum(g_out out))
    scale``, sums and softmax in float32, both returned in q's dtype. None when the kernel does
    not apply (no library, another dtype or device, shapes that do not match)."""
    args = _attention_args(q, k, v, mask, (out, g_out))
    lib = _load() if args is not None else None
    if lib is None:
        return None
    ts, mask = args
    B, G, M, D = q.shape
    N = k.shape[2]
    P = torch.empty((B, G, M, N), dtype=q.dtype)
    dS = torch.empty_like(P)
    mask_b = 0 if mask is None or mask.shape[0] == 1 else M * N
    args = (*(t.data_ptr() for t in ts), None if mask is None else mask.data_ptr(), mask_b,
            G, B * G, M, N, D, scale, P.data_ptr(), dS.data_ptr())  # fmt: skip
    return None if _attention_call(lib, "attention_grad_scores", q.dtype, args) else (P, dS)


def head_log_softmax(x, scale: float, targets, logp, lse, ent=None, probs=None) -> bool:
    """The output layer's softmax statistics of a token chunk, for
    ``grpokit.algo.linear_logprobs`` (its ``softmax_rows``): from the logits ``x`` (n, V) bf16
    or float32 as the product left them, in place: ``logp`` (n,) = log_softmax(x * scale)
    at ``targets`` (n,) int64, ``lse`` (n,) = x[targets] * scale - logp, ``ent`` (n,) the
    entropy (None: not computed), ``probs`` (n, V) in x's dtype the softmax (None: not
    written); all float32 but ``probs``. One C call with three passes a row where torch ran
    ~7 operations over float32 (n, V) blocks. False (nothing trusted written) when the kernel
    does not apply (no library, another dtype, device or layout) or a row is not finite or
    has a target outside the vocabulary: the caller then runs torch's operations, whose
    values (or error) stand."""
    vec = (logp, lse) if ent is None else (logp, lse, ent)
    if (
        x.dtype not in _SUFFIX
        or x.device.type != "cpu"
        or x.dim() != 2
        or x.stride(1) != 1
        or not (scale > 0 and math.isfinite(scale))
        or targets.dtype != torch.int64
        or any(
            t.device.type != "cpu" for t in (targets, *vec, *(() if probs is None else (probs,)))
        )
        or not targets.is_contiguous()
        or targets.shape != (x.shape[0],)
        or any(
            t.dtype != torch.float32 or not t.is_contiguous() or t.shape != targets.shape
            for t in vec
        )
        or (
            probs is not None
            and (probs.dtype != x.dtype or probs.shape != x.shape or probs.stride(1) != 1)
        )
    ):
        return False
    lib = _load()
    if lib is None:
        return False
    n, V = x.shape
    fn = getattr(lib, f"head_log_softmax_{_SUFFIX[x.dtype]}")
    bad = fn(x.data_ptr(), x.stride(0), n, V, scale, targets.data_ptr(), logp.data_ptr(),
             lse.data_ptr(), None if ent is None else ent.data_ptr(),
             None if probs is None else probs.data_ptr(),
             0 if probs is None else probs.stride(0))  # fmt: skip
    return bad == 0


def _rms_args(x, w) -> bool:
    """Whether the RMSNorm kernels read ``x`` (.., C) and ``w`` (C,) as they are."""
    return (
        x.dtype in _SUFFIX
        and w.dtype == torch.float32
        and x.device.type == "cpu"
        and w.device.type == "cpu"
        and x.is_contiguous()
        and w.is_contiguous()
        and x.dim() >= 1
        and w.shape == (x.shape[-1],)
        and x.numel() > 0
    )


def rms_norm_applies(x, w) -> bool:
    """Whether :func:`rms_norm_forward` and :func:`rms_norm_backward` run for ``x`` and
    ``w`` (the library built, the dtypes, device and layouts they read)."""
    return _rms_args(x, w) and _load() is not None


def rms_norm_forward(x, w, eps: float):
    """Llama's RMSNorm of ``x`` (.., C) bf16 or float32 with the float32 weight ``w`` (C,):
    ``w * (x * r).to(x.dtype)``, ``r`` = 1 / sqrt(mean(x^2) + eps) over the last dimension,
    as transformers computes it, in one pass a row. Returns (y float32 like x, r (rows,)
    float32), or None when the kernel does not apply."""
    lib = _load() if _rms_args(x, w) else None
    if lib is None:
        return None
    C = x.shape[-1]
    n = x.numel() // C
    y = torch.empty(x.shape, dtype=torch.float32)
    r = torch.empty(n, dtype=torch.float32)
    getattr(lib, f"rms_norm_forward_{_SUFFIX[x.dtype]}")(
        x.data_ptr(), w.data_ptr(), eps, y.data_ptr(), r.data_ptr(), n, C
    )
    return y, r


def rms_norm_backward(dy, x, w, r, need_w: bool = True):
    """The gradients of :func:`rms_norm_forward`'s output w.r.t. ``x`` (in x's dtype) and
    ``w`` (float32; None when not ``need_w``) from ``dy`` (float32, x's shape) and the saved
    ``r``, as autograd computes them through transformers' operations (the weight's product
    rounded to x's dtype first). None when the kernel does not apply."""
    lib = None
    if (
        _rms_args(x, w)
        and dy.dtype == torch.float32
        and dy.shape == x.shape
        and dy.device.type == "cpu"
        and r.dtype == torch.float32
        and r.is_contiguous()
        and r.numel() * x.shape[-1] == x.numel()
    ):
        lib = _load()
    if lib is None:
        return None
    dy = dy.contiguous()
    C = x.shape[-1]
    dx = torch.empty_like(x)
    dw = torch.empty(C, dtype=torch.float32) if need_w else None
    failed = getattr(lib, f"rms_norm_backward_{_SUFFIX[x.dtype]}")(
        dy.data_ptr(), x.data_ptr(), w.data_ptr(), r.data_ptr(), dx.data_ptr(),
        None if dw is None else dw.data_ptr(), x.numel() // C, C,
    )  # fmt: skip
    return None if failed else (dx, dw)


def available() -> bool:
    """Whether the C kernels built and loaded on this machine."""
    return _load() is not None


def _rope_args(x, cos, sin) -> bool:
    """Whether the rotary kernels read ``x`` (B, H, T, D) and ``cos``/``sin`` (B or 1, T, D)
    as they are: x bf16 or float32 with unit stride along D (any other strides), the tables
    float32 with unit stride along D and the same strides as each other."""
    return (
        x.dtype in _SUFFIX
        and x.dim() == 4
        and x.device.type == "cpu"
        and x.shape[-1] % 2 == 0
        and x.stride(-1) == 1
        and x.numel() > 0
        and all(
            t.dtype == torch.float32
            and t.device.type == "cpu"
            and t.dim() == 3
            and t.shape[1:] == (x.shape[2], x.shape[3])
            and t.shape[0] in (1, x.shape[0])
            and t.stride(-1) == 1
            for t in (cos, sin)
        )
        and cos.stride() == sin.stride()
    )


def rope_applies(x, cos, sin) -> bool:
    """Whether :func:`rope_forward` and :func:`rope_backward` run for these tensors."""
    return _rope_args(x, cos, sin) and _load() is not None


def _rope_call(name: str, x, cos, sin, out) -> None:
    B, H, T, D = x.shape
    cb = cos.stride(0) if cos.shape[0] > 1 else 0
    getattr(_load(), f"{name}_{_SUFFIX[x.dtype]}")(
        x.data_ptr(), x.stride(0), x.stride(1), x.stride(2), B, H, T, D,
        cos.data_ptr(), sin.data_ptr(), cb, cos.stride(1),
        out.data_ptr(), out.stride(0), out.stride(1), out.stride(2),
    )  # fmt: skip


def rope_forward(x, cos, sin) -> torch.Tensor:
    """transformers' ``x * cos + rotate_half(x) * sin`` for ``x`` (B, H, T, D) and float32
    ``cos``/``sin`` (B or 1, T, D), computed in float32 and returned contiguous in x's dtype
    (bf16: the cast the attention makes of the float32 result; the caller checked
    :func:`rope_applies`)."""
    y = torch.empty(x.shape, dtype=x.dtype)
    _rope_call("rope_forward", x, cos, sin, y)
    return y


def rope_backward(g, cos, sin, shape, stride, dtype) -> torch.Tensor:
    """The gradient w.r.t. the input of :func:`rope_forward`, from the output's gradient
    ``g``, as autograd computes it through transformers' operations; in the input's dtype and
    memory layout (``shape``, ``stride``; contiguous where its last dimension was strided)."""
    if g.dtype != dtype or g.stride(-1) != 1:
        g = g.to(dtype).contiguous()
    if stride[-1] == 1:
        dx = torch.empty_strided(shape, stride, dtype=dtype)
    else:
        dx = torch.empty(shape, dtype=dtype)
    _rope_call("rope_backward", g, cos, sin, dx)
    return dx


def silu_mul_applies(g, u) -> bool:
    """Whether :func:`silu_mul_forward` and :func:`silu_mul_backward` run for ``g``, ``u``:
    the same shape and dtype (bf16 or float32), contiguous, on the CPU."""
    return (
        g.dtype in _SUFFIX
        and u.dtype == g.dtype
        and g.shape == u.shape
        and g.device.type == "cpu"
        and u.device.type == "cpu"
        and g.is_contiguous()
        and u.is_contiguous()
        and _load() is not None
    )


def silu_mul_forward(g, u) -> torch.Tensor:
    """``silu(g) * u`` in one pass, rounded as torch rounds each of the two operations."""
    y = torch.empty_like(g)
    getattr(_load(), f"silu_mul_forward_{_SUFFIX[g.dtype]}")(
        g.data_ptr(), u.data_ptr(), y.data_ptr(), g.numel()
    )
    return y


def silu_mul_backward(dy, g, u, need_g: bool = True, need_u: bool = True):
    """(d g, d u) of ``silu(g) * u`` from the output's gradient ``dy`` (None where not
    needed), as autograd computes them through silu_backward and the two products."""
    dy = dy.to(g.dtype).contiguous()
    dg = torch.empty_like(g) if need_g else None
    du = torch.empty_like(u) if need_u else None
    getattr(_load(), f"silu_mul_backward_{_SUFFIX[g.dtype]}")(
        dy.data_ptr(), g.data_ptr(), u.data_ptr(),
        None if dg is None else dg.data_ptr(), None if du is None else du.data_ptr(), g.numel(),
    )  # fmt: skip
    return dg, du


def silu_mul_backward_remake(dy, g, u, need_g: bool = True, need_u: bool = True):
    """(``silu(g) * u``, d g, d u): :func:`silu_mul_backward`'s gradients (None where not
    needed) and, from the same pass, :func:`silu_mul_forward`'s output again, bit for bit
    (one exp and one read of ``g`` and ``u`` an element where the two calls made two)."""
    dy = dy.to(g.dtype).contiguous()
    y, dg, du = torch.empty_like(g), torch.empty_like(g), torch.empty_like(u)
    getattr(_load(), f"silu_mul_backward_remake_{_SUFFIX[g.dtype]}")(
        dy.data_ptr(), g.data_ptr(), u.data_ptr(), y.data_ptr(), dg.data_ptr(), du.data_ptr(),
        g.numel(),
    )  # fmt: skip
    return y, dg if need_g else None, du if need_u else None


def dropout_keep(shape, seed: int, k: int) -> torch.Tensor | None:
    """The uint8 keep mask of ``shape`` for ``seed`` and threshold ``k`` (see
    ``elementwise_train.c``'s dropout_keep), or None without the library."""
    lib = _load()
    if lib is None:
        return None
    keep = torch.empty(shape, dtype=torch.uint8)
    if keep.numel():
        lib.dropout_keep(keep.numel(), seed, k, keep.data_ptr())
    return keep


def keep_times(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor | None:
    """``x * keep`` for the uint8 mask ``keep`` of x's shape (contiguous bf16/float32 x), one
    pass; None where that does not apply."""
    lib = _load()
    if (
        lib is None
        or x.dtype not in _SUFFIX
        or x.device.type != "cpu"
        or not x.is_contiguous()
        or keep.dtype != torch.uint8
        or keep.shape != x.shape
        or not keep.is_contiguous()
    ):
        return None
    out = torch.empty_like(x)
    getattr(lib, f"keep_times_{_SUFFIX[x.dtype]}")(
        x.data_ptr(), keep.data_ptr(), x.numel(), out.data_ptr()
    )
    return out


def transposed(x: torch.Tensor) -> torch.Tensor | None:
    """``x.t().contiguous()`` for a 2-D bf16 or float16 CPU tensor whose rows are contiguous
    (any row stride: a column slice too), in one C pass (``elementwise_train.c``'s
    transpose_u16: 15-37 GB/s where torch's copy moves 1-2.5); None where that does not apply."""
    if (
        x.dim() != 2
        or x.dtype not in (torch.bfloat16, torch.float16)
        or x.device.type != "cpu"
        or (x.stride(1) != 1 and x.shape[1] > 1)
        or x.stride(0) < x.shape[1]
    ):
        return None
    lib = _load()
    if lib is None:
        return None
    R, C = x.shape
    out = torch.empty(C, R, dtype=x.dtype)
    if out.numel():
        lib.transpose_u16(x.data_ptr(), R, C, x.stride(0), out.data_ptr())
    return out


def into_float(
    src: torch.Tensor, dst: torch.Tensor | None, transposed: bool
) -> torch.Tensor | None:
    """``dst += src.float()`` (``src.t()`` when ``transposed``), or a new float32 tensor of it
    where ``dst`` is None, for a 2-D bf16 CPU ``src`` whose rows are contiguous (a column slice
    too) and a contiguous float32 ``dst`` of the result's shape, in one C pass
    (``elementwise_train.c``'s bf16_into_f32: the same float32 values and sums as the cast and
    the add, bit for bit). None where that does not apply (nothing written)."""
    R, C = src.shape if src.dim() == 2 else (0, 0)
    shape = (C, R) if transposed else (R, C)
    if (
        src.dim() != 2
        or src.dtype != torch.bfloat16
        or src.device.type != "cpu"
        or (src.stride(1) != 1 and C > 1)
        or src.stride(0) < C
    ):
        return None
    if dst is not None and not (
        dst.dtype == torch.float32
        and dst.device.type == "cpu"
        and dst.is_contiguous()
        and tuple(dst.shape) == shape
    ):
        return None
    lib = _load()
    if lib is None:
        return None
    out = torch.empty(shape, dtype=torch.float32) if dst is None else dst
    if out.numel():
        lib.bf16_into_f32(
            src.data_ptr(), R, C, src.stride(0), int(transposed), int(dst is not None),
            out.data_ptr(),
        )  # fmt: skip
    return out


def summed_as_float(parts, masks=None) -> torch.Tensor | None:
    """``parts[0].float()`` then ``.add_(p.float())`` for each later part, for bf16 CPU tensors
    of one shape, contiguous, in one C pass (the same float32 sums in the same order, bit for
    bit); with ``masks`` (a uint8 0/1 tensor of that shape or None for each part) each masked
    part is ``p * mask`` first (as :func:`keep_times` makes it), in the same pass. None where
    that does not apply."""
    first = parts[0]
    masks = [None] * len(parts) if masks is None else list(masks)
    if not (
        first.dtype == torch.bfloat16
        and first.device.type == "cpu"
        and len(masks) == len(parts)
        and all(p.dtype == first.dtype and p.shape == first.shape for p in parts)
        and all(p.device.type == "cpu" and p.is_contiguous() for p in parts)
        and all(
            m is None
            or (m.dtype == torch.uint8 and m.shape == first.shape and m.is_contiguous())
            and m.device.type == "cpu"
            for m in masks
        )
    ):
        return None
    lib = _load()
    if lib is None:
        return None
    out = torch.empty(first.shape, dtype=torch.float32)
    ptrs = (ctypes.c_void_p * len(parts))(*(p.data_ptr() for p in parts))
    mptrs = None
    if any(m is not None for m in masks):
        mptrs = (ctypes.c_void_p * len(parts))(
            *(None if m is None else m.data_ptr() for m in masks)
        )
    lib.sum_bf16_as_f32(ptrs, mptrs, len(parts), out.numel(), out.data_ptr())
    return out
