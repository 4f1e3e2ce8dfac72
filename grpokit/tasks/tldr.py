"""``tldr``: summarise a post in about ``target_length`` characters (a prompt-only task).

Sources: rows with a ``prompt`` column (the text to summarise, e.g. "SUBREDDIT: ... POST:
... TL;DR:"): a local file or directory, or the hub ids ``mlabonne/smoltldr`` (the
default; train/validation/test) or ``trl-lib/tldr``.

A string prompt is the model input as it is, with no chat template (TRL's "standard" format,
as TRL's smoltldr demo trains on it); chat messages keep their user turn and go through the
chat template. A ``system_prompt`` makes every prompt chat messages (system, then user).

There is no gold answer: the reward is ``length_target`` (shorter distance to the target
length scores higher; each row carries a ``target_length`` column, which the reward reads
in place of its own parameter). The grader counts a completion correct when the reward's
own distance, ``|target_length - len(completion)|`` in characters with nothing stripped
(``grpokit.rewards.builtin.length_gap``), is at most ``tolerance``.

Parameters: ``target_length`` (default 50 characters, as in the smoltldr GRPO
tutorial), ``tolerance`` (default 10), ``test_size``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from grpokit.rewards.builtin import length_gap
from grpokit.tasks.base import Task, TaskDataError

HUB_ID = "mlabonne/smoltldr"


@dataclass
class TLDRTask(Task):
    default_reward_funcs: tuple = ("length_target",)
    default_system_prompt: str | None = None
    required_columns: tuple = ("text",)

    param_defaults: ClassVar[dict[str, Any]] = {
        "target_length": 50,
        "tolerance": 10,
        "test_size": None,
    }
    default_dataset: ClassVar[str | None] = HUB_ID
    source_prompt_column: ClassVar[str | None] = "prompt"
    source_columns: ClassVar[tuple[str, ...]] = ("prompt",)
    known_datasets: ClassVar[tuple[str, ...]] = ("mlabonne/smoltldr",)

    def configure(self) -> None:
        self.target_length, self.tolerance = int(self.p["target_length"]), int(self.p["tolerance"])
        if self.target_length <= 0 or self.tolerance < 0:
            raise TaskDataError("task tldr: target_length must be > 0 and tolerance >= 0")

    def process_row(self, row: dict[str, Any]) -> dict[str, Any]:
        if "prompt" not in row:
            raise TaskDataError(f"tldr rows need a 'prompt' column; got {sorted(row)}")
        text = prompt = row["prompt"]
        if isinstance(text, list):  # already chat messages: keep the user turn
            text = next((m["content"] for m in text if m.get("role") == "user"), "")
        # the source prompt stays until build() replaces it with the model input
        return {"prompt": prompt, "text": str(text), "target_length": self.target_length}

    def make_prompt(self, row: dict[str, Any]) -> str | list[dict[str, str]]:
        if isinstance(row.get("prompt"), str) and not (
            self.effective_system_prompt() or self.demonstrations
        ):
            return row["text"]
        return self.make_messages(row)

    def make_user_message(self, row: dict[str, Any]) -> str:
        return row["text"]

    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        target = row.get("target_length")
        target = self.target_length if target is None else int(target)
        return length_gap(completion, target) <= self.tolerance
