"""The GRPO-from-scratch tutorial's outer iterations in TRL's keys: at the start of each outer
loop the tutorial copies the current policy into the reference model, then runs its batches
with mu updates each. grpokit does that with sync_ref_model: true, ref_model_mixup_alpha: 1.0
and ref_model_sync_steps = optimizer steps per outer loop (batches x mu). Checked on the real
loop: after every optimizer step the reference's weights are compared with the policy's
weights as they were at the last outer-loop boundary (a snapshot taken independently here)."""

import torch

from grpokit.testing import tiny_run_config
from grpokit.trainer import GRPOTrainer

MU = 2  # the tutorial's mu: updates per batch (TRL's num_iterations)
BATCHES = 2  # the tutorial's num_steps: batches per outer loop
OUTER = 3  # the tutorial's num_iterations: outer loops


def _weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


def test_outer_iterations_reset_the_reference_to_the_policy(tiny_model_dir, tmp_path):
    per_outer = BATCHES * MU
    cfg = tiny_run_config(
        tiny_model_dir,
        tmp_path / "run",
        beta=0.04,  # a reference model exists only with a KL term
        num_iterations=MU,
        max_steps=OUTER * per_outer,
        sync_ref_model=True,
        ref_model_mixup_alpha=1.0,
        ref_model_sync_steps=per_outer,
        learning_rate=5e-2,  # large steps: every update moves every weight it touches
        reward_funcs=["length_target"],  # character counts of random text differ: signal
    )
    t = GRPOTrainer(cfg)
    ref = t.ref_model
    assert ref is not None and ref is not t.model
    start = _weights(t.model)
    assert _same(_weights(ref), start)  # outer loop 1 starts from the initial policy

    boundary, seen = start, []
    for _batch in range(OUTER * BATCHES):
        batch, _, _ = t.collect_round()
        for _ in range(MU):
            t.optimizer_step(batch)
            policy, reference = _weights(t.model), _weights(ref)
            if t.step % per_outer == 0:  # an outer loop ends: the next starts from here
                boundary = policy
                assert _same(reference, policy), f"step {t.step}: reference not reset"
            else:
                assert _same(reference, boundary), f"step {t.step}: reference moved mid-loop"
                assert not _same(reference, policy), f"step {t.step}: reference follows policy"
            seen.append(t.step)
    assert seen == list(range(1, OUTER * per_outer + 1))
    # the loops really started from different references
    assert not _same(boundary, start)


def test_mixup_alpha_below_one_is_not_a_reset(tiny_model_dir, tmp_path):
    """TR-DPO's soft update (alpha < 1) mixes: after a sync the reference is neither the
    policy nor the old reference, but alpha x policy + (1 - alpha) x old reference."""
    alpha = 0.5
    cfg = tiny_run_config(
        tiny_model_dir,
        tmp_path / "run",
        beta=0.04,
        max_steps=2,
        sync_ref_model=True,
        ref_model_mixup_alpha=alpha,
        ref_model_sync_steps=1,
        learning_rate=5e-2,
        reward_funcs=["length_target"],
    )
    t = GRPOTrainer(cfg)
    old = _weights(t.ref_model)
    batch, _, _ = t.collect_round()
    t.optimizer_step(batch)
    policy, reference = _weights(t.model), _weights(t.ref_model)
    assert not _same(reference, policy) and not _same(reference, old)
    for n in reference:
        torch.testing.assert_close(reference[n], alpha * policy[n] + (1 - alpha) * old[n])
