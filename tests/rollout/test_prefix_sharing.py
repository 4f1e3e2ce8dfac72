"""Cross-prompt prefix sharing in grpokit's decode loop (grpokit/speed/prefix.py, used by
grpokit/rollout/sampler.py): prompts that start alike have their common prefix prefilled
once and only each row's suffix after it, with the same distribution as prefilling every
prompt whole.

Two models, float32: the tiny offline model as saved (its near-uniform logits, std ~0.1,
barely depend on positions: greedy decoding repeats one token), and the same model with its
weights redrawn at std 0.3 ("sharp": logits std ~1.7, attention peaked, a different token
at each step), on which an off-by-one position moves logits by ~3 and changes the greedy
tokens.

Tolerance: the shared and the plain prefill compute the same sums over the same keys, but
over differently laid out blocks (the masked slots sit between prefix and suffix instead of
before the prefix, and the prefix runs as a batch of one), so they may differ by float
rounding: measured up to 2.6e-6 on the sharp model's logits (a few float32 ulps of values
up to ~8), so logits and cached keys/values are compared at 1e-5. Greedy tokens and seeded
draws must be identical (rounding could only flip a near-exact tie; these prompts have
none, which the equality checks)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpokit.evaluation import evaluate
from grpokit.prompts import tokenize_prompts
from grpokit.rewards import get_reward_funcs
from grpokit.rollout.agent import Agent
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.hf import HFRolloutEngine
from grpokit.rollout.sampler import prefill, sample
from grpokit.speed.prefix import MIN_SHARED_PREFIX, shared_prefix_length
from grpokit.tasks import get_task
from grpokit.tools import load_tools, named_chat_template

SYSTEM = (
    "You are a helpful assistant. First think, then answer. Respond in the following "
    "format: <reasoning> ... </reasoning> <answer> ... </answer>"
)
QUESTIONS = (
    "What is 12 + 34?",
    "How many clips did Natalia sell altogether in April and May?",
    "Hi",
    "Using the numbers 3, 5, 7 create an equation that equals 22.",
)
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module", params=["tiny", "sharp"])
def tiny(tiny_model_dir, request):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    if request.param == "sharp":
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" not in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def _batch(tok, questions=QUESTIONS, system=SYSTEM):
    texts = [
        tok.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": q}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for q in questions
    ]
    return tokenize_prompts(tok, texts, None)


def _real(ids, mask):
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]


def _common(rows):
    """The common prefix of token lists, by a plain loop, capped one short of the shortest."""
    n = 0
    while n < min(map(len, rows)) - 1 and all(r[n] == rows[0][n] for r in rows):
        n += 1
    return n


def _left_pad(rows, pad=0):
    P = max(map(len, rows))
    ids = torch.full((len(rows), P), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r) :], mask[i, P - len(r) :] = torch.tensor(r), 1
    return ids, mask


def _slots(n, L, S, P, shared):
    """Cache slots of a row's n real tokens: after the left padding, or prefix then the
    suffix right-aligned in the S suffix slots."""
    if not shared:
        return list(range(P - n, P))
    return list(range(L)) + list(range(L + S - (n - L), L + S))


def _layers(cache):
    return [(ly.keys, ly.values) for ly in cache.layers]


def _compare_prefill(model, ids, mask, want_shared):
    plain = prefill(model, ids, mask, 8, min_shared_prefix=0)
    shared = prefill(model, ids, mask, 8)
    assert plain.shared == 0 and plain.width == ids.shape[1]
    assert shared.shared == want_shared
    torch.testing.assert_close(shared.logits, plain.logits, **TOL)
    assert torch.equal(shared.next_pos, plain.next_pos)
    lengths = mask.sum(-1).tolist()
    S = shared.width - shared.shared
    for i, n in enumerate(lengths):
        a = _slots(n, shared.shared, S, ids.shape[1], False)
        b = _slots(n, shared.shared, S, ids.shape[1], shared.shared > 0)
        # the mask opens exactly the real tokens' slots
        assert plain.mask[i].nonzero().squeeze(1).tolist() == a
        assert shared.mask[i].nonzero().squeeze(1).tolist() == b
        for (k0, v0), (k1, v1) in zip(_layers(plain.cache), _layers(shared.cache)):
            torch.testing.assert_close(k1[i, :, b], k0[i, :, a], **TOL)
            torch.testing.assert_close(v1[i, :, b], v0[i, :, a], **TOL)
    return plain, shared


def test_the_common_prefix_is_found_on_the_real_tokens(tiny):
    _, tok = tiny
    ids, mask = _batch(tok)
    rows = _real(ids, mask)
    assert len(set(map(len, rows))) == len(rows), "the test needs rows of different lengths"
    assert shared_prefix_length(ids, mask) == _common(rows) >= MIN_SHARED_PREFIX
    # right padding (or holes) is not what the decode loop gets: no sharing
    assert shared_prefix_length(ids.flip(1), mask.flip(1)) == 0
    assert shared_prefix_length(ids[:1], mask[:1]) == 0  # one row: nothing to share


def test_shared_prefill_equals_the_plain_one_with_left_padding(tiny):
    model, tok = tiny
    ids, mask = _batch(tok)
    _compare_prefill(model, ids, mask, _common(_real(ids, mask)))


def test_a_prompt_that_is_exactly_the_prefix(tiny):
    model, tok = tiny
    ids, mask = _batch(tok)
    rows = _real(ids, mask)
    L = _common(rows)
    head = rows[0][: L + 1]  # a whole prompt that every other row starts with
    rows = [head] + [head + r[L + 1 :] + [7] for r in rows[1:]]
    ids, mask = _left_pad(rows, pad=tok.pad_token_id)
    assert _common(rows) == len(head) - 1  # every row keeps a token of its own
    _compare_prefill(model, ids, mask, len(head) - 1)
    kw = dict(max_new_tokens=16, eos_ids=[], pad_id=0, greedy=True)
    assert torch.equal(
        sample(model, ids, mask, **kw), sample(model, ids, mask, **kw, min_shared_prefix=0)
    )


def test_no_or_a_short_common_prefix_falls_back(tiny):
    model, tok = tiny
    ids, mask = _batch(tok)
    rows = _real(ids, mask)
    differ = [[5] + rows[0], [6] + rows[1]]  # first tokens differ
    ids2, mask2 = _left_pad(differ, pad=tok.pad_token_id)
    assert shared_prefix_length(ids2, mask2) == 0
    _compare_prefill(model, ids2, mask2, 0)
    short = [rows[0][:10] + [5] + rows[0][10:], rows[1][:10] + [6] + rows[1][10:]]
    ids3, mask3 = _left_pad(short, pad=tok.pad_token_id)
    assert shared_prefix_length(ids3, mask3) == 10 < MIN_SHARED_PREFIX
    _compare_prefill(model, ids3, mask3, 0)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("G", [1, 3])
def test_greedy_and_seeded_tokens_are_identical(tiny, fused, G):
    model, tok = tiny
    ids, mask = _batch(tok)
    kw = dict(max_new_tokens=24, eos_ids=[], pad_id=0, num_samples=G, fused_decode=fused)
    a = sample(model, ids, mask, greedy=True, min_shared_prefix=0, **kw)
    b = sample(model, ids, mask, greedy=True, **kw)
    assert a.shape == (len(QUESTIONS) * G, 24) and torch.equal(a, b)
    kw.update(temperature=0.9, top_p=0.95, repetition_penalty=1.2)
    a = sample(
        model, ids, mask, generator=torch.Generator().manual_seed(1), min_shared_prefix=0, **kw
    )
    b = sample(model, ids, mask, generator=torch.Generator().manual_seed(1), **kw)
    assert torch.equal(a, b)


class _Prefills:
    """The (rows, tokens) of every multi-token call into the model's embedding: what the
    prefills actually computed."""

    def __init__(self, model):
        self.calls = []
        self.handle = model.model.embed_tokens.register_forward_hook(self._hook)

    def _hook(self, mod, args, out):
        if args[0].dim() == 2 and args[0].shape[1] > 1:
            self.calls.append(tuple(args[0].shape))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def test_evaluation_prefills_the_prefix_once_with_the_same_result(tiny):
    model, tok = tiny
    task = get_task("arithmetic", system_prompt=SYSTEM, digits=2, train_size=4, test_size=6)
    rows = task.build("test")
    rewards = get_reward_funcs(list(task.default_reward_funcs))
    out = {}
    for share in (False, True):
        engine = HFRolloutEngine(model, tok, share_prefix=share)
        with _Prefills(model) as seen:
            out[share] = evaluate(engine, task, rows, rewards, batch_size=6, max_new_tokens=12)
        out[share].pop("seconds", None)
        if share:
            L = seen.calls[0][1]
            assert seen.calls[0] == (1, L) and L >= MIN_SHARED_PREFIX
            assert seen.calls[1][0] == len(rows) and sum(c[0] * c[1] for c in seen.calls) < 6 * L
        else:
            assert seen.calls[0][0] == len(rows)
    assert out[True] == out[False]


def test_agent_turns_share_the_tool_prompt(tiny, tiny_model_dir):
    model, _ = tiny
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = named_chat_template("chatml_tools")
    tools = load_tools(["calculator"])
    agent = Agent(tok, tools, max_iterations=2)
    rows = [{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS]
    got = {}
    for share in (False, True):
        engine = HFRolloutEngine(model, tok, share_prefix=share)
        torch.manual_seed(0)
        with _Prefills(model) as seen:
            ro = agent.rollout(engine, rows, 2, SamplingParams(max_new_tokens=16))
        got[share] = [(e.ids, e.mask, e.ended) for e in ro.episodes]
        assert (seen.calls[0][0] == 1) == share  # the schema prefix ran once, for every row
    assert got[True] == got[False]
    # a later turn: contexts of different lengths that start with the same prompt
    engine = HFRolloutEngine(model, tok)
    ctx = [ro.prompt_ids[i][ro.prompt_mask[i].bool()].tolist() for i in (0, 2, 4)]
    ctx = [c + list(range(7, 7 + 3 * j)) for j, c in enumerate(ctx)]
    params = SamplingParams(max_new_tokens=10, greedy=True)
    with _Prefills(model) as seen:
        on = engine.generate_turn(ctx, params, max_new_tokens=10, stops=agent.stops)
    assert seen.calls[0][0] == 1
    engine = HFRolloutEngine(model, tok, share_prefix=False)
    assert engine.generate_turn(ctx, params, max_new_tokens=10, stops=agent.stops) == on


def test_under_autocast_the_growing_cache_shares_too(tiny):
    """LoRA runs sample under bf16 autocast with transformers' growing cache: its rows are
    indexed the same way; bf16 rounding, so the logits at the fused-decode test's bf16
    tolerance."""
    model, tok = tiny
    ids, mask = _batch(tok)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = prefill(model, ids, mask, 8, min_shared_prefix=0)
        shared = prefill(model, ids, mask, 8)
    assert type(shared.cache).__name__ == "DynamicCache"
    assert shared.shared == _common(_real(ids, mask)) and plain.shared == 0
    torch.testing.assert_close(shared.logits, plain.logits, atol=0.1, rtol=0.05)


def test_prefill_gives_the_head_a_fresh_input_and_the_model_s_logits(tiny):
    """Prefill hands the output layer a freshly laid-out (B, 1, H) input (transformers'
    ``logits_to_keep`` slice is a strided view, which torch multiplied by an expanded
    (B, H, V) copy of the head's weight), on the plain and the shared-prefix route, gets the
    logits the model's own forward gives, and leaves no hook on the model."""
    model, tok = tiny
    ids, mask = _batch(tok)
    head = model.get_output_embeddings()
    inputs = []  # what the head computed with, after the pre-hooks
    for min_shared in (0, MIN_SHARED_PREFIX):
        inputs.clear()
        probe = head.register_forward_hook(lambda m, a, o: inputs.append(a[0]))
        try:
            got = prefill(model, ids, mask, 4, min_shared_prefix=min_shared)
        finally:
            probe.remove()
        assert inputs
        for x in inputs:
            assert x.shape[1] == 1 and x.stride() == (x.shape[2], x.shape[2], 1)
        with torch.no_grad():
            pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos)
        torch.testing.assert_close(got.logits, out.logits[:, -1].float(), **TOL)
    assert not head._forward_pre_hooks and not head._forward_hooks
