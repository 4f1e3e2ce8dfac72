"""grpokit's own decode loop for HF causal LMs: the same distribution as ``generate``,
with less work per token on CPU.

Measured on this machine (SmolLM2-135M, 32 rows, 64 new tokens), where ``generate`` spends
its time per decode step:

- ``DynamicCache`` concatenates every layer's keys and values at every step (42% of an fp32
  step); here a cache is allocated once for prompt + max_new_tokens (transformers'
  ``StaticCache``) and written in place;
- ``torch.multinomial`` draws one exponential per vocabulary entry (30 ms a step for
  32 x 49,152 on 2 cores); here a token is drawn by inverse transform sampling, one uniform
  per row against the row's cumulative probabilities (an exact draw from the same
  categorical distribution);
- the prompt's logits are computed for its last position only;
- a common prefix of the batch's prompts (system prompt, worked problems, tool schema) is
  computed once and its keys and values copied to every row (``speed/prefix.py``).

Sampling follows ``generate``'s order: repetition penalty, temperature, top-k, top-p (the
smallest set of most probable tokens whose mass reaches ``top_p``, at least one kept), min-p
(tokens less probable than ``min_p`` times the most probable one dropped). Rows
that ended get ``pad_id`` and leave the batch; the loop stops when every row has ended.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from grpokit.rollout.kvcache import cache_kwarg
from grpokit.speed.fastdecode import FastDecoder
from grpokit.speed.kernels import sample_tokens
from grpokit.speed.prefix import (
    MIN_SHARED_PREFIX,
    PrefixSplit,
    shared_prefix_length,
    split_prefix,
    window_allows,
)


def filter_top_k_top_p(scores: torch.Tensor, top_k: int | None, top_p: float) -> torch.Tensor:
    """``scores`` (N, V) with every token outside the top-k (0 or None: off) and outside the
    top-p nucleus set to -inf, as ``generate``'s TopK and TopP warpers do."""
    if top_k and 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False, dim=-1)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        remove_sorted = cum <= (1 - top_p)
        remove_sorted[..., -1] = False  # always keep the most probable token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def filter_min_p(scores: torch.Tensor, min_p: float | None) -> torch.Tensor:
    """``scores`` (N, V) with every token whose probability is below ``min_p`` times the row's
    largest probability set to -inf (transformers' MinPLogitsWarper; None or 0: off). The
    ratio p_i / p_max is exp(s_i - s_max), so the test needs no softmax; the most probable
    token always stays."""
    if not min_p:
        return scores
    top = scores.amax(-1, keepdim=True)
    return scores.masked_fill(scores - top < math.log(min_p), float("-inf"))


def apply_repetition_penalty(
    scores: torch.Tensor, seen: torch.Tensor, penalty: float
) -> torch.Tensor:
    """CTRL-style penalty as ``generate`` applies it: for every id already in the sequence
    (prompt included), a positive logit is divided by ``penalty``, a negative one multiplied."""
    picked = scores.gather(-1, seen)
    picked = torch.where(picked < 0, picked * penalty, picked / penalty)
    return scores.scatter(-1, seen, picked)


