"""Reading answers out of completions: the one place grpokit turns text into numbers.

Every grader -- the reward functions and the tasks' ``is_correct`` -- reads through these
helpers, so a completion means the same thing to the reward that trains on it and to the
accuracy that reports it. The number rules (docs/rewards.md, "Reading numbers"):

- a number is an optional ``-``, then digits with an optional decimal part (``19``,
  ``19.5``), or a decimal part alone (``.5`` is 0.5, ``-.25`` is -0.25);
- commas are thousands separators only between groups of three digits after a head of one to
  three digits (``1,234`` is 1234, ``1,234,567.5`` is 1234567.5); ``1,9`` is the two numbers 1
  and 9, not 19;
- digits touching an underscore are not a number (``1_000`` is a Python literal, not how
  numbers are written in text); words (``inf``, ``nan``, ``seven``) are not numbers;
- a whole answer (``parse_number``) may also carry ``$`` signs, a leading ``+``, a trailing
  period and an exponent (``1e3``); its value must be finite.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

# One number's digits: grouped thousands, plain digits with an optional fraction, or a
# fraction alone. The grouped form comes first so that "1,234" is one number.
_DIGITS = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
# A number inside running text: a digit run that touches a digit or "_" on either side is
# not a number (the look-behind sits after the sign, so "3-5" still reads -5 last).
NUMBER_IN_TEXT = re.compile(rf"-?(?<![\d_]){_DIGITS}(?![\d_])")
# A whole string that is one number (after "$" signs and a trailing period are removed).
_WHOLE_NUMBER = re.compile(rf"[-+]?{_DIGITS}(?:[eE][-+]?\d+)?")
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


def last_tag_content(text: str, tag: str = "answer") -> str | None:
    """Content of the last ``<tag>...</tag>`` pair (may span lines), stripped; None if none."""
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
    """``s`` as one finite number ("1,000", "-3.5", ".5", "$72", "72.", "1e3"), else None
    ("inf", "nan", "1_000", "1,9", "x = 5", "5 apples")."""
    if s is None:
        return None
    t = str(s).replace("$", "").strip().rstrip(".").strip()
    if not _WHOLE_NUMBER.fullmatch(t):
        return None
    value = float(t.replace(",", ""))
    return value if math.isfinite(value) else None


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (module rules), else None."""
    found = NUMBER_IN_TEXT.findall(text)
    return parse_number(found[-1]) if found else None


def single_number(s: str) -> Fraction | None:
    """The one number written in ``s`` (module rules), exactly (so 72.0 == 72 and 1,000 ==
    1000); None when ``s`` holds no number or more than one."""
    found = NUMBER_IN_TEXT.findall(s)
    if len(found) != 1:
        return None
    t = found[0].replace(",", "")
    neg = t.startswith("-")
    whole, _, frac = t.lstrip("-").partition(".")
    if len(whole) + len(frac) > _MAX_DIGITS:
        return None
    value = Fraction(int(whole or "0")) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
    return -value if neg else value
