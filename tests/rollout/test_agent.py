"""Multi-turn rollouts (grpokit/rollout/agent.py, stops.py): stop strings in the real decode
loop, one turn's parse/execute/append on given token sequences, and whole rollouts of the
real tiny model (it emits whatever it emits)."""

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpokit.rollout.agent import Agent, Episode
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.hf import HFRolloutEngine
from grpokit.rollout.sampler import sample
from grpokit.rollout.stops import StopStrings, turn_segments
from grpokit.tools import load_tools, named_chat_template

KIT = Path(__file__).parents[1] / "tools" / "_toolkit.py"
HEADER = "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
FOOTER = "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def _tok(tiny_model_dir, tools_template=True):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    if tools_template:
        tok.chat_template = named_chat_template("chatml_tools")
    return tok


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


# ------------------------------------------------------------------ stop strings
def test_stop_strings_on_given_tokens(tiny_model_dir):
    tok = _tok(tiny_model_dir)
    ids = _ids(tok, 'ok <tool_call>{"name": "add"}</tool_call> more')
    stops = StopStrings(tok, ["</tool_call>"]).start()
    tokens = torch.tensor([ids, ids])
    rows = torch.tensor([0, 1])
    ends = []
    for t in range(len(ids)):
        check = torch.tensor([True, False])  # row 1 has ended: never checked
        if stops(tokens, rows, t, check).any():
            ends.append(t)
    # the first position whose decoded prefix holds the whole string
    first = next(t for t in range(len(ids)) if "</tool_call>" in tok.decode(ids[: t + 1]))
    assert ends == [first] and stops.at == {0: first + 1}
    segs = turn_segments(tokens, [tok.eos_token_id], stops)
    assert segs[0] == (ids[: first + 1], "stop") and segs[1] == (ids, "length")


def test_turn_segments_eos():
    tokens = torch.tensor([[5, 6, 2, 2], [5, 2, 7, 2]])
    assert turn_segments(tokens, [2], None) == [([5, 6, 2], "eos"), ([5, 2], "eos")]


