"""AdamW's state made before the first step and gradient buffers kept between steps
(grpokit.optim.allocate_state, KeptGradients): where the memory sits changes, the updates
do not."""

import pytest
import torch

from grpokit.optim import KeptGradients, MasterWeights, allocate_state


def _params(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [
        torch.nn.Parameter(torch.randn(5, 3, generator=g).to(dtype)),
        torch.nn.Parameter(torch.randn(7, generator=g).to(dtype)),
        torch.nn.Parameter(torch.randn(2, 2, generator=g).to(dtype)),
    ]


def _grads(step: int, n: int):
    g = torch.Generator().manual_seed(100 + step)
    return [
        torch.randn(5, 3, generator=g),
        torch.randn(7, generator=g),
        torch.randn(2, 2, generator=g),
    ][:n]


def _loss(params, step, used):
    """A loss whose gradient is ``_grads(step)`` on the used parameters (the others get none)."""
    grads = _grads(step, 3)
    return sum((p.float() * g).sum() for i, (p, g) in enumerate(zip(params, grads)) if i in used)


# which parameters each step's backwards reach: the last one misses step 2 entirely
USED = {1: {0, 1, 2}, 2: {0, 1}, 3: {0, 1, 2}}


def _train(kept: bool, make, dtype=torch.float32, backwards=2):
    params = _params(dtype)
    opt = make(params)
    stepped = opt.master_params if isinstance(opt, MasterWeights) else params
    if kept:
        grads = KeptGradients(stepped)
        allocate_state(opt)
    for step in (1, 2, 3):
        for _ in range(backwards):  # gradient accumulation: in place into the kept buffers
            _loss(params, step, USED[step]).backward()
        if kept:
            grads.hold_back_unused()
        opt.step()
        grads.zero() if kept else opt.zero_grad(set_to_none=True)
    return params, opt


ADAMW = {
    "fused": lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1, fused=True),
    "foreach": lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1, foreach=True),
    "for-loop amsgrad": lambda ps: torch.optim.AdamW(
        ps, lr=0.1, weight_decay=0.1, foreach=False, amsgrad=True
    ),
}


@pytest.mark.parametrize("kind", list(ADAMW))
def test_same_updates_as_lazy_state_and_freed_gradients(kind):
    """Bit-identical parameters and state after 3 steps; the parameter no backward reached
    in step 2 was not stepped there (weight decay would have moved it)."""
    a, opt_a = _train(False, ADAMW[kind])
    b, opt_b = _train(True, ADAMW[kind])
    for pa, pb in zip(a, b):
        assert torch.equal(pa, pb)
    for pa, pb in zip(a, b):
        sa, sb = opt_a.state[pa], opt_b.state[pb]
        assert sa.keys() == sb.keys()
        for k in sa:
            assert sa[k].dtype == sb[k].dtype and sa[k].device == sb[k].device
            assert torch.equal(sa[k], sb[k]), k
    assert opt_b.state[b[2]]["step"].item() == 2.0  # skipped once, like the lazy run
    assert opt_b.state[b[0]]["step"].item() == 3.0


def test_bf16_parameters_through_master_weights():
    make = lambda ps: MasterWeights(ps, ADAMW["fused"])  # noqa: E731
    a, opt_a = _train(False, make, torch.bfloat16)
    b, opt_b = _train(True, make, torch.bfloat16)
    for pa, pb, ma, mb in zip(a, b, opt_a.master_params, opt_b.master_params):
        assert torch.equal(pa, pb) and torch.equal(ma, mb)


def test_buffers_stay_in_place_and_unused_ones_are_held_back():
    params = _params()
    grads = KeptGradients(params)
    ptrs = [p.grad.data_ptr() for p in params]
    _loss(params, 1, {0, 2}).backward()
    grads.hold_back_unused()
    assert params[1].grad is None and params[0].grad is not None and params[2].grad is not None
    assert torch.equal(params[0].grad, _grads(1, 1)[0])
    grads.zero()
    assert [p.grad.data_ptr() for p in params] == ptrs
    assert all(not p.grad.any() for p in params)
    params[0].grad = torch.ones(5, 3)  # replaced (not accumulated) by someone: still reached
    grads.hold_back_unused()
    assert params[0].grad is not None and params[1].grad is None
    grads.zero()
    assert params[0].grad.data_ptr() == ptrs[0] and not params[0].grad.any()


def test_state_made_before_the_first_step_only_for_torch_adamw():
    params = _params()
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    allocate_state(sgd)
    assert not sgd.state
    adamw = torch.optim.AdamW(params, lr=0.1, fused=True)
    allocate_state(adamw)
    assert {k for k in adamw.state[params[0]]} == {"step", "exp_avg", "exp_avg_sq"}
    allocate_state(adamw)  # existing (e.g. resumed) state is left alone
    adamw.state[params[0]]["exp_avg"].fill_(1.0)
    allocate_state(adamw)
    assert adamw.state[params[0]]["exp_avg"].eq(1.0).all()
