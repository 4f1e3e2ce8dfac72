"""Small text helpers the task graders share: answer tags and numbers."""

from __future__ import annotations

import re
from typing import Any

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_tag_content(text: str, tag: str = "answer") -> str | None:
    """Content of the last ``<tag>...</tag>`` pair (may span lines), stripped; None if none."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None


def parse_number(s: str | None) -> float | None:
    """``s`` as one number ("1,000", "-3.5", "$72", "72."), else None."""
    if s is None:
        return None
    t = s.strip().replace(",", "").replace("$", "").rstrip(".").strip()
    if not t or not re.fullmatch(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?", t):
        return None
    return float(t)


def last_number(text: str) -> float | None:
    """The last number written in ``text`` ("1,234" counts as 1234), else None."""
    found = NUMBER.findall(text)
    return parse_number(found[-1]) if found else None


def completion_text(c: Any) -> str:
    """A completion as text: a string, or chat messages ``[{"role": ..., "content": ...}]``."""
    if isinstance(c, str):
        return c
    if isinstance(c, dict):
        c = [c]
    return "".join(str(m.get("content", "")) for m in c or [] if isinstance(m, dict))
