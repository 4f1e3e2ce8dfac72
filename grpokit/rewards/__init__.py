"""Reward functions: the contract, the registry, and the built-ins.

f(prompts, completions, **dataset_columns) -> list[float | None]
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpokit.rewards import builtin as _builtin  # noqa: F401  (registers the built-ins)
from grpokit.rewards import openr1 as _openr1  # noqa: F401
from grpokit.rewards.registry import lookup, register_reward, registered_rewards
from grpokit.rewards.text import completion_text

__all__ = ["completion_text", "get_reward_funcs", "register_reward", "registered_rewards"]


def _load_plugin(spec: str) -> Callable:
    target, _, func = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"reward plugin file {target!r} does not exist")
        mod_spec = importlib.util.spec_from_file_location(f"grpokit_plugin_{path.stem}", path)
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
    else:
        try:
            mod = importlib.import_module(target)
        except ImportError as e:
            raise ImportError(f"reward plugin module {target!r} cannot be imported: {e}") from e
    fn = getattr(mod, func, None)
    if not callable(fn):
        raise AttributeError(f"reward plugin {spec!r}: {target} has no function {func!r}")
    return fn


def _build(name: str, params: dict[str, Any]) -> Callable:
    fn, is_factory = lookup(name)
    if is_factory:
        sig = inspect.signature(fn)
        bad = [k for k in params if k not in sig.parameters]
        if bad:
            raise TypeError(
                f"reward {name!r} has no parameter(s) {bad}; it takes {list(sig.parameters)}"
            )
        made = fn(**params)
        made.__name__ = name
        return made
    if params:
        raise TypeError(f"reward {name!r} takes no parameters (got {sorted(params)})")
    return fn


def get_reward_funcs(specs: list) -> list[Callable]:
    """Names, ``{name: {param: value}}``, ``module:function`` / ``file.py:function`` or callables."""
    out = []
    for s in specs:
        if callable(s):
            out.append(s)
        elif isinstance(s, dict):
            if len(s) != 1:
                raise ValueError(
                    f"reward spec {s!r}: write one reward per entry as {{name: {{param: value}}}}"
                )
            ((name, params),) = s.items()
            out.append(_build(name, dict(params or {})))
        elif isinstance(s, str) and ":" in s:
            out.append(_load_plugin(s))
        elif isinstance(s, str):
            out.append(_build(s, {}))
        else:
            raise TypeError(f"reward spec {s!r} must be a name, a mapping or a callable")
    return out
