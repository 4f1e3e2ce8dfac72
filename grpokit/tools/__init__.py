"""Tools and environments for multi-turn rollouts (docs/tools.md): ``schema`` (a recipe's
``tools`` -> functions + JSON schemas), ``template`` (the chat template's tool format,
``chatml_tools``), ``parse`` (a <tool_call> block -> a call), ``execute`` (a call -> the tool
message, under a time limit), ``environments`` (``environment_factory``), ``builtin``
(``calculator``, ``python``). The loop that uses them is ``grpokit/rollout/agent.py``."""

from grpokit.tools.environments import Environments
from grpokit.tools.execute import FAILURE_KINDS, Outcome, run_call
from grpokit.tools.parse import MalformedCall, ToolCall, parse_call, split_call
from grpokit.tools.schema import Tool, ToolSpecError, load_tools, make_tool
from grpokit.tools.template import (
    CHATML_TOOLS,
    ToolFormat,
    ToolFormatError,
    named_chat_template,
    tool_content,
)

__all__ = [
    "CHATML_TOOLS",
    "FAILURE_KINDS",
    "Environments",
    "MalformedCall",
    "Outcome",
    "Tool",
    "ToolCall",
    "ToolFormat",
    "ToolFormatError",
    "ToolSpecError",
    "load_tools",
    "make_tool",
    "named_chat_template",
    "parse_call",
    "run_call",
    "split_call",
    "tool_content",
]