def uniforms(n: int, like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """The (n, 1) uniforms of one draw a row, in ``like``'s dtype and device."""
    return torch.rand(n, 1, generator=generator, device=like.device, dtype=like.dtype)


def draw(
    probs: torch.Tensor, generator: torch.Generator | None = None, u: torch.Tensor | None = None
) -> torch.Tensor:
    """One index per row of ``probs`` (N, V), distributed as the row (inverse transform with
    the rows' uniforms ``u`` (N, 1), drawn from ``generator`` when not given)."""
    cdf = probs.cumsum(-1)
    u = uniforms(probs.shape[0], cdf, generator) if u is None else u
    u = u * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def _select_rows(cache, idx: torch.Tensor) -> bool:
    """Keep rows ``idx`` (in that order, repeats allowed) of every layer's keys and values.
    False when the cache does not expose its per-layer tensors (then nothing changed)."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(
        isinstance(getattr(ly, "keys", None), torch.Tensor)
        and isinstance(getattr(ly, "values", None), torch.Tensor)
        for ly in layers
    ):
        return False
    for ly in layers:
        ly.keys = ly.keys.index_select(0, idx)
        ly.values = ly.values.index_select(0, idx)
        if hasattr(ly, "batch_size"):
            ly.batch_size = int(idx.numel())
    return True


def _cache_tensors(cache) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    layers = getattr(cache, "layers", None)
    if not layers or any(getattr(ly, "keys", None) is None for ly in layers):
        return None
    return [ly.keys for ly in layers], [ly.values for ly in layers]


@dataclass(frozen=True)
class _Choice:
    """How the next token of every row is chosen (``sample``'s arguments)."""

    eos: torch.Tensor  # (E,) the ids that end a row
    pad_id: int
    greedy: bool
    temperature: float
    top_p: float
    top_k: int | None
    min_p: float | None
    repetition_penalty: float
    min_new_tokens: int
    generator: torch.Generator | None
    stop: object = None  # callable(tokens, rows, t, check) -> (n,) bool: stop strings (stops.py)


@dataclass
class _Running:
    """The rows still decoding: for each, its row in the output, whether it has ended, its
    attention mask over prompt + completion, its next position and, with a repetition
    penalty, the ids it has seen. Rows leave together with their cache rows (``keep``)."""

    rows: torch.Tensor  # (n,) index in the output
    done: torch.Tensor  # (n,) bool
    mask: torch.Tensor  # (n, P + max_new_tokens)
    next_pos: torch.Tensor  # (n, 1)
    seen: torch.Tensor | None  # (n, P + t) prompt and completion ids, or None
    # (n,) the prompt of each row when the rows of a prompt share its cached keys and values
    # (copies of one prefill), else None; chunks: the decoder's row_chunks of it, made once
    group: torch.Tensor | None = None
    chunks: object = None

    @classmethod
    def start(cls, mask, next_pos, seen, group: torch.Tensor | None = None):
        """Every row running, none ended."""
        n, device = mask.shape[0], mask.device
        done = torch.zeros(n, dtype=torch.bool, device=device)
        return cls(torch.arange(n, device=device), done, mask, next_pos, seen, group)

    def keep(self, idx: torch.Tensor) -> None:
        self.rows, self.done = self.rows[idx], self.done[idx]
        self.mask, self.next_pos = self.mask[idx], self.next_pos[idx]
        self.seen = None if self.seen is None else self.seen[idx]
        self.group = None if self.group is None else self.group[idx]
        self.chunks = None


@torch.no_grad()
def sample(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    greedy: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int | None = None,
    min_p: float | None = None,
    repetition_penalty: float = 1.0,
    min_new_tokens: int = 0,
    num_samples: int = 1,
    generator: torch.Generator | None = None,
    fused_decode: bool = True,
    stop=None,
    min_shared_prefix: int = MIN_SHARED_PREFIX,
) -> torch.Tensor:
    """(B, P) left-padded prompts -> (B * num_samples, C) completion ids, C <= max_new_tokens,
    the ``num_samples`` completions of a prompt contiguous, rows that ended padded with
    ``pad_id`` after their EOS.

    Each prompt is run through the model once; its keys and values are then copied to its
    ``num_samples`` rows. Rows that have ended are dropped from the batch (their cache rows
    with them) once they are at least an eighth of it, so the decode steps after the short
    completions end cost what the remaining rows cost.

    ``fused_decode``: decode steps run through ``fastdecode.FastDecoder`` (fused products
    from the model's own weights, same arithmetic) when it reproduces the model (Llama,
    Mistral, Qwen2 without autocast); otherwise, or when False, through the model's forward.

    ``stop``: ends rows besides EOS (``rollout.stops.StopStrings``): called after each step
    with the tokens so far, the running rows' output indices, the step and which rows to check.

    ``min_shared_prefix``: when every prompt starts with at least this many common tokens
    (and there are two prompts or more), that prefix runs through the model once and only
    each prompt's suffix is prefilled after it (``speed/prefix.py``; 0: never).
    """
    B = input_ids.shape[0]
    G = max(1, int(num_samples))
    device = input_ids.device
    pre = prefill(model, input_ids, attention_mask, max_new_tokens, min_shared_prefix)
    cache, logits, mask, next_pos = pre.cache, pre.logits, pre.mask, pre.next_pos
    seen = input_ids if repetition_penalty != 1.0 else None
    rep = None  # with G > 1: each row's prompt, its cached keys and values copied to it
    if G > 1:
        rep = torch.arange(B, device=device).repeat_interleave(G)
        if not _select_rows(cache, rep):  # a cache we cannot index: repeat the prompts instead
            return sample(
                model, input_ids.repeat_interleave(G, 0), attention_mask.repeat_interleave(G, 0),
                max_new_tokens=max_new_tokens, eos_ids=eos_ids, pad_id=pad_id, greedy=greedy,
                temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                repetition_penalty=repetition_penalty, min_new_tokens=min_new_tokens,
                generator=generator, fused_decode=fused_decode, stop=stop,
                min_shared_prefix=min_shared_prefix,
            )  # fmt: skip
        logits, mask, next_pos = logits[rep], mask[rep], next_pos[rep]
        seen = None if seen is None else seen[rep]
    choice = _Choice(
        eos=torch.tensor(eos_ids, device=device, dtype=torch.long), pad_id=pad_id,
        greedy=greedy, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        repetition_penalty=repetition_penalty, generator=generator,
        min_new_tokens=min_new_tokens if eos_ids else 0,  # no EOS to hold back otherwise
        stop=stop,
    )  # fmt: skip
    total = pre.width + max_new_tokens
    fast = _fast_decoder(model, cache, total) if fused_decode else None
    run = _Running.start(mask, next_pos, seen, rep)
    return _decode(model, cache, fast, logits, run, choice, pre.width, max_new_tokens)


def _new_cache(model, device: torch.device, total: int):
    """A key/value cache for ``total`` positions: preallocated (``StaticCache``), except under
    autocast (LoRA runs in bf16), where keys and values do not keep one dtype from the prompt
    pass to the decode steps, which a preallocated cache cannot hold."""
    from transformers import DynamicCache, StaticCache

    if torch.is_autocast_enabled(device.type):
        return DynamicCache(config=model.config)
    return StaticCache(config=model.config, max_cache_len=total)


@dataclass
class Prefilled:
    """The prompts run into a key/value cache: each prompt's next-token ``logits`` (B, V),
    its attention ``mask`` over every cache slot (B, width + max_new_tokens), its next
    position (B, 1), the slots the prompts take (``width``: the first completion token's
    slot) and how many leading tokens were computed once for every row (``shared``)."""

    cache: object
    logits: torch.Tensor
    mask: torch.Tensor
    next_pos: torch.Tensor
    width: int
    shared: int = 0


@torch.no_grad()
def prefill(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    min_shared_prefix: int = MIN_SHARED_PREFIX,
) -> Prefilled:
    """Run the left-padded prompts (B, P) into a new cache with room for ``max_new_tokens``
    more. A common prefix of at least ``min_shared_prefix`` tokens (0: never) is computed
    once and its keys and values copied to every row (``speed/prefix.py``), unless a sliding
    window or a cache whose rows cannot be indexed rules it out."""
    B, P = input_ids.shape
    with _contiguous_head_input(model):
        if min_shared_prefix > 0:
            L = shared_prefix_length(input_ids, attention_mask)
            if L >= min_shared_prefix:
                split = split_prefix(input_ids, attention_mask, L)
                if window_allows(model.config, split.width + max_new_tokens):
                    done = _prefill_shared(model, split, split.width + max_new_tokens)
                    if done is not None:
                        return done
        total = P + max_new_tokens
        cache = _new_cache(model, input_ids.device, total)
        logits, mask, next_pos = _prefill(model, input_ids, attention_mask, cache, total)
    return Prefilled(cache, logits, mask, next_pos, P)


@contextlib.contextmanager
def _contiguous_head_input(model):
    """Inside the block the output layer gets its input contiguous. With ``logits_to_keep=1``
    transformers hands it ``hidden[:, -1:, :]``, a strided (B, 1, H) view, and torch's
    matmul multiplies that by a (B, H, V) expanded copy of the head's weight (measured: a
    (4, 576, 49,152) and a (1, 576, 49,152) bf16 copy and a bmm, ~0.09 s of config (a)'s
    generation a step); a contiguous input is one (B, H) x (H, V) product."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Module):
        yield
        return

    def fresh(mod, args):  # a new tensor: .contiguous() keeps a size-1 dim's odd stride
        if not args or not isinstance(args[0], torch.Tensor):
            return None
        return (torch.empty_like(args[0], memory_format=torch.contiguous_format).copy_(args[0]),
                *args[1:])  # fmt: skip

    handle = head.register_forward_pre_hook(fresh)
    try:
        yield
    finally:
        handle.remove()


def _prefill_shared(model, split: PrefixSplit, total: int) -> Prefilled | None:
    """The prefix once (batch of one), its keys and values copied to every row, then the
    suffixes (B, S) after it; None when the cache's rows cannot be indexed."""
    B, S = split.suffix_ids.shape
    L, device = split.length, split.suffix_ids.device
    cache = _new_cache(model, device, total)
    mask = torch.zeros(B, total, dtype=split.suffix_mask.dtype, device=device)
    mask[:, :L] = 1
    mask[:, L : L + S] = split.suffix_mask
    model(
        input_ids=split.prefix_ids,
        attention_mask=mask[:1, :L],
        position_ids=torch.arange(L, device=device)[None],
        **cache_kwarg(cache),
        cache_position=torch.arange(L, device=device),
        use_cache=True,
        logits_to_keep=1,
    )
    if not _select_rows(cache, torch.zeros(B, dtype=torch.long, device=device)):
        return None
    out = model(
        input_ids=split.suffix_ids,
        attention_mask=mask[:, : L + S],
        position_ids=split.suffix_pos,
        **cache_kwarg(cache),
        cache_position=torch.arange(L, L + S, device=device),
        use_cache=True,
        logits_to_keep=1,
    )
    next_pos = split.lengths[:, None].to(device)
    return Prefilled(cache, out.logits[:, -1, :].float(), mask, next_pos, L + S, L)


def _prefill(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache, total: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the prompts (B, P) once into ``cache``: each prompt's next-token logits (B, V),
    its attention mask over ``total`` positions (B, total) and its next position (B, 1)."""
    B, P = input_ids.shape
    device = input_ids.device
    mask = torch.zeros(B, total, dtype=attention_mask.dtype, device=device)
    mask[:, :P] = attention_mask
    # positions as generate numbers them with left padding: count of real tokens before
    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids,
        attention_mask=mask[:, :P],
        position_ids=pos,
        **cache_kwarg(cache),
        cache_position=torch.arange(P, device=device),
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1, :].float(), mask, pos[:, -1:] + 1


def _fast_decoder(model, cache, total: int) -> FastDecoder | None:
    """The fused decode step for ``model``, when the cache is preallocated and the model is
    one it reproduces; None otherwise."""
    from transformers import StaticCache

    if not isinstance(cache, StaticCache) or _cache_tensors(cache) is None:
        return None
    fast = FastDecoder.build(model, total)
    if fast is not None:
        fast.rotary_tables(total, next(model.parameters()).dtype)
    return fast


def _decode(
    model, cache, fast, logits, run: _Running, choice: _Choice, P: int, max_new_tokens: int
) -> torch.Tensor:
    """The decode loop from the prompts' next-token ``logits`` (N, V): (N, C) completion ids."""
    N, device = logits.shape[0], logits.device
    tokens = torch.full((N, max_new_tokens), choice.pad_id, dtype=torch.long, device=device)
    steps = 0
    for t in range(max_new_tokens):
        nxt = _choose(logits, run, choice, t)
        tokens[run.rows, t] = nxt
        steps = t + 1
        running = ~run.done
        run.done |= torch.isin(nxt, choice.eos)
        if choice.stop is not None:
            run.done |= choice.stop(tokens, run.rows, t, running & ~run.done)
        n_done = int(run.done.sum())
        if n_done == run.done.numel() or t == max_new_tokens - 1:
            break
        if n_done and n_done >= run.done.numel() // 8:
            keep = torch.nonzero(~run.done).squeeze(1)
            if _select_rows(cache, keep):
                nxt = nxt[keep]
                run.keep(keep)
        if run.seen is not None:
            run.seen = torch.cat([run.seen, nxt[:, None]], dim=1)
        run.mask[:, P + t] = 1
        logits = _step(model, cache, fast, nxt, run, P, t)
        run.next_pos = run.next_pos + 1
    return tokens[:, :steps]


def _choose(logits: torch.Tensor, run: _Running, choice: _Choice, t: int) -> torch.Tensor:
    """The (n,) next tokens of the running rows from their (n, V) logits, in ``generate``'s
    order (repetition penalty, no EOS before min_new_tokens, temperature, top-k, top-p, min-p);
    ``pad_id`` for rows that have ended."""
    if run.seen is not None:  # (in float32, as generate: the fused step may hand bf16)
        logits = apply_repetition_penalty(logits.float(), run.seen, choice.repetition_penalty)
    if t < choice.min_new_tokens:
        logits[:, choice.eos] = float("-inf")
    nxt = logits.argmax(-1) if choice.greedy else _draw_tokens(logits, choice)
    return torch.where(run.done, torch.full_like(nxt, choice.pad_id), nxt)


def _draw_tokens(logits: torch.Tensor, choice: _Choice) -> torch.Tensor:
    """One token a row from softmax(logits / temperature) after top-k, top-p and min-p. With
    no top-k/top-p filter and float32 logits the C kernel does it all in one call (the torch
    ops below were ~6 ms a step at 32 x 49,152, single-threaded cumsum included); it takes
    its uniforms from the generator as :func:`draw` does, so both choose the same tokens up
    to float rounding at a token's boundary; when a row is not drawable there (NaN, all
    -inf) the whole step falls back to the torch ops with the same uniforms. bf16 logits
    (the fused decode step's) are drawn from as their float32 values, by the kernel
    without a float32 copy."""
    u = None
    top_k = choice.top_k if choice.top_k and choice.top_k < logits.shape[-1] else None
    if top_k is None and choice.top_p >= 1.0 and logits.dtype in (torch.float32, torch.bfloat16):
        u = uniforms(logits.shape[0], logits.new_empty(0, dtype=torch.float32), choice.generator)
        nxt = sample_tokens(logits, choice.temperature, choice.min_p, u)
        if nxt is not None:
            return nxt
    logits = logits.float()
    scores = logits / choice.temperature if choice.temperature != 1.0 else logits
    scores = filter_top_k_top_p(scores, choice.top_k, choice.top_p)
    scores = filter_min_p(scores, choice.min_p)
    return draw(scores.softmax(-1), choice.generator, u)


def _step(model, cache, fast, nxt: torch.Tensor, run: _Running, P: int, t: int) -> torch.Tensor:
    """One decode step: feed ``nxt`` (n,) at cache position ``P + t`` (P: the prompts' slots);
    the (n, V) next logits."""
    at = P + t
    if fast is not None:
        keys, values = _cache_tensors(cache)
        attend = run.mask[:, : at + 1].bool()
        if run.chunks is None:  # the rows of a prompt read its P cached slots once
            run.chunks = fast.row_chunks(run.group, nxt.shape[0], P)
        return fast.step(nxt, run.next_pos[:, 0], keys, values, at, attend, run.chunks)
    out = model(
        input_ids=nxt[:, None],
        attention_mask=run.mask[:, : at + 1],
        position_ids=run.next_pos,
        **cache_kwarg(cache),
        cache_position=torch.tensor([at], device=nxt.device),
        use_cache=True,
    )
    return out.logits[:, -1, :].float()
