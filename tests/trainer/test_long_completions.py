"""Long completions in bounded memory: a training step of the tiny model with every
completion forced to 1,024 tokens makes no tensor of N x T x V elements (N rows, T completion
tokens, V vocabulary) and its memory grows no faster than the length; the token bound on
micro-batches (``max_micro_batch_tokens``) changes no logged number."""

import dataclasses

import pytest
import torch

from grpokit.batch import MicroBatchPlan
from grpokit.memory import LiveTensors
from grpokit.rollout.base import Rollout
from grpokit.testing import tiny_run_config
from grpokit.trainer import GRPOTrainer

ROWS = 16  # 2 prompts x G=8, one micro-batch of 16 rows unless the token bound splits it


def _step(model_dir, out, length: int, **over):
    """One round and optimizer step with every completion ``length`` tokens long (EOS masked
    in grpokit's own decode loop), under live-tensor accounting."""
    cfg = tiny_run_config(
        model_dir,
        out,
        num_generations=8,
        per_device_train_batch_size=ROWS,
        max_completion_length=length,
        beta=0.04,
        loss_type="dapo",
        max_steps=1,
        **over,
    )
    tr = GRPOTrainer(cfg)
    tr.sampling = dataclasses.replace(tr.sampling, min_new_tokens=length)
    with LiveTensors() as live:
        batch, _, _ = tr.collect_round()
        pieces = tr.opt.plan(batch.rollout)
        metrics = tr.optimizer_step(batch)
    assert batch.rollout.completion_mask.sum(-1).eq(length).all()
    return live, pieces, metrics, tr.model.config.vocab_size


