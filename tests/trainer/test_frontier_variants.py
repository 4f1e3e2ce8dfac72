"""The newer losses, stabilisers, estimators and dynamic sampling from a recipe: two tiny
training steps each, the entropy bonus's logged loss, cast_lm_head_to_fp32, and DAPO's
dynamic sampling (its selection, and exact resume)."""

import json
import math
from pathlib import Path

import pytest
import torch

from grpokit.config import build_config
from grpokit.dynamic import CallSizes, Groups, fill_batch, one_batch, sampled_metrics
from grpokit.rollout.base import Rollout

BASE = dict(
    task="arithmetic",
    task_params={"digits": 1, "train_size": 64, "test_size": 8},
    num_generations=4,
    per_device_train_batch_size=8,
    gradient_accumulation_steps=1,
    max_completion_length=8,
    learning_rate=1e-3,
    max_steps=2,
    save_steps=0,
    max_eval_samples=0,
    seed=1,
)


def _run(tmp_path, model_dir, name, resume=None, trainer_hook=None, **kw):
    from grpokit.trainer import GRPOTrainer

    cfg = build_config(
        {**BASE, "model_name_or_path": model_dir, "output_dir": str(tmp_path / name), **kw}
    )
    tr = GRPOTrainer(cfg, resume=resume)
    if trainer_hook:
        trainer_hook(tr)
    tr.train()
    rows = [
        json.loads(x) for x in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    return tr, rows


VARIANTS = [
    {"loss_type": "cispo", "epsilon_high": 5.0},
    {"loss_type": "sapo"},
    {"loss_type": "luspo", "importance_sampling_level": "sequence"},
    {"loss_type": "vespo", "num_iterations": 2},
    {"loss_type": "grpo", "delta": 2.0, "num_iterations": 2},
    {"top_entropy_quantile": 0.2},
    {"off_policy_mask_threshold": 0.01, "num_iterations": 2},
    {"use_bias_correction_kl": True, "beta": 0.04, "num_iterations": 2},
    {"advantage_estimator": "rloo", "scale_rewards": "none"},
    {"advantage_estimator": "reinforce_plus_plus_baseline", "scale_rewards": "batch"},
    {"multi_objective_aggregation": "normalize_then_sum"},
    {"entropy_coef": 0.01},
    {"use_adaptive_entropy": True, "entropy_coef": 0.01, "entropy_target": 10.0},
    {"cast_lm_head_to_fp32": True, "bf16": True},
    {"dynamic_sampling": True, "max_num_gen_batches": 3},
]


@pytest.mark.parametrize("kw", VARIANTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_variant_trains_two_steps(tmp_path, tiny_model_dir, kw):
    tr, rows = _run(tmp_path, tiny_model_dir, "v", **kw)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]), r
    lt = tr.cfg.loss_type
    if lt == "cispo":
        assert "cispo_clip_ratio" in rows[0] and "clip_ratio/region_mean" not in rows[0]
    if lt == "vespo":
        assert rows[0]["vespo/phi_seq_mean"] == pytest.approx(1.0, abs=1e-5)  # on-policy
    if tr.cfg.dynamic_sampling:
        assert 1 <= rows[0]["dynamic_sampling/num_gen_batches"] <= 3
        assert 0.0 <= rows[0]["dynamic_sampling/dropped_frac"] <= 1.0


