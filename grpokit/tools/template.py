"""The chat template's tool format: grpokit's ``chatml_tools`` template, the check that a
tokenizer's template can describe tools and render a tool call, and the tokens the rollout
injects after a tool call (the end of the assistant turn, the tool turn, the next
assistant header).

The tool-call convention grpokit parses is the widely used Hermes / Qwen2.5 one: the model
writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; results come back in a
user turn as ``<tool_response>...</tool_response>`` blocks (Qwen2.5 renders a ``tool`` message
that way). A template of another family (Llama 3.1's ``ipython`` role, Mistral's
``[TOOL_CALLS]``) renders calls differently and is refused by ``ToolFormat.check``.
"""

from __future__ import annotations

import json
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

# ChatML with tools, written for grpokit (SmolLM2-135M-Instruct's own template has no tool
# format). System turn: the first system message (or a default) and, with tools, their JSON
# schemas and how to call one. Assistant tool calls render as <tool_call> blocks after the
# content; consecutive tool messages become one user turn of <tool_response> blocks.
CHATML_TOOLS = (
    "{%- set msgs = messages -%}"
    "{%- if msgs and msgs[0]['role'] == 'system' -%}"
    "{%- set system = msgs[0]['content'] -%}{%- set msgs = msgs[1:] -%}"
    "{%- else -%}{%- set system = 'You are a helpful assistant.' -%}{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou can call the functions described (as JSON schemas, one per line)"
    " between <tools> and </tools>:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nTo call one, write its name and arguments as one JSON object between"
    " <tool_call> and </tool_call>, then stop; the result comes back between <tool_response> and"
    ' </tool_response>:\\n<tool_call>\\n{"name": "function name", "arguments": {"argument": '
    '"value"}}\\n</tool_call>\' -}}'
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for m in msgs -%}"
    "{%- if m['role'] == 'tool' -%}"
    "{%- if loop.first or msgs[loop.index0 - 1]['role'] != 'tool' -%}"
    "{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + (m['content'] | string) + '\\n</tool_response>' -}}"
    "{%- if loop.last or msgs[loop.index0 + 1]['role'] != 'tool' -%}"
    "{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif m['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (m['content'] or '') -}}"
    "{%- for call in (m['tool_calls'] or []) -%}"
    "{%- set f = call['function'] if call['function'] is defined else call -%}"
    "{%- if m['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' -}}"
    "{%- if f['arguments'] is string -%}{{- f['arguments'] -}}"
    "{%- else -%}{{- f['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# chat templates a recipe can name (chat_template: chatml_tools) instead of writing one out
NAMED_TEMPLATES = {"chatml_tools": CHATML_TOOLS}


def named_chat_template(value: str | None) -> str | None:
    """The template text of a recipe's ``chat_template``: a name of ``NAMED_TEMPLATES`` or
    the template itself (None: the tokenizer's own)."""
    if value is None:
        return None
    return NAMED_TEMPLATES.get(value.strip(), value)


class ToolFormatError(ValueError):
    """The chat template cannot describe tools or render a <tool_call>."""


def _render(tokenizer, messages, tools=None, generation_prompt=False) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
    )


def _call_message(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


class ToolFormat:
    """How the tokenizer's template renders tools, calls and results (Hermes convention)."""

    def __init__(self, tokenizer, schemas: list[dict[str, Any]], model: str = "the model"):
        self.tokenizer, self.schemas = tokenizer, schemas
        self.check(model)

    def check(self, model: str) -> None:
        """One-line ToolFormatError unless the template puts every tool's schema in the
        prompt, renders a call as a <tool_call> block and a tool message after it."""
        fix = (
            "set chat_template: chatml_tools in the recipe (grpokit's ChatML with Hermes/Qwen2.5 "
            "<tool_call> blocks) or give a template that renders `tools` and <tool_call>"
        )
        user = [{"role": "user", "content": "hi"}]
        steps = (
            ("cannot render tools", lambda: _render(self.tokenizer, user, self.schemas, True)),
            (
                "cannot render a tool call",
                lambda: _render(self.tokenizer, [*user, _call_message("f", {"x": 1})]),
            ),
            ("cannot render a tool message", lambda: self._injected_text("f", "r")),
        )
        out = []
        for what, render in steps:
            try:
                out.append(render())
            except Exception as e:  # a template that chokes on tools or tool messages
                raise ToolFormatError(
                    f"the chat template of {model} {what} ({type(e).__name__}: {e}); {fix}"
                ) from None
            if len(out) == 1:
                names = [s["function"]["name"] for s in self.schemas]
                missing = [n for n in names if n not in out[0]]
                if missing:
                    raise ToolFormatError(
                        f"the chat template of {model} has no tool format (the tools {missing} "
                        f"do not appear in the prompt it renders); {fix}"
                    )
            elif len(out) == 2 and (CALL_OPEN not in out[1] or CALL_CLOSE not in out[1]):
                raise ToolFormatError(
                    f"the chat template of {model} does not render tool calls as <tool_call> "
                    f"blocks, the format grpokit parses; {fix}"
                )

    def render_prompt(self, messages: list[dict[str, Any]]) -> str:
        """A prompt with the tools described, ending in the assistant header."""
        return _render(self.tokenizer, messages, self.schemas, True)

    def _injected_text(self, name: str, content: str) -> str:
        """What follows a model's ``</tool_call>``: the rest of its turn as the template
        closes it, the tool turn holding ``content``, and the next assistant header."""
        head = [{"role": "user", "content": "q"}, _call_message(name or "tool", {})]
        closed = _render(self.tokenizer, head)
        full = _render(
            self.tokenizer, [*head, {"role": "tool", "name": name, "content": content}], None, True
        )
        if not full.startswith(closed) or CALL_CLOSE not in closed:
            raise ToolFormatError("appending a tool message changes how the turns before it render")
        return closed[closed.rindex(CALL_CLOSE) + len(CALL_CLOSE) :] + full[len(closed) :]

    def injected_ids(self, name: str, content: str) -> list[int]:
        """The token ids of ``_injected_text`` (never trained on: tool_mask 0)."""
        text = self._injected_text(name, content)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def tool_content(result: Any) -> str:
    """A tool's return value as the text of its message: strings as they are, anything
    else as JSON (``str`` for what JSON cannot hold)."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)
