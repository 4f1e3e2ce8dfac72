"""Reward registry: names -> reward functions.

The contract is the ecosystem's (TRL, open-r1):

    f(prompts, completions, **dataset_columns) -> list[float | None]

``completions[i]`` is a string or a chat message list ``[{"role": "assistant",
"content": ...}]``; ``None`` means "does not apply to this sample". Extra keyword
arguments must be accepted and ignored (declare ``**kwargs``).

A plain reward is registered with ``@register_reward("name")``. A parametrised one is
registered as a factory with ``@register_reward("name", factory=True)``: the factory
takes keyword parameters and returns a reward function. In a recipe both are written
as a list entry, either ``name`` or ``{name: {param: value, ...}}``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

RewardFunc = Callable[..., list]

_REGISTRY: dict[str, tuple[Callable[..., Any], bool]] = {}


def register_reward(name: str, *, factory: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn`` under ``name`` (a reward, or a factory of rewards)."""

    def deco(fn: Callable) -> Callable:
        if name in _REGISTRY and _REGISTRY[name][0] is not fn:
            raise ValueError(f"reward {name!r} is registered twice")
        _REGISTRY[name] = (fn, factory)
        return fn

    return deco


def registered_rewards() -> list[str]:
    return sorted(_REGISTRY)


def lookup(name: str) -> tuple[Callable[..., Any], bool]:
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise KeyError(
            f"unknown reward function {name!r}{hint} Known: {', '.join(sorted(_REGISTRY))}; "
            "or give a plugin as 'module:function' or 'path/to/file.py:function', or a reward "
            "model's directory"
        )
    return _REGISTRY[name]
