"""The cache argument follows the installed transformers: no deprecation warning from a
decode step, and the cache a call returns is the one the next call extends."""

import warnings

import torch
import transformers

from grpokit.rollout.kvcache import CACHE_ARG, _release, cache_kwarg, returned_cache
from grpokit.testing import make_tiny_model


def test_release_parsing():
    assert _release("5.23.0") == (5, 23)
    assert _release("5.24.0rc1") == (5, 24)
    assert _release("5.40.0.dev0") == (5, 40)
    assert _release("6") == (6,) and _release("6") > (5, 24)


def test_the_name_matches_the_installed_version():
    expected = "cache" if _release(transformers.__version__) >= (5, 24) else "past_key_values"
    assert CACHE_ARG == expected


def test_a_cached_step_equals_the_full_forward_without_a_warning(tmp_path):
    path = make_tiny_model(tmp_path / "tiny", seed=0)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(3, model.config.vocab_size, (2, 7))
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = model(input_ids=ids[:, :6], use_cache=True)
        cache = returned_cache(first)
        step = model(input_ids=ids[:, 6:], use_cache=True, **cache_kwarg(cache))
        full = model(input_ids=ids, use_cache=False)
    torch.testing.assert_close(step.logits[:, -1], full.logits[:, -1], rtol=1e-5, atol=1e-5)
    # transformers 5.24+ warns (FutureWarning) when a call passes the old name
    assert not [w for w in seen if "past_key_values" in str(w.message)]


def test_selected_cache_rows_get_the_same_gradient_every_time():
    """One prompt's keys and values gathered for many completions (the shared-prompt
    forward's repeated rows, the common prefix's copy for every prompt): the gradient summed
    back into the prompt rows is the same bit for bit on every run, with two threads and
    rows large enough to be split between them (``keys[rows]``'s backward races there)."""
    import torch
    from transformers import DynamicCache

    from grpokit.rollout.kvcache import select_cache_rows

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(0)
        k0 = torch.randn(2, 3, 116, 64, generator=g)
        v0 = torch.randn(2, 3, 116, 64, generator=g)
        w = torch.randn(16, 3, 116, 64, generator=g)
        for rows in (torch.zeros(16, dtype=torch.long), torch.tensor([0, 1] * 8)):
            grads = []
            for _ in range(5):
                k, v = k0.clone().requires_grad_(), v0.clone().requires_grad_()
                cache = DynamicCache()
                cache.update(k, v, 0)
                select_cache_rows(cache, rows)
                ly = cache.layers[0]
                assert ly.keys.shape[0] == 16
                torch.testing.assert_close(ly.keys, k0[rows], rtol=0, atol=0)
                ((ly.keys * w).sum() + (ly.values * w).sum()).backward()
                grads.append((k.grad, v.grad))
            for gk, gv in grads[1:]:
                assert torch.equal(gk, grads[0][0]) and torch.equal(gv, grads[0][1])
            want = torch.zeros_like(k0).index_add_(0, rows, w)
            torch.testing.assert_close(grads[0][0], want)
    finally:
        torch.set_num_threads(threads)
