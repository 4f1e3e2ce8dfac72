"""Helpers shared by reward functions: completion text, tag contents, numbers."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# One number as the GRPO-from-scratch tutorial finds them (-?\d*\.?\d+), extended so that
# thousands separators ("1,000") belong to the number.
_SINGLE_NUM = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d*\.?\d+)")
_MAX_DIGITS = 4000  # int() refuses more than 4300 digits


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: [{"type": "text", "text": ...}, ...]
        return "".join(str(p.get("text") or "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else str(content)


def completion_text(c: Any) -> str:
    """A completion as text: a string as is; a message list -> its assistant messages'
    contents joined (or the last message's content if none says role "assistant")."""
    if isinstance(c, str):
        return c
    if isinstance(c, dict):
        return _content_text(c.get("content"))
    if isinstance(c, (list, tuple)):
        msgs = [m for m in c if isinstance(m, dict)]
        mine = [m for m in msgs if m.get("role", "assistant") == "assistant"]
        if not mine and msgs:
            mine = msgs[-1:]
        return "".join(_content_text(m.get("content")) for m in mine)
    return "" if c is None else str(c)


def last_tag_content(text: str, tag: str) -> str | None:
    """Content of the last ``<tag>...</tag>`` pair, stripped; None if there is none."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
    return found[-1].strip() if found else None


def after_last_open_tag(text: str, tag: str) -> str | None:
    """The text after the last ``<tag>`` up to the next ``</tag>``, stripped; None when there
    is no ``<tag>`` or it is never closed (the GRPO-from-scratch tutorial's extraction)."""
    opened = f"<{tag}>"
    if opened not in text:
        return None
    rest = text.rsplit(opened, 1)[1]
    closed = f"</{tag}>"
    return rest.split(closed, 1)[0].strip() if closed in rest else None


def parse_number(s: str | None) -> float | None:
    """``s`` as a single number ("1,000", "-3.5", "$72"), else None."""
    if s is None:
        return None
    t = s.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return float(t)
    except ValueError:
        return None


def single_number(s: str) -> Fraction | None:
    """The one number written in ``s``, exactly (so 72.0 == 72 and 1,000 == 1000); None when
    ``s`` holds no number or more than one."""
    found = _SINGLE_NUM.findall(s)
    if len(found) != 1:
        return None
    t = found[0].replace(",", "")
    neg = t.startswith("-")
    whole, _, frac = t.lstrip("-").partition(".")
    if len(whole) + len(frac) > _MAX_DIGITS:
        return None
    value = Fraction(int(whole or "0")) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
    return -value if neg else value


def last_number(text: str) -> float | None:
    found = _NUM.findall(text)
    return parse_number(found[-1]) if found else None
