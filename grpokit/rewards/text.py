"""Helpers shared by reward functions and graders."""

from __future__ import annotations

import re
from typing import Any

_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def completion_text(c: Any) -> str:
    """A completion as text, whether a string or a chat message list."""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "".join(
            m.get("content", "")
            for m in c
            if isinstance(m, dict) and m.get("role", "assistant") == "assistant"
        ) or (c[-1].get("content", "") if c and isinstance(c[-1], dict) else "")
    if isinstance(c, dict):
        return str(c.get("content", ""))
    return "" if c is None else str(c)


def last_tag_content(text: str, tag: str) -> str | None:
    """Content of the last ``<tag>...</tag>`` pair, stripped; None if there is none."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None


def parse_number(s: str | None) -> float | None:
    """``s`` as a single number ("1,000", "-3.5", "$72"), else None."""
    if s is None:
        return None
    t = s.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return float(t)
    except ValueError:
        return None


def last_number(text: str) -> float | None:
    found = _NUM.findall(text)
    return parse_number(found[-1]) if found else None
