"""``gsm8k``: grade-school math word problems (Cobbe et al. 2021), gold = number after ####.

Sources: a local directory or file (jsonl/json/parquet with question/answer; default the
copy at ``../shared/data/gsm8k`` beside this repository, or ``$GRPOKIT_DATA_DIR/gsm8k``),
or the hub id ``openai/gsm8k`` (config ``main``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.rewards.text import last_tag_content, parse_number
from grpokit.tasks.base import Task, TaskDataError
from grpokit.tasks.data import load_table

SYSTEM_PROMPT = """Respond in the following format:
<reasoning>
...
</reasoning>
<answer>
...
</answer>"""


def default_gsm8k_dir() -> Path:
    env = os.environ.get("GRPOKIT_DATA_DIR")
    if env:
        return Path(env) / "gsm8k"
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k"


def extract_gold(answer: str) -> str:
    if "####" not in answer:
        raise TaskDataError(f"gsm8k answer has no '####' gold marker: {answer[-80:]!r}")
    return answer.split("####")[-1].strip().replace(",", "")


@dataclass
class GSM8KTask(Task):
    default_reward_funcs: tuple = ("correctness", "xml_format")
    default_system_prompt: str | None = SYSTEM_PROMPT
    required_columns: tuple = ("question", "answer")

    def load_rows(self, split: str) -> list[dict[str, Any]]:
        source = self.dataset_name or str(default_gsm8k_dir())
        raw = load_table(source, split, config=self.dataset_config or "main")
        rows = []
        for r in raw:
            if "question" not in r or "answer" not in r:
                raise TaskDataError(
                    f"gsm8k rows need 'question' and 'answer' columns; got {sorted(r)}"
                )
            rows.append({"question": r["question"], "answer": extract_gold(str(r["answer"]))})
        return rows

    def make_user_message(self, row: dict[str, Any]) -> str:
        return row["question"]

    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        got = last_tag_content(completion, "answer")
        if got is None:
            return False
        if got == row["answer"]:
            return True
        a, b = parse_number(got), parse_number(row["answer"])
        return a is not None and b is not None and abs(a - b) < 1e-9

    def is_formatted(self, completion: str) -> bool:
        return all(
            t in completion for t in ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
        )
