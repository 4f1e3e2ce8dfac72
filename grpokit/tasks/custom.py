"""``custom`` (alias ``generic``): any table of prompts, with or without a gold answer.

``dataset_name`` is a local file or directory (jsonl/json/parquet/csv) or a hub id.

Parameters:

- ``prompt_column`` (default "prompt"): a list of chat messages is used as it is (the
  system prompt is added in front unless it already has one) and rendered through the chat
  template; a plain string is the model input as it is, no chat template (TRL's "standard"
  format), unless a system prompt is in effect (``system_prompt``, or ``answer_column``'s
  default): then it is the user message after that system message;
- ``answer_column`` (default None): the gold answer, copied to the ``answer`` column the
  ``correctness`` reward reads; with it the defaults are the gsm8k ones (reasoning/answer
  system prompt, rewards ``correctness`` + ``xml_format``, the same lenient grader);
- ``reward_columns`` (default []): further columns kept in each row and passed to rewards
  (all other columns are dropped);
- ``test_size``: hold out a seeded slice of the train split as "test".

With no ``answer_column`` there is no default reward (name ``reward_funcs`` in the
recipe) and ``is_correct`` is always False.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from grpokit.tasks.base import Task, TaskDataError
from grpokit.tasks.gsm8k import SYSTEM_PROMPT, is_xml_formatted, lenient_correct


@dataclass
class CustomTask(Task):
    param_defaults: ClassVar[dict[str, Any]] = {
        "prompt_column": "prompt",
        "answer_column": None,
        "reward_columns": [],
        "test_size": None,
    }

    def configure(self) -> None:
        if self.dataset_name is None:
            raise TaskDataError(
                f"task {self.name!r} needs dataset_name: a local jsonl/json/parquet/csv file or "
                "directory, or a hub id"
            )
        self.prompt_column_param = self.p["prompt_column"]
        self.answer_column = self.p["answer_column"]
        cols = self.p["reward_columns"]
        self.reward_columns = [cols] if isinstance(cols, str) else list(cols)
        if self.answer_column:
            self.default_reward_funcs = ("correctness", "xml_format")
            self.default_system_prompt = SYSTEM_PROMPT
            self.required_columns = ("answer",)

    def prompt_source_column(self) -> str | None:
        return self.prompt_column_param

    def columns_read(self) -> tuple[str, ...]:
        cols = [self.prompt_column or self.prompt_column_param, *self.reward_columns]
        return tuple(cols + ([self.answer_column] if self.answer_column else []))

    def process_row(self, row: dict[str, Any]) -> dict[str, Any]:
        need = [self.prompt_column_param, *self.reward_columns]
        if self.answer_column:
            need.append(self.answer_column)
        missing = [c for c in need if c not in row]
        if missing:
            raise TaskDataError(
                f"task {self.name!r}: {self.source} lacks column(s) {missing} (has "
                f"{sorted(row)}); set task_params prompt_column / answer_column / reward_columns"
            )
        out = {c: row[c] for c in self.reward_columns}
        out["prompt"] = row[self.prompt_column_param]
        if self.answer_column:
            out["answer"] = str(row[self.answer_column]).strip()
        return out

    def make_prompt(self, row: dict[str, Any]) -> str | list[dict[str, str]]:
        p = row["prompt"]
        if isinstance(p, str) and not (self.effective_system_prompt() or self.demonstrations):
            return p
        return self.make_messages(row)

    def make_messages(self, row: dict[str, Any]) -> list[dict[str, str]]:
        p = row["prompt"]
        if isinstance(p, list):
            messages = [dict(m) for m in p]
            system = self.effective_system_prompt()
            if system and not any(m.get("role") == "system" for m in messages):
                messages.insert(0, {"role": "system", "content": system})
            at = next(
                (i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages)
            )
            return messages[:at] + [dict(m) for m in self.demonstrations] + messages[at:]
        return super().make_messages(row)

    def make_user_message(self, row: dict[str, Any]) -> str:
        return str(row["prompt"])

    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        return bool(self.answer_column) and lenient_correct(completion, row["answer"])

    def is_formatted(self, completion: str) -> bool:
        if not self.answer_column:
            return True
        return is_xml_formatted(completion)
