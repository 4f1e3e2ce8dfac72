"""gsm8k: the local copy, gold extraction, and both graders on awkward strings."""

import pytest

from grpokit.tasks import TaskDataError, get_task
from grpokit.tasks.gsm8k import data_dir, extract_gold, lenient_correct, strict_correct

F = "<reasoning>\nwork\n</reasoning>\n<answer>\n{}\n</answer>"


@pytest.mark.parametrize(
    "answer, gold",
    [
        ("so 48+24=72\n#### 72", "72"),
        ("#### 1,000", "1000"),
        ("a #### b\n#### 1,234,567", "1234567"),  # the last marker counts
        ("####   -3 ", "-3"),
        ("#### 0.5", "0.5"),
    ],
)
def test_extract_gold(answer, gold):
    assert extract_gold(answer) == gold


@pytest.mark.parametrize("bad", ["no marker 72", "72 ####   "])
def test_extract_gold_refuses(bad):
    with pytest.raises(TaskDataError):
        extract_gold(bad)


def test_local_copy_loads_both_splits():
    t = get_task("gsm8k")
    if not (data_dir() / "gsm8k" / "train.jsonl").exists():
        pytest.skip("no local GSM8K copy")
    test = t.build("test")
    assert len(test) == 1319
    assert len(t.build("train", limit=5)) == 5
    assert all("," not in r["answer"] and "####" not in r["answer"] for r in test)
    assert test[0]["prompt"][0]["content"].startswith("Respond in the following format:")


def test_data_dir_env_var(tmp_path, monkeypatch, write_jsonl):
    write_jsonl(tmp_path / "gsm8k" / "train.jsonl", [{"question": "q", "answer": "#### 2,500"}])
    monkeypatch.setenv("GRPOKIT_DATA_DIR", str(tmp_path))
    rows = get_task("gsm8k").build("train")
    assert rows[0]["answer"] == "2500"
    with pytest.raises(TaskDataError, match="no 'test' split"):
        get_task("gsm8k").build("test")
    monkeypatch.setenv("GRPOKIT_DATA_DIR", str(tmp_path / "elsewhere"))
    with pytest.raises(TaskDataError, match="GRPOKIT_DATA_DIR"):
        get_task("gsm8k").build("train")


CASES = [  # (completion, gold, lenient, strict)
    (F.format("72"), "72", True, True),
    (F.format("72.0"), "72", True, False),
    (F.format("$1,000"), "1000", True, False),
    (F.format("1,000."), "1000", True, False),
    (F.format("72 apples"), "72", True, False),  # one number in the answer: 1.5 in the reward
    ("<answer>72</answer>", "72", True, False),  # no reasoning tags: strict refuses
    ("The answer is 72", "72", False, False),  # no tag, no fallback to the last number
    (F.format("71") + "<answer>72</answer>", "72", True, True),  # the last tag counts
    (F.format("72") + "<answer>71</answer>", "72", False, False),
    ("<answer>\n-3\n</answer><reasoning></reasoning>", "-3", True, True),
    (F.format("0.50"), "0.5", True, False),
    (F.format(""), "0", False, False),
    ("<answer>72", "72", False, False),  # unclosed
    (F.format("nan"), "nan", True, True),  # equal strings, whatever they are
]


@pytest.mark.parametrize("completion, gold, lenient, strict", CASES)
def test_graders(completion, gold, lenient, strict):
    assert lenient_correct(completion, gold) is lenient
    assert strict_correct(completion, gold) is strict
    row = {"answer": gold}
    assert get_task("gsm8k").is_correct(completion, row) is lenient
    assert get_task("gsm8k", strict=True).is_correct(completion, row) is strict


def test_is_correct_agrees_with_the_correctness_reward():
    from grpokit.rewards import get_reward_funcs

    fn, xml_format = get_reward_funcs(get_task("gsm8k").default_reward_funcs)
    assert fn.__name__ == "correctness"
    comps = [c for c, *_ in CASES]
    golds = [g for _, g, *_ in CASES]
    rewards = fn(prompts=[None] * len(comps), completions=comps, answer=golds)
    task = get_task("gsm8k")
    for c, g, r in zip(comps, golds, rewards):
        assert task.is_correct(c, {"answer": g}) is (r > 0), (c, g, r)
    formats = xml_format(prompts=[None] * len(comps), completions=comps)
    assert [task.is_formatted(c) for c in comps] == [f == 0.8 for f in formats]


def test_is_formatted():
    t = get_task("gsm8k")
    assert t.is_formatted(F.format("1"))
    assert not t.is_formatted("<answer>1</answer>")
