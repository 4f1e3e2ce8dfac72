"""TRL 1.16 keys that change what a run does: disable_dropout, shuffle_dataset,
num_generations_eval; and the round metrics TRL logs (terminated lengths)."""

import json

import torch

from grpokit.testing import tiny_run_config


def test_disable_dropout_zeroes_every_dropout_lora_included(tiny_model_dir, tmp_path):
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(
        tiny_model_dir, tmp_path / "r", max_steps=1, use_peft=True, lora_dropout=0.1,
        disable_dropout=True,
    )  # fmt: skip
    tr = GRPOTrainer(cfg)
    drops = [m for m in tr.model.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and all(m.p == 0 for m in drops)
    cfg = tiny_run_config(
        tiny_model_dir, tmp_path / "s", max_steps=1, use_peft=True, lora_dropout=0.1
    )
    drops = [m for m in GRPOTrainer(cfg).model.modules() if isinstance(m, torch.nn.Dropout)]
    assert any(m.p == 0.1 for m in drops)


def test_disable_dropout_counts_attention_dropout():
    from grpokit.setup import disable_dropout

    class Attn(torch.nn.Module):
        attention_dropout = 0.1

    m = torch.nn.Sequential(Attn(), torch.nn.Dropout(0.2), torch.nn.Dropout(0.0))
    assert disable_dropout(m) == 2
    assert m[0].attention_dropout == 0.0 and m[1].p == 0.0


def test_shuffle_dataset_false_reads_the_rows_in_order():
    from grpokit.prompts import PromptSampler

    s = PromptSampler(10, 4, seed=3, shuffle=False)
    assert [s.next(), s.next(), s.next()] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    shuffled = PromptSampler(10, 4, seed=3)
    assert shuffled.next() != [0, 1, 2, 3]


def test_sampled_evaluation_reports_pass_at_k_and_leaves_training_rng(tiny_model_dir, tmp_path):
    """num_generations_eval: k completions sampled per held-out prompt from the run's seed
    (two evaluations of the same weights agree), the training RNG stream untouched."""
    from grpokit.evaluation import evaluate_rows
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(
        tiny_model_dir, tmp_path / "r", max_steps=1, num_generations_eval=3,
        max_eval_samples=4, per_device_eval_batch_size=6,
    )  # fmt: skip
    tr = GRPOTrainer(cfg)
    rows = tr.data.eval_rows[:4]
    torch.manual_seed(123)
    a = evaluate_rows(tr.eval_engine, tr.task, rows, tr.rewards.funcs, cfg)
    after = torch.rand(1)
    torch.manual_seed(123)
    b = evaluate_rows(tr.eval_engine, tr.task, rows, tr.rewards.funcs, cfg)
    assert torch.rand(1) == after  # the evaluation drew from its own generator
    assert a["num_samples"] == 3 and "pass@3" in a and "pass@1" in a
    assert [e["completion"] for e in a["examples"]] == [e["completion"] for e in b["examples"]]


def test_round_metrics_have_trls_terminated_lengths(tiny_model_dir, tmp_path):
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(tiny_model_dir, tmp_path / "r", max_steps=2)
    GRPOTrainer(cfg).train()
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    for r in [r for r in rows if "loss" in r]:
        lo, mean, hi = (r[f"completions/{k}_terminated_length"] for k in ("min", "mean", "max"))
        assert 0 <= lo <= mean <= hi <= cfg.max_completion_length
        if r["completions/clipped_ratio"] == 0:  # every completion ended: the same lengths
            assert (lo, hi) == (r["completions/min_length"], r["completions/max_length"])


def test_chat_template_kwargs_reach_every_rendering(tiny_model_dir, tmp_path):
    from grpokit.prompts import render_prompts
    from grpokit.trainer import GRPOTrainer

    template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% if not enable_thinking %}[no think]"
        "{% endif %}{% endif %}"
    )
    msgs = [{"role": "user", "content": "1 + 1?"}]
    for kw, shown in (
        ({"enable_thinking": False}, True),
        ({}, True),
        ({"enable_thinking": True}, False),
    ):
        cfg = tiny_run_config(
            tiny_model_dir, tmp_path / f"r{len(kw)}{shown}", max_steps=1, chat_template=template,
            chat_template_kwargs=kw,
        )  # fmt: skip
        tok = GRPOTrainer(cfg).tokenizer
        assert ("[no think]" in render_prompts(tok, [msgs])[0]) is shown
        # a call naming the variable itself wins
        out = tok.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=True, enable_thinking=True
        )
        assert "[no think]" not in out