@pytest.mark.parametrize("G", [4, 1])
def test_reinforce_pp_baseline_whitens_over_the_loss_tokens(
    tmp_path, tiny_model_dir, monkeypatch, G
):
    """The round's advantages are the estimator's on the round's rewards and the loss-token
    counts of the same rows (mask_truncated_completions zeroes the truncated ones); a group
    of one (no baseline) trains too."""
    import grpokit.trainer as trainer_mod
    from grpokit.algo import group_advantages
    from grpokit.scoring import combine

    seen = []
    real = trainer_mod.round_advantages

    def record(rewards, weights, cfg, device, lengths=None):
        out = real(rewards, weights, cfg, device, lengths=lengths)
        seen.append((rewards, weights, lengths, out[2]))
        return out

    def hook(tr):
        real_collect, real_generate = tr.collect_round, tr._generate_groups

        def generate():  # completions of different lengths: an EOS in every even row
            g = real_generate()
            ro = g.rollout
            for i in range(0, ro.completion_mask.shape[0], 2):
                ro.completion_mask[i, 1 + (5 * i) % 11 :] = 0
                ro.truncated[i] = False
            return g

        def collect():
            batch, m, table = real_collect()
            seen[-1] += (batch.loss_mask.sum(-1),)
            return batch, m, table

        tr.collect_round, tr._generate_groups = collect, generate

    est = "reinforce_plus_plus_baseline"
    monkeypatch.setattr(trainer_mod, "round_advantages", record)
    _, rows = _run(
        tmp_path, tiny_model_dir, f"rfpp{G}", trainer_hook=hook, advantage_estimator=est,
        scale_rewards="batch", num_generations=G, max_completion_length=12,
        mask_truncated_completions=True,
    )  # fmt: skip
    assert [r["step"] for r in rows] == [1, 2] and len(seen) == 2
    for r in rows:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]), r
    for rewards, weights, lengths, adv, loss_tokens in seen:
        assert torch.equal(lengths, loss_tokens) and len(set(lengths.tolist())) > 2
        expected = group_advantages(
            combine(rewards, weights), G, "batch", estimator=est, completion_lengths=lengths
        )
        torch.testing.assert_close(adv, expected)
        assert torch.all(adv[lengths == 0] == 0)


