"""Reading a tool call out of a model's turn: the last ``<tool_call>...</tool_call>`` block,
whose body is one JSON object ``{"name": str, "arguments": object}`` (``arguments`` may
also be a JSON string holding an object, as some models write it; missing means ``{}``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from grpokit.tools.template import CALL_CLOSE, CALL_OPEN


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MalformedCall:
    """A ``</tool_call>`` whose block is not a call grpokit can run; ``why`` says so."""

    why: str
    name: str = "unknown"


def split_call(text: str) -> tuple[str, str | None]:
    """(what the model said before its call, the call block's body) of a turn that ends
    in ``</tool_call>``; body None when there is no ``<tool_call>`` before it."""
    end = text.rfind(CALL_CLOSE)
    if end < 0:
        return text, None
    start = text.rfind(CALL_OPEN, 0, end)
    if start < 0:
        return text[:end], None
    return text[:start], text[start + len(CALL_OPEN) : end]


def parse_call(body: str | None) -> ToolCall | MalformedCall:
    """The call in a block's ``body`` (see the module docstring), or why it is malformed."""
    if body is None:
        return MalformedCall("</tool_call> without an opening <tool_call>")
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return MalformedCall(f"the tool call is not valid JSON ({e.msg} at character {e.pos})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return MalformedCall('the tool call must be a JSON object with a "name" string')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return MalformedCall('"arguments" is a string that is not a JSON object', obj["name"])
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return MalformedCall('"arguments" must be a JSON object', obj["name"])
    return ToolCall(obj["name"], args)
