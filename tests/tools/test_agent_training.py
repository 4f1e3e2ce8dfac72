"""Multi-turn runs through the real trainer: tool calls and their failures in the metrics,
tool tokens out of the loss, the KL and the normalisers (against an independent
computation), exact resume with multi-segment completions, an environment, the real tiny
model from a recipe dict, and the one-line config errors.

Where a test needs known calls, a Rollout-level script gives each completion's FIRST turn
(a given token sequence); every later turn is the real tiny model's, sampled by grpokit's
decode loop after the real tool result."""

import json
import re
from pathlib import Path

import pytest
import torch

from grpokit.config import ConfigError
from grpokit.testing import tiny_run_config

KIT = Path(__file__).parent / "_toolkit.py"
CALLS = [
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>',
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>',  # malformed
    '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>',  # unknown
    'Hm.<tool_call>\n{"name": "broken", "arguments": {"x": 1}}\n</tool_call>',  # raises
]


class ScriptedFirstTurn:
    """The rollout engine with each completion's first turn given (``scripts[i % len]``)."""

    def __init__(self, engine, tokenizer, texts):
        self.engine, self.tok = engine, tokenizer
        self.scripts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]

    def __getattr__(self, name):  # pad_id, weights_updated, ...
        return getattr(self.engine, name)

    def generate_turn(self, contexts, params, *, max_new_tokens, stops=None, num_generations=1):
        if "</tool_response><|im_end|>" in self.tok.decode(
            contexts[0]
        ):  # a later turn: the model's
            return self.engine.generate_turn(
                contexts, params, max_new_tokens=max_new_tokens, stops=stops,
                num_generations=num_generations,
            )  # fmt: skip
        n = len(contexts) * num_generations
        return [(self.scripts[i % len(self.scripts)], "stop") for i in range(n)]


def _cfg(model, out, **kw):
    values = dict(
        tools=["calculator", f"{KIT}:broken"],
        chat_template="chatml_tools",
        max_prompt_length=None,
        max_completion_length=256,
        max_tool_calling_iterations=1,
        reward_funcs=["arithmetic_correct", f"{KIT}:tool_turns"],
    )
    values.update(kw)
    return tiny_run_config(model, out, **values)


def _trainer(cfg, texts=CALLS, resume=None):
    from grpokit.trainer import GRPOTrainer

    tr = GRPOTrainer(cfg, resume=resume)
    tr.engine = ScriptedFirstTurn(tr.engine, tr.tokenizer, texts)
    return tr


