"""A few real GRPO steps on a tiny random model, through the Python API and the CLI."""

import json
import math
from pathlib import Path

import pytest
import torch

from grpokit.config import build_config

BASE = dict(
    task="arithmetic",
    task_params={"digits": 1, "train_size": 64, "test_size": 8},
    num_generations=4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    max_completion_length=12,
    max_prompt_length=128,
    learning_rate=1e-3,
    max_steps=3,
    save_steps=0,
    max_eval_samples=8,
    per_device_eval_batch_size=8,
    logging_steps=1,
    seed=0,
)


def _cfg(tmp_path, model_dir, **kw):
    return build_config(
        {**BASE, "model_name_or_path": model_dir, "output_dir": str(tmp_path / "run"), **kw}
    )


def _metrics(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def test_train_logs_moves_params_and_reloads(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from grpokit.trainer import GRPOTrainer

    cfg = _cfg(tmp_path, tiny_model_dir, beta=0.04, log_completions=True)
    tr = GRPOTrainer(cfg)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    res = tr.train()
    assert res["step"] == 3 and not res["stopped"]
    rows = [r for r in _metrics(cfg.output_dir) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for k in (
            "loss",
            "reward",
            "reward_std",
            "frac_reward_zero_std",
            "kl",
            "clip_ratio/low_mean",
            "clip_ratio/high_mean",
            "clip_ratio/region_mean",
            "entropy",
            "completions/mean_length",
            "completions/min_length",
            "completions/max_length",
            "completions/clipped_ratio",
            "grad_norm",
            "learning_rate",
            "time/generation",
            "time/scoring",
            "time/training",
        ):
            assert k in r and r[k] is not None and math.isfinite(r[k]), k
        assert 1 <= r["completions/min_length"] <= r["completions/max_length"] <= 12
        assert 0.0 <= r["frac_reward_zero_std"] <= 1.0
        assert r["kl"] >= 0.0
        assert any(k.startswith("rewards/") and k.endswith("/mean") for k in r)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before any update
    assert rows[0]["learning_rate"] > 0
    moved = sum((p.detach() - before[n]).abs().sum().item() for n, p in tr.model.named_parameters())
    assert moved > 0
    comp = (Path(cfg.output_dir) / "completions.jsonl").read_text().splitlines()
    assert len(comp) == 3 * 8 and "advantage" in json.loads(comp[0])
    # final model reloads with the same logits
    final = AutoModelForCausalLM.from_pretrained(res["final_model"]).eval()
    ids = torch.tensor([[1, 5, 9, 13, 20]])
    tr.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(final(ids).logits, tr.model(ids).logits, atol=1e-5, rtol=1e-5)
    assert (Path(cfg.output_dir) / "eval_before.json").exists()
    assert (Path(cfg.output_dir) / "eval_after.json").exists()


def test_recomputed_logps_match_sampling_distribution(tmp_path, tiny_model_dir):
    """The training forward (left padding, position ids, temperature) reproduces the
    log-probs of the distribution generate() sampled from."""
    from grpokit.prompts import render_prompts, tokenize_prompts
    from grpokit.trainer import GRPOTrainer

    cfg = _cfg(tmp_path, tiny_model_dir, temperature=0.7, max_eval_samples=0)
    tr = GRPOTrainer(cfg)
    rows = tr.train_rows[:3]
    ids, mask = tokenize_prompts(
        tr.tokenizer, render_prompts(tr.tokenizer, [r["prompt"] for r in rows]), 128
    )
    mask[0, : mask.shape[1] - 3] = 0  # make row 0 heavily left-padded
    ids[0, : mask.shape[1] - 3] = tr.tokenizer.pad_token_id
    torch.manual_seed(0)
    tr.model.eval()
    with torch.no_grad():
        out = tr.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=6,
            min_new_tokens=6,
            do_sample=True,
            temperature=0.7,
            top_k=0,
            top_p=1.0,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tr.tokenizer.pad_token_id,
        )
    comp = out.sequences[:, ids.shape[1] :]
    # raw logits / temperature: the distribution sampled from (min_new_tokens only masks EOS)
    scores = torch.stack(out.logits, 1) / 0.7  # (B, C, V)
    ref = torch.log_softmax(scores.float(), -1).gather(-1, comp.unsqueeze(-1)).squeeze(-1)
    from grpokit.rollout.base import Rollout

    ro = Rollout(ids, mask, comp, torch.ones_like(comp), torch.zeros(3, dtype=torch.bool), [""] * 3)
    with torch.no_grad():
        logp, _ = tr.logprobs(tr.model, ro, slice(0, 3))
    torch.testing.assert_close(logp, ref, atol=1e-4, rtol=1e-4)


def test_cli_train_and_resume(tmp_path, tiny_model_dir):
    import yaml

    from grpokit.cli import main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump({**BASE, "model_name_or_path": tiny_model_dir, "max_eval_samples": 0})
    )
    out = tmp_path / "cli"
    assert (
        main(
            [
                "train",
                str(recipe),
                "--output_dir",
                str(out),
                "--max_steps",
                "2",
                "--save_steps",
                "1",
            ]
        )
        == 0
    )
    assert (out / "checkpoint-2" / "trainer_state.json").exists()
    assert (out / "final" / "config.json").exists()
    # an existing run is never silently overwritten
    assert main(["train", str(recipe), "--output_dir", str(out)]) == 2
    # resume continues to step 3
    assert (
        main(
            [
                "train",
                str(recipe),
                "--output_dir",
                str(out),
                "--max_steps",
                "3",
                "--save_steps",
                "1",
                "--resume",
            ]
        )
        == 0
    )
    assert [r["step"] for r in _metrics(out) if "loss" in r] == [1, 2, 3]
    # a resume that changes what training means is refused with the key named
    with pytest.raises(ValueError, match="num_generations"):
        main(["train", str(recipe), "--output_dir", str(out), "--num_generations", "2", "--resume"])
