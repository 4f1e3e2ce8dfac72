import math

import pytest
import torch

from grpokit.prompts import PromptSampler, columns_for_rewards
from grpokit.rollout.base import completion_mask_from_eos
from grpokit.scoring import RewardError, combine, score


def r_len(prompts, completions, **kw):
    return [float(len(c)) for c in completions]


def r_none_for_b(prompts, completions, answer, **kw):
    return [None if a == "b" else 1.0 for a in answer]


def r_raises_on_x(prompts, completions, **kw):
    return [1 / 0 if c == "x" else 0.0 for c in completions]


def test_score_matrix_with_none_as_nan():
    out = score([r_len, r_none_for_b], ["p"] * 3, ["aa", "b", "ccc"], {"answer": ["a", "b", "c"]})
    assert out.shape == (3, 2)
    assert out[:, 0].tolist() == [2.0, 1.0, 3.0]
    assert out[0, 1].item() == 1.0 and math.isnan(out[1, 1].item())


def test_reward_error_names_function_and_completion():
    with pytest.raises(RewardError, match=r"r_raises_on_x.*ZeroDivisionError.*'x'"):
        score([r_raises_on_x], ["p"] * 2, ["ok", "x"], {})


def test_reward_error_skip_counts():
    counters = {}
    out = score(
        [r_raises_on_x], ["p"] * 3, ["ok", "x", "x"], {}, on_error="skip", counters=counters
    )
    assert out[0, 0].item() == 0.0 and math.isnan(out[1, 0].item())
    assert counters["reward_errors"] == 2


def test_bad_return_values():
    with pytest.raises(RewardError, match="one float or None per completion"):
        score([lambda prompts, completions, **k: [1.0]], ["p"] * 2, ["a", "b"], {})
    with pytest.raises(RewardError, match="finite"):
        score([lambda prompts, completions, **k: [float("inf")]], ["p"], ["a"], {})


def test_combine_weights_and_all_none():
    r = torch.tensor([[1.0, 2.0], [float("nan"), 2.0], [float("nan"), float("nan")]])
    tot = combine(r, torch.tensor([0.5, 1.0]))
    assert tot[0].item() == 2.5 and tot[1].item() == 2.0 and math.isnan(tot[2].item())


def test_completion_mask_includes_first_eos_even_when_pad_is_eos():
    eos = 7
    ids = torch.tensor([[3, 4, eos, eos, eos], [3, 3, 3, 3, 3], [eos, eos, eos, eos, eos]])
    mask, truncated = completion_mask_from_eos(ids, [eos])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


def test_sampler_resumes_exactly():
    a = PromptSampler(10, 3, seed=1)
    seen = [a.next() for _ in range(5)]
    b = PromptSampler(10, 3, seed=1)
    for _ in range(2):
        b.next()
    c = PromptSampler(10, 3, seed=1)
    c.load_state_dict(b.state_dict())
    assert [c.next() for _ in range(3)] == seen[2:]
    assert all(len(set(x)) == 3 for x in seen)
    assert sorted(sum(seen[:3], [])) == sorted(set(sum(seen[:3], [])))  # no repeats in an epoch


def test_columns_repeated_per_generation():
    rows = [{"prompt": "p1", "answer": "1"}, {"prompt": "p2", "answer": "2"}]
    assert columns_for_rewards(rows, 2) == {"answer": ["1", "1", "2", "2"]}
