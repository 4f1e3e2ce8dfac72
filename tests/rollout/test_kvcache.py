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
