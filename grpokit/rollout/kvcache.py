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


def select_cache_rows(cache: Any, rows: Any) -> None:
    """Keep the cache rows ``rows`` (an index tensor; repeats allowed: one prompt's keys and
    values for each of its completions), differentiably and deterministically.
    transformers' ``batch_select_indices`` indexes (``keys[rows]``), whose backward adds the
    repeated rows' gradients with ``index_put_(accumulate=True)``: on CPU with two threads
    or more its float sums race (atomic adds), so a row gathered into both threads' halves
    gets a different gradient from run to run. ``index_select``'s backward sums in a fixed
    order."""
    layers = getattr(cache, "layers", None)
    if layers is None or not all(hasattr(ly, "keys") and hasattr(ly, "values") for ly in layers):
        cache.batch_select_indices(rows)
        return
    for ly in layers:
        if ly.keys is not None and ly.keys.numel():
            ly.keys = ly.keys.index_select(0, rows)
            ly.values = ly.values.index_select(0, rows)