@pytest.fixture(scope="module")
def long_runs(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("long")
    return {
        (L, bound): _step(tiny_model_dir, d / f"{L}-{bound}", L, max_micro_batch_tokens=bound)
        for L, bound in ((256, 4096), (1024, 4096), (1024, 0))
    }


def test_no_tensor_of_rows_x_length_x_vocab(long_runs):
    live, pieces, _, V = long_runs[(1024, 4096)]
    NTV = ROWS * 1024 * V
    assert len(pieces) > 1  # the bound split the 16 rows
    assert live.largest is not None
    largest = torch.Size(live.largest.shape).numel()
    assert largest < NTV, live.summary()
    # the accounting does see such a tensor: without the bound the fused head's blocks
    # cover the micro-batch's 16 x 1,024 tokens at once
    unbounded, pieces0, _, _ = long_runs[(1024, 0)]
    assert len(pieces0) == 1
    assert torch.Size(unbounded.largest.shape).numel() >= NTV, unbounded.summary()


def test_memory_grows_no_faster_than_the_length(long_runs):
    short, _, _, _ = long_runs[(256, 4096)]
    long, _, _, _ = long_runs[(1024, 4096)]
    assert long.peak_bytes <= 4 * short.peak_bytes * 1.1, (short.summary(), long.summary())


def test_token_bound_changes_no_number(long_runs):
    _, _, bounded, _ = long_runs[(1024, 4096)]
    _, _, unbounded, _ = long_runs[(1024, 0)]
    assert bounded["tokens_forward"] != unbounded["tokens_forward"]  # other forwards ran
    for k in ("loss", "grad_norm", "kl", "completions/mean_length"):
        if k in unbounded:
            assert bounded[k] == pytest.approx(unbounded[k], rel=1e-5, abs=1e-7), k


def _positions(ro: Rollout, rows: torch.Tensor, share: bool) -> int:
    """Token positions one forward over ``rows`` computes, counted from the rollout."""
    p = ro.prompt_mask[rows].sum(-1)
    c = ro.completion_mask[rows].sum(-1)
    if not share:
        return len(rows) * int(p.max() + c.max())
    distinct = {tuple(ro.prompt_ids[i].tolist()) for i in rows.tolist()}
    return len(distinct) * (int(p.max()) - 1) + len(rows) * (int(c.max()) + 1)


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("bound", [1, 300, 1000, 5000])
def test_plan_bounds_the_tokens_of_each_micro_batch(share, bound):
    g = torch.Generator().manual_seed(1)
    B, G, P, C = 4, 4, 12, 90
    plen = torch.randint(3, P + 1, (B,), generator=g).repeat_interleave(G)
    clen = torch.randint(1, C + 1, (B * G,), generator=g)
    p_mask = (torch.arange(P)[None] >= P - plen[:, None]).long()
    p_ids = (torch.arange(B).repeat_interleave(G)[:, None] + 5) * p_mask
    c_mask = (torch.arange(C)[None] < clen[:, None]).long()
    ro = Rollout(p_ids, p_mask, c_mask * 7, c_mask, clen == C, [""] * (B * G))
    pieces = MicroBatchPlan(8, G, share=share, max_tokens=bound)(ro)
    assert sorted(torch.cat(pieces).tolist()) == list(range(B * G))
    for rows in pieces:
        assert len(rows) <= 8
        assert len(rows) == 1 or _positions(ro, rows, share) <= bound
    unbounded = MicroBatchPlan(8, G, share=share)(ro)
    if bound >= max(_positions(ro, r, share) for r in unbounded):
        assert [r.tolist() for r in pieces] == [r.tolist() for r in unbounded]
    if bound == 1:
        assert all(len(r) == 1 for r in pieces)


def test_negative_token_bound_is_a_config_error():
    from grpokit.config import ConfigError, build_config

    with pytest.raises(ConfigError, match="max_micro_batch_tokens=-1: use a number of tokens"):
        build_config({"max_micro_batch_tokens": -1})
    assert build_config({"max_micro_batch_tokens": 0}).max_micro_batch_tokens == 0


def test_merged_forwards_hold_no_more_than_one_padded_micro_batch():
    """``merge_micro_batches`` lets a forward take any of the step's rows, within
    ``max_micro_batch_tokens`` and within the positions of one micro-batch padded to the
    step's longest prompt and completion (as TRL pads it; not to max_prompt_length, which
    may be far above the prompts: a generous bound there let the bench's forwards hold twice
    the unmerged activations); bnpo and ``top_entropy_quantile`` < 1 keep micro-batch-sized
    forwards, and the planner's activation estimate stays that of one full micro-batch."""
    from grpokit.config import build_config
    from grpokit.plan.memory import forward_rows
    from grpokit.setup import forward_bounds

    base = dict(per_device_train_batch_size=8, gradient_accumulation_steps=4,
                max_prompt_length=100, max_completion_length=156)  # fmt: skip
    cfg = build_config(base)
    assert forward_bounds(cfg) == {"max_tokens": 4096, "max_rows": 32}
    assert forward_rows(cfg, 256) == 8
    assert forward_bounds(build_config(base | {"max_micro_batch_tokens": 1000})) == {
        "max_tokens": 1000, "max_rows": 32}  # fmt: skip
    assert forward_bounds(build_config(base | {"max_micro_batch_tokens": 0}))["max_tokens"] is None
    assert forward_bounds(build_config(base | {"max_prompt_length": None}))["max_rows"] == 32
    for off in ({"merge_micro_batches": False}, {"loss_type": "bnpo"},
                {"top_entropy_quantile": 0.2}):  # fmt: skip
        assert forward_bounds(build_config(base | off))["max_rows"] is None, off

    def rollout(P, C, N, lo):  # groups of 4 rows sharing a P-token prompt; completions lo..C
        g = torch.Generator().manual_seed(0)
        p_ids = torch.randint(5, 50, (N // 4, P), generator=g).repeat_interleave(4, 0)
        clen = torch.randint(lo, C + 1, (N,), generator=g)
        clen[0] = C
        c_mask = (torch.arange(C)[None] < clen[:, None]).long()
        return Rollout(p_ids, torch.ones(N, P, dtype=torch.long), c_mask * 7, c_mask,
                       clen == C, [""] * N)  # fmt: skip

    # 32 rows of 20-token prompts and 20-30-token completions: one micro-batch of 8 padded
    # to the longest is 8 x 50 = 400 positions; the merged pieces stay within it, and some
    # take more than 8 rows (the prompt runs once per group)
    ro = rollout(20, 30, 32, 20)
    pieces = MicroBatchPlan(8, 4, share=True, **forward_bounds(cfg))(ro)
    assert sorted(torch.cat(pieces).tolist()) == list(range(32))
    assert all(_positions(ro, r, True) <= 8 * 50 for r in pieces)
    assert max(len(r) for r in pieces) > 8 and len(pieces) < 4
    # the token bound still applies below the padded micro-batch
    pieces = MicroBatchPlan(8, 4, share=True, max_tokens=300, max_rows=32)(ro)
    assert all(_positions(ro, r, True) <= 300 for r in pieces)
    # an unmerged micro-batch never exceeds the padded bound, so it never cuts one
    unmerged = MicroBatchPlan(8, 4, share=True, max_tokens=4096)(ro)
    assert max(_positions(ro, r, True) for r in unmerged) <= 8 * 50
    assert max(_positions(ro, r, False) for r in unmerged) <= 8 * 50
