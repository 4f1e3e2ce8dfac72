"""Reward functions: the contract, the registry, the built-ins and plugin loading.

    f(prompts, completions, **dataset_columns) -> list[float | None]

``get_reward_funcs`` turns a recipe's ``reward_funcs`` list into callables. Each entry is

- a registered name: ``"accuracy"``; a factory named alone uses its default parameters;
- ``{name: {param: value, ...}}`` for a factory's parameters: ``{"cosine": {"max_len": 500}}``;
- a plugin, ``"package.module:function"`` or ``"path/to/file.py:function"`` (also as a
  mapping key, in which case the function is a factory called with the parameters);
- a callable, used as is.

Every built-in's ``__name__`` is its registry name (metrics log as ``rewards/<name>/mean``).
See docs/rewards.md for each reward's formula, parameters and dataset columns.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from grpokit.rewards import arithmetic as _arithmetic  # noqa: F401  (registers the built-ins)
from grpokit.rewards import builtin as _builtin  # noqa: F401
from grpokit.rewards import code as _code  # noqa: F401
from grpokit.rewards import countdown as _countdown  # noqa: F401
from grpokit.rewards import ioi as _ioi  # noqa: F401
from grpokit.rewards import openr1 as _openr1  # noqa: F401
from grpokit.rewards.registry import lookup, register_reward, registered_rewards
from grpokit.rewards.text import completion_text

__all__ = ["completion_text", "get_reward_funcs", "register_reward", "registered_rewards"]


def _is_plugin(spec: str) -> bool:
    return ":" in spec


def _load_plugin(spec: str) -> Callable:
    target, _, func = spec.rpartition(":")
    if not target or not func:
        raise ValueError(f"reward plugin {spec!r}: write 'module:function' or 'file.py:function'")
    if target.endswith(".py"):
        path = Path(target).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"reward plugin file {str(path)!r} does not exist")
        name = f"grpokit_reward_plugin_{path.stem}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = mod  # so pickling and dataclasses inside the plugin work
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


def _call_factory(name: str, factory: Callable, params: dict[str, Any]) -> Callable:
    sig = inspect.signature(factory)
    accepted = [p for p in sig.parameters if p not in ("args", "kwargs")]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    bad = sorted(k for k in params if k not in accepted)
    if bad and not takes_any:
        raise TypeError(f"reward {name!r} has no parameter(s) {bad}; it accepts {accepted}")
    made = factory(**params)
    if not callable(made):
        raise TypeError(
            f"reward {name!r}: its factory returned {type(made).__name__}, not a function"
        )
    try:
        made.__name__ = name
    except (AttributeError, TypeError):  # a callable object that will not take a name
        pass
    return made


def _build(name: str, params: Mapping[str, Any] | None) -> Callable:
    if params is not None and not isinstance(params, Mapping):
        raise TypeError(
            f"reward {name!r}: parameters must be a mapping {{param: value}}, got {params!r}"
        )
    params = dict(params or {})
    if _is_plugin(name):
        fn = _load_plugin(name)
        return _call_factory(name.rpartition(":")[2], fn, params) if params else fn
    fn, is_factory = lookup(name)
    if is_factory:
        return _call_factory(name, fn, params)
    if params:
        raise TypeError(f"reward {name!r} takes no parameters (got {sorted(params)})")
    return fn


def get_reward_funcs(specs: list) -> list[Callable]:
    """One callable per spec: names, ``{name: {param: value}}``, plugins or callables."""
    if isinstance(specs, (str, Mapping)) or callable(specs):
        specs = [specs]
    out = []
    for s in specs:
        if callable(s):
            out.append(s)
        elif isinstance(s, Mapping):
            if len(s) != 1:
                raise ValueError(
                    f"reward spec {s!r}: write one reward per entry as {{name: {{param: value}}}}"
                )
            ((name, params),) = s.items()
            out.append(_build(str(name), params))
        elif isinstance(s, str):
            out.append(_build(s.strip(), None))
        else:
            raise TypeError(f"reward spec {s!r} must be a name, a mapping or a callable")
    return out
