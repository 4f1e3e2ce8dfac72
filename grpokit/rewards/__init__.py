"""Reward functions: the contract, the registry, the built-ins and plugin loading.

    f(prompts, completions, **dataset_columns) -> list[float | None]

``get_reward_funcs`` turns a recipe's ``reward_funcs`` list into callables. Each entry is

- a registered name: ``"accuracy"``; a factory named alone uses its default parameters;
- ``{name: {param: value, ...}}`` for a factory's parameters: ``{"cosine": {"max_len": 500}}``;
- a plugin, ``"package.module:function"`` or ``"path/to/file.py:function"`` (also as a
  mapping key, in which case the function is a factory called with the parameters); a
  plugin that names a class (ms-swift's ORM style) is instantiated once, see ``plugins.py``;
- a reward model: a local directory of a sequence classifier (num_labels=1) or a hub id
  ``org/name`` that is not a registered reward, see ``reward_model.py``;
- a callable, used as is.

Every built-in's ``__name__`` is its registry name (metrics log as ``rewards/<name>/mean``).
See docs/rewards.md for each reward's formula, parameters and dataset columns.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from grpokit.rewards import arithmetic as _arithmetic  # noqa: F401  (registers the built-ins)
from grpokit.rewards import builtin as _builtin  # noqa: F401
from grpokit.rewards import code as _code  # noqa: F401
from grpokit.rewards import countdown as _countdown  # noqa: F401
from grpokit.rewards import openr1 as _openr1  # noqa: F401
from grpokit.rewards import reward_model as _reward_model
from grpokit.rewards.plugins import load_plugin, make_class_reward
from grpokit.rewards.registry import lookup, register_reward, registered_rewards
from grpokit.rewards.text import completion_text

__all__ = ["completion_text", "get_reward_funcs", "register_reward", "registered_rewards"]


def _is_plugin(spec: str) -> bool:
    return ":" in spec


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


def _build(name: str, params: Mapping[str, Any] | None, model_args: dict) -> Callable:
    if params is not None and not isinstance(params, Mapping):
        raise TypeError(
            f"reward {name!r}: parameters must be a mapping {{param: value}}, got {params!r}"
        )
    params = dict(params or {})
    if _is_plugin(name):
        fn, short = load_plugin(name), name.rpartition(":")[2]
        if inspect.isclass(fn):
            return make_class_reward(fn, short, params)
        return _call_factory(short, fn, params) if params else fn
    if name not in registered_rewards() and _reward_model.names_reward_model(name):
        if params:
            raise TypeError(f"reward model {name!r} takes no parameters (got {sorted(params)})")
        return _reward_model.load_reward_model(name, **model_args)
    fn, is_factory = lookup(name)
    if is_factory:
        return _call_factory(name, fn, params)
    if params:
        raise TypeError(f"reward {name!r} takes no parameters (got {sorted(params)})")
    return fn


def _processing_classes(specs: list, classes) -> list:
    """TRL's ``reward_processing_classes``: one per reward_funcs entry, or a single value."""
    if classes is None:
        return [None] * len(specs)
    if isinstance(classes, (list, tuple)):
        if len(classes) != len(specs):
            raise ValueError(
                f"reward_processing_classes has {len(classes)} entries but reward_funcs has "
                f"{len(specs)}; give one per reward function (null for non-models)"
            )
        return list(classes)
    return [classes] * len(specs)


def get_reward_funcs(
    specs: list,
    *,
    processing_classes=None,
    device: Any = "cpu",
    dtype: str = "float32",
    trust_remote_code: bool = False,
) -> list[Callable]:
    """One callable per spec: names, ``{name: {param: value}}``, plugins, reward models or
    callables. ``processing_classes`` (TRL's ``reward_processing_classes``: a list aligned
    with ``specs`` or one value for every reward model) overrides reward models' tokenizers;
    reward models load with ``dtype`` onto ``device``."""
    if isinstance(specs, (str, Mapping)) or callable(specs):
        specs = [specs]
    classes = _processing_classes(list(specs), processing_classes)
    single = not isinstance(processing_classes, (list, tuple))
    out = []
    for s, pc in zip(specs, classes):
        args = dict(processing_class=pc, device=device, dtype=dtype)
        args["trust_remote_code"] = trust_remote_code
        if callable(s):
            out.append(s)
        elif isinstance(s, Mapping):
            if len(s) != 1:
                raise ValueError(
                    f"reward spec {s!r}: write one reward per entry as {{name: {{param: value}}}}"
                )
            ((name, params),) = s.items()
            out.append(_build(str(name), params, args))
        elif isinstance(s, str):
            out.append(_build(s.strip(), None, args))
        else:
            raise TypeError(f"reward spec {s!r} must be a name, a mapping or a callable")
        if pc is not None and not single and not isinstance(out[-1], _reward_model.RewardModel):
            raise ValueError(
                f"reward_processing_classes gives {pc!r} for {s!r}, which is not a reward "
                "model; use null there"
            )
    if processing_classes is not None and single:
        if not any(isinstance(f, _reward_model.RewardModel) for f in out):
            raise ValueError(
                "reward_processing_classes is set but no reward_funcs entry is a reward model"
            )
    return out
