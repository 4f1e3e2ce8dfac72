"""Reward plugins: ``module:Name`` or ``path/to/file.py:Name`` entries of ``reward_funcs``.

``Name`` is looked up in the module, then (ms-swift's plugin files register their rewards
as ``orms['name'] = Class``) in the module's ``orms`` dict. What it names is

- a function: used as is, with the TRL contract ``f(prompts, completions, **columns)``;
- a class: instantiated once (with the entry's parameters, if any: ``{file.py:Name: {k: v}}``)
  and the instance is the reward. ms-swift's ORM classes, ``__call__(self, completions,
  **kwargs)``, are called as ms-swift calls them: the completions as strings, positionally,
  and as keywords every dataset column, ``messages`` (the prompt's messages followed by the
  completion as an assistant message), ``response_token_ids`` (also ``completion_ids``) and
  ``trainer_state`` (None here); no ``prompts``. A class whose ``__call__`` takes ``prompts``
  first is called with TRL's contract instead. An ``async def __call__`` is awaited.

An ms-swift plugin file imports ``ORM``/``AsyncORM``/``orms`` from ``swift.rewards`` (or
``swift.plugin`` in ms-swift 3). When ms-swift is not installed, grpokit lends the file those
three names (and only those) while it is imported, so such a file runs unchanged; a file that
needs more of ms-swift says so in a one-line error.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grpokit.rewards.text import completion_text

SWIFT_MODULES = ("swift", "swift.rewards", "swift.plugin", "swift.plugin.orm")


class ORM:
    """Stand-in for ms-swift's ORM base: ``__init__(args=None)``, ``__call__`` to override."""

    def __init__(self, args=None, **kwargs):
        self.args = args

    def __call__(self, completions, **kwargs) -> list[float]:
        raise NotImplementedError


class AsyncORM(ORM):
    """Stand-in for ms-swift's AsyncORM: an ``async def __call__``."""


@contextmanager
def swift_names() -> Iterator[None]:
    """While a plugin is imported: ``swift.rewards``/``swift.plugin`` with ``ORM``,
    ``AsyncORM`` and a fresh ``orms`` dict, unless a real ``swift`` package is installed."""
    if "swift" in sys.modules or importlib.util.find_spec("swift") is not None:
        yield
        return
    orms: dict[str, Any] = {}
    made = {name: types.ModuleType(name) for name in SWIFT_MODULES}
    for name, mod in made.items():
        mod.__path__ = []  # a package, so "swift.utils" fails as a missing submodule
        if name != "swift":
            mod.ORM, mod.AsyncORM, mod.orms = ORM, AsyncORM, orms
    made["swift"].rewards, made["swift"].plugin = made["swift.rewards"], made["swift.plugin"]
    sys.modules.update(made)
    try:
        yield
    finally:
        for name in made:
            sys.modules.pop(name, None)


def _import(target: str, spec: str) -> types.ModuleType:
    with swift_names():
        try:
            if not target.endswith(".py"):
                return importlib.import_module(target)
            path = Path(target).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"reward plugin file {str(path)!r} does not exist")
            name = f"grpokit_reward_plugin_{path.stem}"
            loaded = sys.modules.get(name)
            if loaded is not None and getattr(loaded, "__file__", None) == str(path):
                return loaded  # one import per file, however many entries name it
            mod_spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = mod  # so pickling and dataclasses inside the plugin work
            mod_spec.loader.exec_module(mod)
            return mod
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] == "swift" and e.name not in SWIFT_MODULES:
                raise ImportError(
                    f"reward plugin {spec!r} imports {e.name}, which needs ms-swift "
                    "(pip install ms-swift); without it grpokit lends plugins only "
                    "swift.rewards' ORM, AsyncORM and orms"
                ) from None
            if target.endswith(".py"):
                raise
            raise ImportError(f"reward plugin module {target!r} cannot be imported: {e}") from e


def load_plugin(spec: str) -> Callable | type:
    """The function or class ``spec`` (``module:Name`` / ``file.py:Name``) names."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise ValueError(f"reward plugin {spec!r}: write 'module:Name' or 'file.py:Name'")
    mod = _import(target, spec)
    obj = getattr(mod, name, None)
    registered = getattr(mod, "orms", None)
    if obj is None and isinstance(registered, dict):
        obj = registered.get(name)
    if not callable(obj):
        where = ", nor an entry of its orms dict" if isinstance(registered, dict) else ""
        raise AttributeError(
            f"reward plugin {spec!r}: {target} has no function {name!r} (or class{where})"
        )
    return obj


def _first_param(fn: Callable) -> str | None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    return params[0].name if params else None


def conversation(prompt, text: str) -> list[dict]:
    """The prompt's messages (a string prompt is one user message), then the completion."""
    msgs = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    return msgs + [{"role": "assistant", "content": text}]


class ClassReward:
    """An instance of a reward class, called with TRL's contract (see module doc)."""

    def __init__(self, obj: Any, name: str):
        self.obj, self.__name__ = obj, name
        self.swift_style = _first_param(obj.__call__) != "prompts"

    def __call__(self, prompts, completions, **columns) -> list:
        if not self.swift_style:
            out = self.obj(prompts=prompts, completions=completions, **columns)
        else:
            texts = [completion_text(c) for c in completions]
            kwargs = dict(columns)
            kwargs.setdefault("messages", [conversation(p, t) for p, t in zip(prompts, texts)])
            if "completion_ids" in kwargs:
                kwargs.setdefault("response_token_ids", kwargs["completion_ids"])
            kwargs.setdefault("trainer_state", None)
            out = self.obj(texts, **kwargs)
        if inspect.isawaitable(out):
            out = asyncio.run(out)
        return out


def make_class_reward(cls: type, name: str, params: dict[str, Any]) -> ClassReward:
    try:
        obj = cls(**params)
    except TypeError as e:
        raise TypeError(f"reward plugin class {name!r} cannot be made with {params}: {e}") from e
    if not callable(obj):
        raise TypeError(f"reward plugin class {name!r} has no __call__(self, completions, ...)")
    return ClassReward(obj, name)
