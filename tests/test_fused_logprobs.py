"""The trainer's fused head + trimmed micro-batches compute the same log-probs, entropies and
gradients as the model's own forward over the whole padded batch (the unfused path)."""

import dataclasses

import pytest
import torch

from grpokit.rollout.base import Rollout, completion_mask_from_eos
from grpokit.testing import tiny_run_config
from grpokit.trainer import GRPOTrainer, _fused_head


def _rollout(tr, n=6, P=9, C=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    V = tr.model.config.vocab_size
    # the compared rows 4, 0, 5, 2 differ in prompt and completion length
    p_len = torch.tensor([3, 9, 4, 2, 5, 2])[:n]
    p_mask = (torch.arange(P)[None, :] >= P - p_len[:, None]).long()  # left padding
    p_ids = torch.randint(3, V, (n, P), generator=g) * p_mask
    c_ids = torch.randint(3, V, (n, C), generator=g)
    eos = tr.tokenizer.eos_token_id
    lens = torch.tensor([9, 2, 3, 8, 2, 1])[:n]  # every row ends before C: trimmed columns
    for i, k in enumerate(lens.tolist()):
        c_ids[i, k - 1] = eos
        c_ids[i, k:] = tr.tokenizer.pad_token_id
    c_mask, truncated = completion_mask_from_eos(c_ids, [eos])
    return Rollout(p_ids, p_mask, c_ids, c_mask, truncated, [""] * n)


def _compare(tr, ro, atol, grad_rtol):
    assert _fused_head(tr.model) is not None
    rows = torch.tensor([4, 0, 5, 2])
    out = {}
    for fused in (True, False):
        tr.cfg = dataclasses.replace(tr.cfg, fused_logprobs=fused)
        tr.model.zero_grad(set_to_none=True)
        logp, ent = tr.completion_logps(tr.model, ro, rows, with_entropy=True)
        mask = ro.completion_mask[rows].float()
        (logp * mask * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        grads = {n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None}
        out[fused] = (logp * mask, ent * mask, grads)
    (lf, ef, gf), (lu, eu, gu) = out[True], out[False]
    assert lf.shape == lu.shape == ro.completion_ids[rows].shape
    torch.testing.assert_close(lf, lu, atol=atol, rtol=0)
    torch.testing.assert_close(ef, eu, atol=atol * 10, rtol=0)
    assert gf.keys() == gu.keys() and gf
    worst = 0.0
    for k in gf:
        scale = gu[k].abs().max().clamp(min=1e-6)
        worst = max(worst, ((gf[k] - gu[k]).abs().max() / scale).item())
    assert worst < grad_rtol


@pytest.mark.parametrize(
    "overrides,atol,grad_rtol",
    [
        ({}, 2e-5, 1e-4),
        ({"use_peft": True, "lora_r": 4, "lora_dropout": 0.0}, 2e-5, 1e-4),
        ({"bf16": True}, 2e-2, 3e-2),
    ],
    ids=["full", "lora", "bf16"],
)
def test_fused_head_matches_model_forward(tmp_path, tiny_model_dir, overrides, atol, grad_rtol):
    tr = GRPOTrainer(
        tiny_run_config(tiny_model_dir, tmp_path / "run", temperature=0.7, **overrides)
    )
    _compare(tr, _rollout(tr), atol, grad_rtol)


def test_micro_batches_group_by_length_except_bnpo(tmp_path, tiny_model_dir):
    tr = GRPOTrainer(
        tiny_run_config(tiny_model_dir, tmp_path / "run", per_device_train_batch_size=4)
    )
    ro = _rollout(tr, n=6)
    parts = tr._micro_batches(ro)
    assert sorted(torch.cat(parts).tolist()) == list(range(6)) and [len(p) for p in parts] == [4, 2]
    total = ro.prompt_mask.sum(-1) + ro.completion_mask.sum(-1)
    assert total[parts[0]].min() >= total[parts[1]].max()
    assert torch.cat(tr._micro_batches(ro, keep_order=True)).tolist() == list(range(6))
    # no-grad log-probs are per row: the grouping cannot change them
    with torch.no_grad():
        whole = tr.completion_logps(tr.model, ro, slice(None))[0]
    torch.testing.assert_close(tr._logps_no_grad(tr.model, ro), whole, atol=1e-5, rtol=0)
