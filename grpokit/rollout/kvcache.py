"""The key/value cache argument under the transformers versions grpokit accepts (>=5.0,<6).

transformers 5.24 renamed the model argument and output field ``past_key_values`` to
``cache`` (the old argument warns once and is to be removed in 5.40). grpokit passes the name
the installed version expects, so neither the warning nor the removal reaches a run."""

from __future__ import annotations

from importlib.metadata import version
from typing import Any


def _release(v: str) -> tuple[int, ...]:
    parts = []
    for p in v.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit()) or "0"  # "24rc1" -> 24
        parts.append(int(digits))
    return tuple(parts)


#: the model argument (and output field) that carries the cache in the installed transformers
CACHE_ARG = "cache" if _release(version("transformers")) >= (5, 24) else "past_key_values"


def cache_kwarg(cache: Any) -> dict[str, Any]:
    """``{CACHE_ARG: cache}``, to splat into a model call."""
    return {CACHE_ARG: cache}


def returned_cache(out: Any) -> Any:
    """The cache a model call with ``use_cache=True`` returned."""
    return getattr(out, CACHE_ARG)
