"""A recipe's ``tools`` (TRL's key): each entry a built-in tool's name (``calculator``,
``python``), ``module:function`` or ``path/to/file.py:function``. A tool's JSON schema, the
description its chat template shows the model, is made from the function's signature and
Google-style docstring by transformers' ``get_json_schema`` (as TRL and ``apply_chat_template``
make it)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ToolSpecError(ValueError):
    """A ``tools`` entry that names nothing usable; the message says which and why."""


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]


def _import(target: str, spec: str):
    if not target.endswith(".py"):
        try:
            return importlib.import_module(target)
        except ImportError as e:
            raise ToolSpecError(
                f"tool {spec!r}: module {target!r} cannot be imported: {e}"
            ) from None
    path = Path(target).expanduser().resolve()
    if not path.is_file():
        raise ToolSpecError(f"tool {spec!r}: file {str(path)!r} does not exist")
    name = f"grpokit_tool_file_{path.stem}"
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    mod_spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = mod
    mod_spec.loader.exec_module(mod)
    return mod


def load_object(spec: str, what: str = "tool") -> Any:
    """What ``module:Name`` / ``file.py:Name`` names."""
    target, _, name = str(spec).rpartition(":")
    if not target or not name:
        raise ToolSpecError(f"{what} {spec!r}: write 'module:name' or 'path/to/file.py:name'")
    obj = getattr(_import(target, spec), name, None)
    if obj is None:
        raise ToolSpecError(f"{what} {spec!r}: {target} has no {name!r}")
    return obj


def tool_schema(fn: Callable[..., Any], label: str) -> dict[str, Any]:
    """``fn``'s JSON schema (transformers' ``get_json_schema``); a one-line error naming
    what its signature or docstring lacks."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # DocstringParsingException, TypeHintParsingException
        raise ToolSpecError(
            f"tool {label!r}: no JSON schema from its signature and docstring ({e}); give every "
            "argument a type hint and a Google-style docstring with an Args: section"
        ) from None


def make_tool(fn: Callable[..., Any], label: str) -> Tool:
    if not callable(fn):
        raise ToolSpecError(f"tool {label!r} is a {type(fn).__name__}, not a function")
    schema = tool_schema(fn, label)
    return Tool(schema["function"]["name"], fn, schema)


def load_tools(specs: list[str] | None) -> list[Tool]:
    """The recipe's tools, in order; two tools of one name are refused."""
    from grpokit.tools.builtin import BUILTIN_TOOLS

    tools = []
    for spec in specs or []:
        fn = BUILTIN_TOOLS.get(spec) or load_object(spec)
        tools.append(make_tool(fn, spec))
    check_unique(tools)
    return tools


def check_unique(tools: list[Tool]) -> None:
    names = [t.name for t in tools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ToolSpecError(f"tools: two tools are named {dup}; each tool needs its own name")
