"""``environment_factory: module:Factory`` (TRL's key and interface).

The factory, called with no arguments, makes an environment: one per completion of a round.
Its hooks, as in TRL:

- ``reset(**row)`` (required): called when a completion starts, with the row's columns
  (the prompt included); a string it returns is appended to the last user message of that
  completion's prompt (None: the prompt as it is);
- every public method other than ``reset`` and ``get_reward`` is a tool the model can call
  (its signature and docstring are the schema, as for ``tools``); the environment answers
  each turn through them and keeps its own state;
- ``get_reward()`` (optional): the completion's reward from the environment's state once the
  conversation ended; it is one more reward function, named after the class, weight 1
  (``reward_weights`` covers ``reward_funcs`` only).

Reward functions also receive ``environments`` (one instance per completion). Instances are
made once and reused round after round (``reset`` starts each episode afresh), more made
when a round needs more.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from grpokit.tools.schema import Tool, ToolSpecError, load_object, make_tool

RESERVED = ("reset", "get_reward")


def _public_methods(env) -> list[tuple[str, Callable]]:
    return [
        (name, m)
        for name, m in inspect.getmembers(env, predicate=inspect.ismethod)
        if name not in RESERVED and not name.startswith("_")
    ]


class Environments:
    def __init__(self, spec: str | Callable[[], Any]):
        self.factory = load_object(spec, "environment_factory") if isinstance(spec, str) else spec
        self.name = str(spec) if isinstance(spec, str) else getattr(spec, "__name__", "factory")
        if not callable(self.factory):
            raise ToolSpecError(f"environment_factory {self.name!r} is not callable")
        probe = self._make()
        if not callable(getattr(probe, "reset", None)):
            raise ToolSpecError(
                f"environment_factory {self.name!r}: its environments need a reset(**row) method"
            )
        self.tools: list[Tool] = [
            make_tool(m, f"{self.name}.{n}") for n, m in _public_methods(probe)
        ]
        self.class_name = type(probe).__name__
        self.owns_reward = callable(getattr(probe, "get_reward", None))
        self.pool = [probe]

    def _make(self):
        try:
            return self.factory()
        except Exception as e:
            raise ToolSpecError(
                f"environment_factory {self.name!r} raised {type(e).__name__}: {e}"
            ) from e

    def take(self, n: int) -> list[Any]:
        """``n`` environments for a round's completions (the pool grows when needed)."""
        while len(self.pool) < n:
            self.pool.append(self._make())
        return self.pool[:n]

    @staticmethod
    def tools_of(env) -> dict[str, Callable]:
        return dict(_public_methods(env))

    def reward_function(self) -> Callable | None:
        """``get_reward`` of each completion's environment as a reward function, or None."""
        if not self.owns_reward:
            return None

        def reward(prompts=None, completions=None, environments=None, **_):
            return [e.get_reward() for e in environments]

        reward.__name__ = self.class_name
        return reward