def test_sampler_stops_where_the_text_first_holds_the_string(tiny_model_dir):
    """Greedy rows with a stop string are the rows without it, cut at the first token
    whose decoded prefix contains the string (found independently, by decoding)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = _tok(tiny_model_dir, tools_template=False)
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": m}], tokenize=False, add_generation_prompt=True
        )
        for m in ("What is 2 + 3?", "Tell me a story", "Hi")
    ]
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True)
    # greedy with a repetition penalty: deterministic rows that differ from each other
    kw = dict(
        max_new_tokens=24, eos_ids=[], pad_id=tok.pad_token_id, greedy=True, repetition_penalty=3.0
    )
    free = sample(model, enc.input_ids, enc.attention_mask, **kw)
    strings = [tok.decode(free[0, 6:8]), tok.decode(free[2, 10:12])]  # multi-token strings
    stops = StopStrings(tok, strings).start()
    cut = sample(model, enc.input_ids, enc.attention_mask, stop=stops, **kw)
    for r, row in enumerate(free.tolist()):
        hits = [t for t in range(len(row)) if any(s in tok.decode(row[: t + 1]) for s in strings)]
        if not hits:
            assert r not in stops.at and cut[r].tolist() == row
            continue
        end = hits[0] + 1
        assert stops.at[r] == end
        assert cut[r, :end].tolist() == row[:end]
        assert (cut[r, end:] == tok.pad_token_id).all()
    assert set(stops.at) >= {0, 2}


# ------------------------------------------------------------------ one turn, given tokens
def _agent(tok, **kw):
    return Agent(tok, load_tools(["calculator", f"{KIT}:broken"]), **kw)


def test_a_call_turn_appends_the_result(tiny_model_dir):
    tok = _tok(tiny_model_dir)
    agent = _agent(tok)
    seg = _ids(
        tok,
        'Let me see.<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>',
    )
    ep = Episode()
    box = {t.name: t.fn for t in agent.tools}
    assert agent.add_turn(ep, box, seg, "stop", room=400, limit=400)
    injected = _ids(tok, HEADER + "408" + FOOTER)
    assert ep.ids == seg + injected
    assert ep.mask == [1] * len(seg) + [0] * len(injected)
    assert ep.calls == 1 and ep.failures == {}
    call = {
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "12*34"}},
    }
    assert ep.messages == [
        {"role": "assistant", "content": "Let me see.", "tool_calls": [call]},
        {"role": "tool", "name": "calculator", "content": "408"},
    ]
    # the model's answer ends the episode
    last = _ids(tok, "It is 408.") + [tok.eos_token_id]
    assert not agent.add_turn(ep, box, last, "eos", room=400 - len(ep.ids), limit=400)
    assert ep.ended == "eos" and ep.mask[-len(last) :] == [1] * len(last)
    assert ep.messages[-1] == {"role": "assistant", "content": "It is 408."}


def test_failed_calls_become_messages_and_are_counted(tiny_model_dir):
    tok = _tok(tiny_model_dir)
    agent = _agent(tok)
    box = {t.name: t.fn for t in agent.tools}
    cases = [
        (
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1+"</tool_call>',
            "malformed",
        ),
        ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "unknown"),
        ('<tool_call>{"name": "broken", "arguments": {"x": 3}}</tool_call>', "raised"),
    ]
    for text, kind in cases:
        ep = Episode()
        assert agent.add_turn(ep, box, _ids(tok, text), "stop", room=800, limit=800)
        assert ep.failures == {kind: 1} and ep.calls == 1
        tool = ep.messages[-1]
        assert tool["role"] == "tool" and "error" in json.loads(tool["content"])
        assert ep.ids[-len(_ids(tok, FOOTER)) :] == _ids(tok, FOOTER)
        assert "tool_calls" not in ep.messages[0] if kind == "malformed" else True


def test_limits_end_the_episode(tiny_model_dir):
    tok = _tok(tiny_model_dir)
    seg = _ids(
        tok, '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
    )
    box = {"calculator": load_tools(["calculator"])[0].fn}
    # max_tool_calling_iterations: the call beyond it is left unrun, not truncated
    ep = Episode(calls=2)
    assert not _agent(tok, max_iterations=2).add_turn(ep, box, seg, "stop", 400, 400)
    assert (ep.ended, ep.truncated, ep.calls, len(ep.messages)) == ("limit", False, 2, 1)
    # a result that does not fit the budget is dropped: truncated (TRL rolls it back)
    ep = Episode()
    assert not _agent(tok).add_turn(ep, box, seg, "stop", room=len(seg) + 5, limit=len(seg) + 5)
    assert (ep.ended, ep.truncated, ep.ids, ep.calls) == ("overflow", True, seg, 1)
    # a turn longer than its room is cut and never parsed
    ep = Episode()
    assert not _agent(tok).add_turn(ep, box, seg, "stop", room=5, limit=5)
    assert (ep.ended, ep.ids, ep.calls) == ("length", seg[:5], 0)


# ------------------------------------------------------------------ whole rollouts
def test_rollout_of_the_real_model_is_consistent(tiny_model_dir):
    """The tiny model emits whatever it emits; every completion keeps the invariants."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = _tok(tiny_model_dir)
    engine = HFRolloutEngine(model, tok)
    agent = _agent(tok, max_prompt_length=None)
    rows = [{"prompt": [{"role": "user", "content": q}]} for q in ("What is 2+3?", "Hi")]
    ro = agent.rollout(engine, rows, 3, SamplingParams(max_new_tokens=20))
    assert ro.completion_ids.shape[0] == 6 and ro.completion_ids.shape[1] <= 20
    for i, ep in enumerate(ro.episodes):
        n = len(ep.ids)
        assert ro.completion_ids[i, :n].tolist() == ep.ids
        assert ro.completion_mask[i].sum() == n and ro.tool_mask[i, :n].tolist() == ep.mask
        assert bool(ro.truncated[i]) == (ep.ended == "length")
        # without a call, the whole completion is the model's, and its text the message
        if ep.calls == 0:
            assert ep.mask == [1] * n
            assert ep.messages == [
                {"role": "assistant", "content": tok.decode(ep.ids, skip_special_tokens=True)}
            ]
    assert torch.equal(ro.generated_lengths, (ro.completion_mask * ro.tool_mask).sum(-1))
    # the prompt describes the tools
    assert "calculator" in tok.decode(ro.prompt_ids[0])
