"""``gsm8k``: grade-school math word problems (Cobbe et al. 2021); gold = the number after ####.

Sources (``dataset_name``):

- None: the local copy at ``$GRPOKIT_DATA_DIR/gsm8k`` if that variable is set, else
  ``../shared/data/gsm8k`` beside this repository (``train.jsonl`` / ``test.jsonl``);
- a local directory or file (jsonl/json/parquet/csv with ``question`` and ``answer``);
- the hub id ``openai/gsm8k`` (config ``main`` unless ``dataset_config`` says otherwise).

Rows: ``question``, ``answer`` (the gold number as a string, commas removed: "1,000" ->
"1000"). Rewards: ``correctness`` (2.0 exact / 1.5 same number) and ``xml_format``.

Graders: ``is_correct`` is the ``correctness`` reward's own score > 0 (the last ``<answer>``
content equals the gold, or both are the same single number, so "$1,000" matches 1000;
``grpokit.rewards.builtin.correctness_score``); with task_params ``strict: true`` it uses
``is_correct_strict`` instead: the reasoning/answer format is present and the last
``<answer>`` content is exactly the gold string, no number parsing and no fallback (a
stricter evaluation than any reward; no reward copies it). ``is_formatted`` is the
``xml_format`` reward at its maximum (all four tags present).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from grpokit.rewards.builtin import XML_TAGS, correctness_score, xml_tag_count
from grpokit.rewards.text import last_tag_content
from grpokit.tasks.base import Task, TaskDataError

SYSTEM_PROMPT = """Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>"""


def repo_root() -> Path:
    """The repository that holds this package (``grpokit/tasks/gsm8k.py`` -> ``.``)."""
    return Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """Root of the local data copies: ``$GRPOKIT_DATA_DIR``, else ``../shared/data``."""
    env = os.environ.get("GRPOKIT_DATA_DIR")
    return Path(env).expanduser() if env else repo_root().parent / "shared" / "data"


def extract_gold(answer: str) -> str:
    """The final number of a GSM8K solution: the text after the last ``####``, no commas."""
    if "####" not in answer:
        raise TaskDataError(f"gsm8k answer has no '####' gold marker: ...{answer[-80:]!r}")
    gold = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not gold:
        raise TaskDataError(f"gsm8k answer has nothing after '####': ...{answer[-80:]!r}")
    return gold


def lenient_correct(completion: str, gold: str) -> bool:
    """The ``correctness`` reward's own score > 0, so evaluation accuracy and the training
    reward can never disagree."""
    return correctness_score(completion, gold) > 0


def is_xml_formatted(completion: str) -> bool:
    """All four reasoning/answer tags present: the ``xml_format`` reward at its maximum."""
    return xml_tag_count(completion) == len(XML_TAGS)


def strict_correct(completion: str, gold: str) -> bool:
    """No fallbacks: all four format tags present and the last <answer> is exactly ``gold``."""
    return (
        is_xml_formatted(completion) and last_tag_content(completion, "answer") == str(gold).strip()
    )


@dataclass
class GSM8KTask(Task):
    default_reward_funcs: tuple = ("correctness", "xml_format")
    default_system_prompt: str | None = SYSTEM_PROMPT
    required_columns: tuple = ("question", "answer")

    param_defaults: ClassVar[dict[str, Any]] = {"test_size": None, "strict": False}
    default_dataset_config: ClassVar[str | None] = "main"
    source_prompt_column: ClassVar[str | None] = "question"
    source_columns: ClassVar[tuple[str, ...]] = ("question", "answer")
    known_datasets: ClassVar[tuple[str, ...]] = ("openai/gsm8k",)

    @property
    def source(self) -> str:
        return self.dataset_name if self.dataset_name is not None else str(data_dir() / "gsm8k")

    def source_rows(self, split: str) -> list[dict[str, Any]]:
        if self.dataset_name is None and not Path(self.source).exists():
            raise TaskDataError(
                f"the local GSM8K copy {self.source} does not exist; set GRPOKIT_DATA_DIR to "
                "a directory holding gsm8k/train.jsonl and gsm8k/test.jsonl, or set "
                "dataset_name to a path or to the hub id 'openai/gsm8k'"
            )
        return super().source_rows(split)

    def process_row(self, row: dict[str, Any]) -> dict[str, Any]:
        if "question" not in row or "answer" not in row:
            raise TaskDataError(
                f"gsm8k rows need 'question' and 'answer' columns; got {sorted(row)}"
            )
        return {"question": row["question"], "answer": extract_gold(str(row["answer"]))}

    def make_user_message(self, row: dict[str, Any]) -> str:
        return row["question"]

    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        if self.p["strict"]:
            return self.is_correct_strict(completion, row)
        return lenient_correct(completion, row["answer"])

    def is_correct_strict(self, completion: str, row: dict[str, Any]) -> bool:
        return strict_correct(completion, row["answer"])

    def is_formatted(self, completion: str) -> bool:
        return is_xml_formatted(completion)