def _metrics(out):
    return [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def test_known_calls_and_their_failures_in_the_metrics(tmp_path, tiny_model_dir):
    tr = _trainer(_cfg(tiny_model_dir, tmp_path / "run", log_completions=True))
    tr.train()
    rows = _metrics(tmp_path / "run")
    assert len(rows) == 2
    for m in rows:  # 4 completions a round, one of each scripted call
        assert m["tools/call_frequency"] == 1.0
        assert m["tools/failure_frequency"] == 0.75
        assert [
            m[f"tools/failures/{k}"] for k in ("malformed", "unknown", "raised", "timeout")
        ] == [1, 1, 1, 0]
        assert m["rewards/tool_turns/mean"] == 1.0  # the reward saw each tool message
        assert m["completions/mean_length"] < m["completions/max_length"] + 1


def _header_end(ids: list[int], start: int, header: list[int]) -> int:
    for j in range(start, len(ids) - len(header) + 1):
        if ids[j : j + len(header)] == header:
            return j + len(header)
    raise AssertionError("no assistant header after the call")


def _independent_mask(ro, tok, G_scripts):
    """1 on the scripted call and on what the model wrote after the injected tool turn; 0
    from the end of the call through the next '<|im_start|>assistant\\n'."""
    header = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    mask = torch.zeros_like(ro.completion_mask)
    for i in range(mask.shape[0]):
        n = int(ro.completion_mask[i].sum())
        ids = ro.completion_ids[i, :n].tolist()
        k = len(G_scripts[i % len(G_scripts)])
        assert ids[:k] == G_scripts[i % len(G_scripts)]
        end = _header_end(ids, k, header)
        mask[i, :k] = 1
        mask[i, end:n] = 1
    return mask


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_tool_tokens_are_out_of_the_loss_the_kl_and_the_normalisers(
    tmp_path, tiny_model_dir, loss_type
):
    cfg = _cfg(tiny_model_dir, tmp_path / "run", loss_type=loss_type, beta=0.1, learning_rate=0.05)
    tr = _trainer(cfg)
    tr.optimizer_step(tr.collect_round()[0])  # one update: the policy leaves the reference
    b = tr.collect_round()[0]
    ro, tok = b.rollout, tr.tokenizer
    scripts = tr.engine.scripts
    expected = _independent_mask(ro, tok, scripts)
    assert torch.equal(ro.tool_mask * ro.completion_mask, expected)
    assert torch.equal(b.loss_mask, expected)
    tr.model.zero_grad(set_to_none=True)
    res = tr.opt.gradients.run(b, tr.opt.plan(ro), 2)
    mine = {n: p.grad.detach().clone() for n, p in tr.model.named_parameters()}

    # independent: one plain forward per row, k3 KL, the loss type's normaliser over `expected`
    tr.model.zero_grad(set_to_none=True)
    total, m = 0.0, expected.float()
    denom_all = m.sum()
    N = m.shape[0]
    for i in range(N):
        p = ro.prompt_ids[i][ro.prompt_mask[i].bool()]
        n = int(ro.completion_mask[i].sum())
        c = ro.completion_ids[i, :n]
        ids = torch.cat([p, c])[None]
        lp = torch.log_softmax(tr.model(ids).logits[0, len(p) - 1 : -1].float(), -1)
        lp = lp.gather(-1, c[:, None])[:, 0]
        with torch.no_grad():
            ref = torch.log_softmax(tr.ref_model(ids).logits[0, len(p) - 1 : -1].float(), -1)
            ref = ref.gather(-1, c[:, None])[:, 0]
        ratio = torch.exp(lp - lp.detach())
        d = ref - lp
        per_tok = -ratio * b.advantages[i] + 0.1 * (torch.exp(d) - d - 1)
        s = (per_tok * m[i, :n]).sum()
        total = total + (s / m[i, :n].sum() / N if loss_type == "grpo" else s / denom_all)
    total.backward()
    assert abs(total.item() - res.loss_sum) < 1e-5 * max(1.0, abs(total.item()))
    # Scale-aware atol: the batched path sums a token's embedding gradient over its positions
    # in another order than these per-row forwards, and for a token at many positions the
    # terms cancel (measured: up to 9.3e-4 of the tensor's largest entry, on one embedding
    # row, with torch's RMSNorm and with the C one alike: the same batch, the same error).
    for name, p in tr.model.named_parameters():
        g = p.grad.to_dense() if p.grad.is_sparse else p.grad
        atol = max(1e-6, 2e-3 * g.abs().max().item())
        torch.testing.assert_close(mine[name].to_dense(), g, rtol=2e-4, atol=atol, msg=name)


def test_stop_and_resume_with_multi_turn_completions_is_identical(tmp_path, tiny_model_dir):
    kw = dict(max_steps=4, save_steps=2, beta=0.04, num_iterations=2, per_device_train_batch_size=4)
    ta = _trainer(_cfg(tiny_model_dir, tmp_path / "a", **kw))
    ta.train()
    cfg = _cfg(tiny_model_dir, tmp_path / "b", **kw)
    tb = _trainer(cfg)
    real = tb.optimizer_step

    def step_then_stop(batch):
        out = real(batch)
        if tb.step == 2:
            tb.request_stop()
        return out

    tb.optimizer_step = step_then_stop
    assert tb.train()["stopped"]
    tc = _trainer(cfg, resume=True)
    assert tc.step == 2
    tc.train()
    a, b = _metrics(tmp_path / "a"), _metrics(tmp_path / "b")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    keys = ("loss", "reward", "kl", "grad_norm", "completions/mean_length", "tools/call_frequency")
    for ra, rb in zip(a, b):
        for k in keys:
            assert ra[k] == rb[k], (ra["step"], k)
    assert max(r["completions/max_length"] for r in a) > len(ta.engine.scripts[0])  # multi-turn
    for (n, pa), (_, pc) in zip(ta.model.named_parameters(), tc.model.named_parameters()):
        assert torch.equal(pa, pc), n


def test_dynamic_sampling_keeps_masks_and_episodes_together(tmp_path, tiny_model_dir):
    """Groups selected and concatenated across generation batches keep each completion's
    tool_mask and conversation with its tokens."""
    cfg = _cfg(tiny_model_dir, tmp_path / "run", dynamic_sampling=True, max_num_gen_batches=3)
    tr = _trainer(cfg)
    b, m, _ = tr.collect_round()
    ro = b.rollout
    assert len(ro.episodes) == ro.completion_ids.shape[0] == 4
    for i, ep in enumerate(ro.episodes):
        n = len(ep.ids)
        assert ro.completion_ids[i, :n].tolist() == ep.ids
        assert ro.tool_mask[i, :n].tolist() == ep.mask and ro.completion_mask[i].sum() == n
    assert torch.equal(b.loss_mask, ro.completion_mask * ro.tool_mask)
    assert m["dynamic_sampling/num_gen_batches"] >= 1


def _secret(question: str) -> int:
    a, op, b = re.match(r"What is (\d+) ([-+*]) (\d+)\?", question).groups()
    return {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]


def test_environment_guessing_game(tmp_path, tiny_model_dir):
    guess = '<tool_call>\n{"name": "guess", "arguments": {"number": 5}}\n</tool_call>'
    cfg = _cfg(
        tiny_model_dir, tmp_path / "run", tools=None, environment_factory=f"{KIT}:GuessingGame",
        reward_funcs=[f"{KIT}:guesses_made"], log_completions=True, max_steps=1,
    )  # fmt: skip
    tr = _trainer(cfg, texts=[guess])
    assert tr.rewards.names == ["guesses_made", "GuessingGame"]
    assert tr.rewards.weights.tolist() == [1.0, 1.0]
    b, m, table = tr.collect_round()
    ro = b.rollout
    for i, row in enumerate(table):
        secret = _secret(row["prompt"])
        ep = ro.episodes[i]
        assert ep.environment.secret == secret and ep.environment.guesses == [5]
        answer = "correct" if secret == 5 else ("higher" if secret > 5 else "lower")
        assert ep.messages[1] == {"role": "tool", "name": "guess", "content": answer}
        assert row["rewards"] == {"guesses_made": 1.0, "GuessingGame": float(secret == 5)}
        # reset's observation is appended to the prompt
        assert (
            tr.tokenizer.decode(ro.prompt_ids[i])
            .rstrip()
            .endswith("(guess it with the guess tool)<|im_end|>\n<|im_start|>assistant")
        )
    assert m["tools/call_frequency"] == 1.0 and m["tools/failure_frequency"] == 0.0


def test_the_real_tiny_model_from_a_recipe_dict(tmp_path, tiny_model_dir):
    """Nothing scripted: the model emits what it emits; the run trains and evaluates."""
    from grpokit.trainer import GRPOTrainer

    cfg = _cfg(
        tiny_model_dir, tmp_path / "run", max_eval_samples=4, max_tool_calling_iterations=None
    )
    res = GRPOTrainer(cfg).train()
    rows = _metrics(tmp_path / "run")
    assert len(rows) == 2 and all("tools/call_frequency" in r for r in rows)
    assert all(r["loss"] == r["loss"] for r in rows)  # finite
    assert "tool_call_rate" in res["before"] and "tool_call_rate" in res["after"]


@pytest.mark.parametrize(
    "overrides, text",
    [
        (dict(chat_template=None), "chat_template: chatml_tools"),
        (dict(tools=["no_such_module_xyz:f"]), "cannot be imported"),
        (dict(tools=[f"{KIT}:no_docstring"]), "Google-style docstring"),
        (dict(environment_factory=f"{KIT}:NoReset"), "reset(**row)"),
    ],
)
def test_config_errors_are_one_line(tmp_path, tiny_model_dir, overrides, text):
    from grpokit.trainer import GRPOTrainer

    with pytest.raises(ConfigError) as e:
        GRPOTrainer(_cfg(tiny_model_dir, tmp_path / "run", **overrides))
    assert text in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "overrides, text",
    [
        (dict(use_vllm=True, vllm_mode="server"), "the rollout server does not run multi-turn"),
        (dict(generation_loop="hf"), "generation_loop: grpokit"),
        (dict(max_tool_calling_iterations=-1), "max_tool_calling_iterations"),
        (dict(tool_timeout=0), "tool_timeout"),
    ],
)
def test_config_refusals(tmp_path, tiny_model_dir, overrides, text):
    with pytest.raises(ConfigError, match=re.escape(text)):
        _cfg(tiny_model_dir, tmp_path / "run", **overrides)
