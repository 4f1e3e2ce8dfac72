"""Property-based tests: advantages and losses on random shapes, NaNs and extreme values;
config parsing on arbitrary override values."""

import math

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from grpokit.algo import LOSS_TYPES, group_advantages, policy_loss
from grpokit.config import ConfigError, GRPOConfig, build_config, parse_overrides

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)
maybe_nan = st.one_of(finite, st.just(float("nan")))


@settings(max_examples=150, deadline=None)
@given(
    B=st.integers(1, 5),
    G=st.integers(2, 6),
    data=st.data(),
    scale=st.sampled_from(["group", "batch", "none"]),
)
def test_advantages_finite_and_zero_mean(B, G, data, scale):
    vals = data.draw(st.lists(maybe_nan, min_size=B * G, max_size=B * G))
    r = torch.tensor(vals, dtype=torch.float32)
    adv = group_advantages(r, G, scale)
    assert adv.shape == (B * G,) and torch.isfinite(adv).all()
    assert (adv[torch.isnan(r)] == 0).all()
    for b in range(B):
        grp, a = r[b * G : (b + 1) * G], adv[b * G : (b + 1) * G]
        ok = ~torch.isnan(grp)
        if ok.sum() >= 1:
            # relative to the group's spread, the advantages of valid members sum to ~0
            spread = max(1.0, float(a[ok].abs().max()))
            assert abs(float(a[ok].sum())) <= 1e-3 * spread * G


@settings(max_examples=100, deadline=None)
@given(
    N=st.integers(1, 4),
    T=st.integers(1, 6),
    data=st.data(),
    loss_type=st.sampled_from(LOSS_TYPES),
    level=st.sampled_from(["token", "sequence"]),
)
def test_loss_finite_under_extreme_log_probs(N, T, data, loss_type, level):
    logp_vals = st.floats(min_value=-80.0, max_value=0.0, allow_nan=False, width=32)
    logp = torch.tensor(data.draw(st.lists(logp_vals, min_size=N * T, max_size=N * T))).view(N, T)
    old = torch.tensor(data.draw(st.lists(logp_vals, min_size=N * T, max_size=N * T))).view(N, T)
    ref = torch.tensor(data.draw(st.lists(logp_vals, min_size=N * T, max_size=N * T))).view(N, T)
    adv = torch.tensor(data.draw(st.lists(st.floats(-10, 10, width=32), min_size=N, max_size=N)))
    mask = torch.tensor(
        data.draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=N * T, max_size=N * T))
    ).view(N, T)
    logp.requires_grad_()
    # a log-ratio of up to 80 overflows exp() in the surrogate only where the clip does not
    # bound it: keep old/new within the range PPO sees in practice, but ref is unconstrained
    assume(((logp - old).abs() <= 20).all())
    loss, m = policy_loss(
        logp, old, ref, adv, mask, loss_type=loss_type, beta=0.04, importance_sampling_level=level
    )
    assert math.isfinite(loss.item()), loss
    assert all(math.isfinite(v.item()) for v in m.values())
    loss.backward()
    assert torch.isfinite(logp.grad).all()


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(sorted(GRPOConfig.__dataclass_fields__)), raw=st.text(max_size=20))
def test_config_override_either_valid_or_named_error(key, raw):
    try:
        values = (
            parse_overrides([f"--{key}", raw]) if raw and not raw.startswith("--") else {key: raw}
        )
        c = build_config(values)
    except ConfigError as e:
        assert (
            key in str(e) or "completions per optimizer step" in str(e) or "set max_steps" in str(e)
        ), str(e)
    else:
        assert isinstance(c, GRPOConfig)
