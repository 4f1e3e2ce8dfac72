"""ms-swift's countdown experiment (seed 004): its logged completions, scored here as there.

``data/ms_swift_countdown_completions.jsonl`` holds the five completions the document shows
(steps 1, 200, 500, 1000, 2000), each as the document's JSON string literal, copied verbatim,
with the numbers and target the completion's own text states.
"""

import json
import re
from pathlib import Path

import pytest

from grpokit.rewards import get_reward_funcs
from grpokit.tasks import get_task

DATA = Path(__file__).parent / "data" / "ms_swift_countdown_completions.jsonl"
ROWS = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]
IDS = [f"step{r['step']}" for r in ROWS]


def text(row) -> str:
    return json.loads(row["literal"])  # the document's literal is a JSON string


def swift_countdown_orm(completion: str, numbers, target) -> float:
    """ms-swift's CountdownORM as its plugin states it (restated here, eval included: the
    five inputs are known): first one-line <answer>, cut at '=', the \\d+ integers equal the
    numbers as a multiset, only digits/operators/parentheses/dot/space, value within 1e-5."""
    m = re.search(r"<answer>(.*?)</answer>", completion)
    if not m:
        return 0.0
    eq = m.group(1).strip().split("=")[0]
    if sorted(int(n) for n in re.findall(r"\d+", eq)) != sorted(numbers):
        return 0.0
    if not re.match(r"^[\d+\-*/().\s]+$", eq):
        return 0.0
    try:
        value = eval(eq, {"__builtins__": {}}, {})  # noqa: S307 -- the five fixed inputs
    except Exception:
        return 0.0
    return 1.0 if abs(float(value) - float(target)) < 1e-5 else 0.0


def test_the_data_is_the_documents():
    seed = Path("/work/shared/seeds/004-ms-swift-countdown-experiment.txt")
    if seed.exists():  # the seed is on the development machine, not in the repository
        doc = seed.read_text(encoding="utf-8")
        assert all(r["literal"] in doc for r in ROWS)
    assert [r["step"] for r in ROWS] == [1, 200, 500, 1000, 2000]


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_swift_format_scores_the_documents_completions_1(row):
    swift, alias = get_reward_funcs(["swift_format", "countdown_format"])
    for c in (text(row), [{"role": "assistant", "content": text(row)}]):
        assert swift([None], [c]) == [1.0]
        assert alias([None], [c]) == [1.0]


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_open_r1_strict_format_gives_0(row):
    # open-r1's format wants "<answer>\n" and "\n</answer>": none of ms-swift's completions
    # has a newline right inside <answer>, and steps 200/1000/2000 put a blank line or no
    # newline around </think>
    (strict,) = get_reward_funcs(["format"])
    t = text(row)
    assert "<answer>\n" not in t
    assert strict([None], [t]) == [0.0]


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_countdown_reward_agrees_with_ms_swift(row):
    (countdown,) = get_reward_funcs(["countdown"])
    want = swift_countdown_orm(text(row), row["nums"], row["target"])
    got = countdown([None], [text(row)], nums=[row["nums"]], target=[row["target"]])
    assert got == [want]
    # step 1's equation makes 168; the later ones are right
    assert want == (0.0 if row["step"] == 1 else 1.0)


def test_task_default_format_is_swift_format_and_agrees_with_is_formatted():
    task = get_task("countdown", train_size=20, test_size=5)
    assert task.default_reward_funcs == ("countdown", "swift_format")
    _, fmt = get_reward_funcs(list(task.default_reward_funcs))
    probes = [text(r) for r in ROWS] + [
        "<think>a</think><answer>1</answer>",
        "<think>a</think>\n<answer>1</answer>\n",  # something after the answer
        "<answer>1</answer>",
        "<think>\na\n</think>\n<answer>\n1\n</answer>",
        " <think>a</think><answer>1</answer>",
    ]
    for p in probes:
        assert task.is_formatted(p) == (fmt([None], [p]) == [1.0]), p
    assert [fmt([None], [p])[0] for p in probes[-5:]] == [1.0, 0.0, 0.0, 1.0, 0.0]