def test_entropy_bonus_is_subtracted_from_the_logged_loss(tmp_path, tiny_model_dir):
    """dapo, one micro-batch: the step-1 loss is the policy loss minus coef * the mean token
    entropy (the same rollout, the model not yet updated)."""
    _, plain = _run(tmp_path, tiny_model_dir, "plain", max_steps=1)
    _, bonus = _run(tmp_path, tiny_model_dir, "bonus", max_steps=1, entropy_coef=0.5)
    assert plain[0]["reward"] == bonus[0]["reward"]
    expected = plain[0]["loss"] - 0.5 * plain[0]["entropy"]
    assert bonus[0]["loss"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert bonus[0]["entropy_coef"] == 0.5
    # TRL's policy_loss: the policy term before the bonus
    assert bonus[0]["policy_loss"] == pytest.approx(plain[0]["loss"], rel=1e-5, abs=1e-6)
    assert "policy_loss" not in plain[0]


def test_entropy_bonus_through_the_fused_head_trains_as_the_model_head(tmp_path, tiny_model_dir):
    """The fused head gives the entropies their gradient (no (N, T, V) logits): three steps
    with a bonus log the same losses, gradient norms and entropies as the model's own head."""
    kw = dict(max_steps=3, entropy_coef=0.5, per_device_train_batch_size=4, gradient_accumulation_steps=2)  # fmt: skip
    _, fused = _run(tmp_path, tiny_model_dir, "fused", fused_logprobs=True, **kw)
    _, plain = _run(tmp_path, tiny_model_dir, "plain", fused_logprobs=False, **kw)
    for f, p in zip(fused, plain, strict=True):
        assert f["reward"] == p["reward"]
        for k in ("loss", "grad_norm", "entropy"):
            assert f[k] == pytest.approx(p[k], rel=1e-4, abs=1e-6), k


def test_adaptive_entropy_moves_the_coefficient_and_resumes(tmp_path, tiny_model_dir):
    kw = dict(use_adaptive_entropy=True, entropy_coef=0.01, entropy_coef_delta=0.002, max_steps=3)
    _, rows = _run(tmp_path, tiny_model_dir, "up", entropy_target=100.0, **kw)
    assert [r["entropy_coef"] for r in rows] == pytest.approx([0.012, 0.014, 0.016])
    _, rows = _run(tmp_path, tiny_model_dir, "down", entropy_target=0.0, **kw)
    assert [r["entropy_coef"] for r in rows] == pytest.approx([0.008, 0.006, 0.004])
    # the controller's state is in the checkpoint
    tr, _ = _run(tmp_path, tiny_model_dir, "ck", entropy_target=100.0, save_steps=3, **kw)
    state = json.loads((tmp_path / "ck" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["entropy_control"]["entropy_coef"] == pytest.approx(0.016)


def test_cast_lm_head_to_fp32(tiny_model_dir):
    from grpokit.forward import Float32Head, cast_lm_head_to_fp32
    from grpokit.models import load_model_and_tokenizer

    model, _, _ = load_model_and_tokenizer(tiny_model_dir, dtype="bfloat16")
    cast_lm_head_to_fp32(model)
    head = model.get_output_embeddings()
    assert isinstance(head, Float32Head) and head.weight.dtype == torch.float32
    ids = torch.tensor([[1, 2, 3]])
    assert model.get_input_embeddings()(ids).dtype == torch.bfloat16  # tied: cast back
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids).logits
    assert logits.dtype == torch.float32
    hs = model.get_decoder()(ids).last_hidden_state
    torch.testing.assert_close(logits, hs.float() @ head.weight.T)


# ----------------------------------------------------------------- dynamic sampling
def _groups(rewards_per_group, G=2, start=0):
    """A fake generation batch: group k's completions have the rewards given."""
    B = len(rewards_per_group)
    N = B * G
    C = 3 + (start // 2) % 2  # different widths, so concatenation pads
    ro = Rollout(
        torch.full((N, 2), 7), torch.ones(N, 2, dtype=torch.long),
        torch.arange(N * C).view(N, C), torch.ones(N, C, dtype=torch.long),
        torch.zeros(N, dtype=torch.bool), [f"t{start + k}.{j}" for k in range(B) for j in range(G)],
    )  # fmt: skip
    rewards = torch.tensor([x for g in rewards_per_group for x in g]).view(N, 1)
    return Groups([f"p{start + k}" for k in range(B)], ro, rewards, (1.0, 0.5))


def test_fill_batch_keeps_informative_groups_in_order():
    batches = iter(
        [
            _groups([[1.0, 1.0], [0.0, 1.0]], start=0),  # p0 dropped, p1 kept
            _groups([[0.0, 0.0], [0.5, 0.0]], start=2),  # p2 dropped, p3 kept
            _groups([[1.0, 0.0], [1.0, 0.0]], start=4),  # never reached
        ]
    )
    out, m = fill_batch(lambda k: next(batches), torch.ones(1), 2, CallSizes(2, 2), pad_id=0)
    assert out.rows == ["p1", "p3"]
    assert out.rollout.texts == ["t1.0", "t1.1", "t3.0", "t3.1"]
    assert out.rewards.squeeze(1).tolist() == [0.0, 1.0, 0.5, 0.0]
    assert out.rollout.completion_ids.shape == (4, 4)  # padded to the wider batch
    assert out.rollout.completion_mask[:2, 3].tolist() == [0, 0]
    assert m["dynamic_sampling/num_gen_batches"] == 2
    assert m["dynamic_sampling/dropped_frac"] == 0.5
    assert m["dynamic_sampling/filled_groups"] == 0
    assert out.seconds == (2.0, 1.0)


def test_call_sizes_follow_the_informative_rate_within_the_budget():
    s = CallSizes(4)  # auto, no limit
    assert s.size(4, 0) == 4  # no history: a step's prompts, as one batch at a time
    s.record(4, 8)  # half the sampled groups were informative
    assert s.rate() == 0.5 and s.size(4, 0) == 8 and s.size(3, 8) == 6 and s.size(1, 8) == 2
    s.record(0, 8)
    assert s.rate() == 0.25 and s.size(4, 0) == 8  # 16 wanted: at most 2 x the step's
    s.record(0, 0)
    for _ in range(4):
        s.record(3, 4)
    assert s.rate() == 0.75 and len(s.history) == 4  # the last 4 steps only
    assert s.size(4, 0) == 6 and not s.spent(100, 1000)
    t = CallSizes(4, max_calls=3)  # budget: 3 calls, 12 prompts
    t.load_state_dict(s.state_dict())
    assert t.history == s.history
    assert t.size(4, 8) == 4 and t.spent(2, 12) and t.spent(3, 4) and not t.spent(2, 11)
    fixed = CallSizes(4, per_call=6, max_calls=2)  # verl's gen_batch_size: calls only
    assert fixed.size(1, 100) == 6 and not fixed.spent(1, 100) and fixed.spent(2, 12)
    t.load_state_dict(None)
    assert t.history == [] and t.size(4, 0) == 4
    small = CallSizes(4, limit=6)  # a training set of 6 prompts: never more in one call
    small.record(1, 8)
    assert small.size(4, 0) == 6


def test_fill_batch_draws_what_the_rate_says_and_keeps_the_prompt_order():
    """Each call gets the size the rate asks for; the step keeps the first informative
    groups in the order their prompts were drawn, the surplus is dropped."""
    pattern = iter([True, False, False, True, False, True, True, False, True, True, True])
    asked, drawn = [], [0]

    def generate(k):
        asked.append(k)
        groups = [[0.0, 1.0] if next(pattern) else [1.0, 1.0] for _ in range(k)]
        g = _groups(groups, start=drawn[0])  # prompts p0, p1, ... in draw order
        drawn[0] += k
        return g

    sizes = CallSizes(2)
    sizes.record(1, 4)  # rate 0.25: 8 prompts for the 2 groups missing, at most 4
    out, m = fill_batch(generate, torch.ones(1), 2, sizes, 0)
    assert asked == [4]  # p0..p3: informative p0, p3
    assert out.rows == ["p0", "p3"]
    assert m["dynamic_sampling/num_gen_batches"] == 1
    assert m["dynamic_sampling/sampled_prompts"] == 4 and m["dynamic_sampling/dropped_frac"] == 0.5
    assert sizes.history[-1] == (2, 4)  # rate now 3 / 8
    out, m = fill_batch(generate, torch.ones(1), 2, sizes, 0)
    # pattern left: F T T F T T T -> call 1 (ceil(2 / 0.375) = 6 -> at most 4): F T T F
    assert asked == [4, 4] and out.rows == ["p5", "p6"]
    assert m["dynamic_sampling/num_gen_batches"] == 1 and m["dynamic_sampling/filled_groups"] == 0


def test_dynamic_sampling_calls_never_ask_more_prompts_than_the_training_set(
    tmp_path, tiny_model_dir
):
    """2 prompts a step from a training set of 3: automatic calls stay within the 3 (the
    rate may ask for 4), and a gen_batch_size above 3 is refused in one line."""
    from grpokit.config import ConfigError
    from grpokit.trainer import GRPOTrainer

    params = {"digits": 1, "train_size": 3, "test_size": 2}
    # the untrained tiny model is rarely right: every group of step 1 equal, rate 0
    _, rows = _run(tmp_path, tiny_model_dir, "few", task_params=params, dynamic_sampling=True,
                   max_steps=3, max_num_gen_batches=3, reward_funcs=["arithmetic_correct"])  # fmt: skip
    assert rows[0]["dynamic_sampling/dropped_frac"] == 1.0  # step 2 asks for 4 prompts
    assert all(r["dynamic_sampling/sampled_prompts"] <= 6 for r in rows)  # 3 steps' worth
    cfg = build_config({**BASE, "model_name_or_path": tiny_model_dir, "task_params": params,
                        "dynamic_sampling": True, "gen_batch_size": 4,
                        "output_dir": str(tmp_path / "big")})  # fmt: skip
    with pytest.raises(ConfigError, match="gen_batch_size=4 .* training set has 3"):
        GRPOTrainer(cfg)


def test_fill_batch_limit_fills_with_dropped_groups():
    batches = iter([_groups([[1.0, 1.0], [0.0, 0.0]]), _groups([[0.0, 1.0], [2.0, 2.0]], start=2)])
    out, m = fill_batch(lambda k: next(batches), torch.ones(1), 2, CallSizes(2, 2, 2), 0)
    assert out.rows == ["p2", "p0"]  # the informative one first, then the first dropped
    assert m["dynamic_sampling/filled_groups"] == 1
    assert m["dynamic_sampling/dropped_frac"] == 0.75


def test_sampled_metrics_count_every_generated_group_dropped_ones_too():
    # G = 2; correct completions: rewards 1.0; the graders' verdicts given alongside
    a = _groups([[1.0, 1.0], [0.0, 1.0]], start=0)  # solved (dropped), mixed (kept)
    a.correct = torch.tensor([True, True, False, True])
    b = _groups([[0.0, 0.0], [0.5, 0.0]], start=2)  # stuck: equal, wrong (dropped); failed
    b.correct = torch.tensor([False, False, False, False])
    batches = iter([a, b])
    out, m = fill_batch(lambda k: next(batches), torch.ones(1), 2, CallSizes(2, 2), pad_id=0)
    assert out.rows == ["p1", "p3"] and out.correct.tolist() == [False, True, False, False]
    assert m["sampled/accuracy"] == 3 / 8  # the trained batch's would be 1 / 4
    assert m["sampled/solved_groups"] == 1 / 4
    assert m["sampled/failed_groups"] == 2 / 4
    assert m["sampled/stuck_groups"] == 1 / 4  # p2; p0 is equal but solved
    g, m1 = one_batch(lambda: _groups([[0.0, 0.0], [1.0, 1.0]]), torch.ones(1), 2)
    assert m1 == {}  # no grader's verdicts: nothing claimed
    g.correct = torch.tensor([False, False, True, True])
    assert sampled_metrics([g], torch.ones(1), 2)["sampled/stuck_groups"] == 0.5


def test_a_run_logs_what_it_sampled(tmp_path, tiny_model_dir):
    """Without dynamic sampling the sampled groups are the trained batch."""
    _, rows = _run(tmp_path, tiny_model_dir, "s", max_steps=2)
    for r in rows:
        assert r["sampled/accuracy"] == pytest.approx(r["accuracy"])
        assert 0 <= r["sampled/stuck_groups"] <= 1 - r["sampled/solved_groups"]
        assert r["sampled/solved_groups"] + r["sampled/failed_groups"] <= 1


def test_dynamic_sampling_resumes_exactly(tmp_path, tiny_model_dir):
    kw = dict(dynamic_sampling=True, max_num_gen_batches=2, max_steps=4, save_steps=2)
    ta, a = _run(tmp_path, tiny_model_dir, "a", **kw)

    def stop_at_2(tr):
        real = tr.optimizer_step

        def step(batch):
            out = real(batch)
            if tr.step == 2:
                tr.request_stop()
            return out

        tr.optimizer_step = step

    _run(tmp_path, tiny_model_dir, "b", trainer_hook=stop_at_2, **kw)
    tc, _ = _run(tmp_path, tiny_model_dir, "b", resume=True, **kw)
    b = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    keys = ("loss", "reward", "grad_norm", "dynamic_sampling/num_gen_batches", "sampled/accuracy")
    for ra, rb in zip(a, b):
        for k in keys:
            assert ra[k] == rb[k], (ra["step"], k)
    for (n, pa), (_, pc) in zip(ta.model.named_parameters(), tc.model.named_parameters()):
        assert torch.equal(pa, pc), n


def test_dynamic_sampling_on_two_ranks_fills_every_rank(tmp_path, tiny_model_dir):
    """Two gloo ranks: every round's batch is full on each rank (2 groups of 4), both ranks
    agree on the number of generation batches, and the run logs its metrics."""
    import os
    import subprocess
    import sys

    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": str(here.parents[1]), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "two"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", "29531", str(here / "_dynamic_worker.py"), tiny_model_dir, str(out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, timeout=600)
    s0 = json.loads((out / "sizes-0.json").read_text())
    s1 = json.loads((out / "sizes-1.json").read_text())
    assert [n for n, _ in s0] == [8, 8] and [n for n, _ in s1] == [8, 8]
    assert [b for _, b in s0] == [b for _, b in s1]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in rows)
