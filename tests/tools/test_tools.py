"""The tools room: a recipe's tools -> schemas, <tool_call> parsing, running a call under a
time limit with every failure a tool message, the chat template's tool format."""

import json
import threading
from pathlib import Path

import pytest

from grpokit.tools import (
    CHATML_TOOLS,
    MalformedCall,
    ToolCall,
    ToolFormat,
    ToolFormatError,
    ToolSpecError,
    load_tools,
    named_chat_template,
    parse_call,
    run_call,
    split_call,
)
from grpokit.tools.builtin import calculator

KIT = Path(__file__).parent / "_toolkit.py"


# ------------------------------------------------------------------ parsing
def test_split_and_parse_a_call():
    text = (
        'Let me compute.<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    )
    before, body = split_call(text)
    assert before == "Let me compute."
    assert parse_call(body) == ToolCall("add", {"a": 2, "b": 3})
    # arguments written as a JSON string, and no arguments at all
    assert parse_call('{"name": "add", "arguments": "{\\"a\\": 1}"}') == ToolCall("add", {"a": 1})
    assert parse_call('{"name": "now"}') == ToolCall("now", {})


@pytest.mark.parametrize(
    "body, why",
    [
        ('{"name": "add", "arguments": {"a": 2', "not valid JSON"),
        ('["add"]', '"name" string'),
        ('{"arguments": {}}', '"name" string'),
        ('{"name": "add", "arguments": [1, 2]}', "must be a JSON object"),
        ('{"name": "add", "arguments": "a=1"}', "not a JSON object"),
        (None, "without an opening"),
    ],
)
def test_malformed_calls_say_why(body, why):
    out = parse_call(body)
    assert isinstance(out, MalformedCall) and why in out.why


def test_no_opening_tag():
    before, body = split_call('{"name": "add"}</tool_call>')
    assert body is None and before == '{"name": "add"}'


# ------------------------------------------------------------------ executing
def _tools():
    return {t.name: t.fn for t in load_tools([f"{KIT}:add", f"{KIT}:broken", f"{KIT}:slow"])}


def test_a_call_runs_and_its_result_is_the_message():
    out = run_call(ToolCall("add", {"a": 40, "b": 2}), _tools(), timeout=5)
    assert (out.name, out.content, out.failure) == ("add", "42", None)


@pytest.mark.parametrize(
    "call, kind, text",
    [
        (MalformedCall("the tool call is not valid JSON"), "malformed", "not valid JSON"),
        (ToolCall("mul", {"a": 1}), "unknown", "no tool named 'mul'"),
        (ToolCall("broken", {"x": 7}), "raised", "RuntimeError: broken on 7"),
        (ToolCall("add", {"a": 1, "c": 2}), "raised", "TypeError"),
        (ToolCall("slow", {"seconds": 30}), "timeout", "did not finish within 0.3 s"),
    ],
)
def test_every_failure_is_a_tool_message(call, kind, text):
    out = run_call(call, _tools(), timeout=0.3)
    assert out.failure == kind
    assert text in json.loads(out.content)["error"]


def test_timeout_outside_the_main_thread():
    box = {}
    t = threading.Thread(
        target=lambda: box.update(out=run_call(ToolCall("slow", {"seconds": 5}), _tools(), 0.2))
    )
    t.start()
    t.join(10)
    assert box["out"].failure == "timeout"


def test_calculator():
    assert calculator("(12 + 3) * 4") == "60"
    assert calculator("7 / 2") == "3.5"
    assert calculator("-2 ** 10") == "-1024"
    for bad in ("__import__('os')", "9 ** 9 ** 9", "x + 1"):
        out = run_call(ToolCall("calculator", {"expression": bad}), {"calculator": calculator}, 5)
        assert out.failure == "raised", bad


# ------------------------------------------------------------------ tools from a recipe
def test_load_tools_schemas():
    tools = load_tools(["calculator", f"{KIT}:add", "grpokit.tools.builtin:python"])
    assert [t.name for t in tools] == ["calculator", "add", "python"]
    add = tools[1].schema["function"]
    assert add["description"] == "Add two integers."
    assert add["parameters"]["properties"]["a"] == {
        "type": "integer",
        "description": "The first integer.",
    }
    assert add["parameters"]["required"] == ["a", "b"]


@pytest.mark.parametrize(
    "spec, text",
    [
        ("nope", "write 'module:name'"),
        ("no_such_module_xyz:f", "cannot be imported"),
        ("/no/such/file.py:f", "does not exist"),
        (f"{KIT}:missing", "has no 'missing'"),
        (f"{KIT}:no_docstring", "Google-style docstring"),
    ],
)
def test_bad_tool_entries_are_one_line(spec, text):
    with pytest.raises(ToolSpecError) as e:
        load_tools([spec])
    assert text in str(e.value) and "\n" not in str(e.value)


def test_two_tools_of_one_name_are_refused():
    with pytest.raises(ToolSpecError, match="two tools are named"):
        load_tools(["calculator", "grpokit.tools.builtin:calculator"])


# ------------------------------------------------------------------ the template
def test_chatml_tools_renders_tools_calls_and_results():
    from grpokit.testing import make_tokenizer

    tok = make_tokenizer()
    tok.chat_template = named_chat_template("chatml_tools")
    assert tok.chat_template == CHATML_TOOLS
    tools = load_tools(["calculator"])
    fmt = ToolFormat(tok, [t.schema for t in tools])
    prompt = fmt.render_prompt([{"role": "user", "content": "What is 2+3?"}])
    assert json.dumps(tools[0].schema) in prompt
    assert prompt.endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    call = {
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "2+3"}},
    }
    convo = [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "calculator", "content": "5"},
        {"role": "tool", "name": "calculator", "content": "6"},
        {"role": "assistant", "content": "It is 5."},
    ]
    text = tok.apply_chat_template(convo, tokenize=False)
    assert text.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}'
        "\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
        "<tool_response>\n6\n</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 5.<|im_end|>\n"
    )
    expected = "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert (
        fmt.injected_ids("calculator", "5") == tok(expected, add_special_tokens=False)["input_ids"]
    )


def test_a_template_without_tool_format_names_the_way_out():
    from grpokit.testing import make_tokenizer

    tok = make_tokenizer()  # plain ChatML: ignores tools
    with pytest.raises(ToolFormatError) as e:
        ToolFormat(tok, [t.schema for t in load_tools(["calculator"])], "tiny")
    msg = str(e.value)
    assert "has no tool format" in msg and "chat_template: chatml_tools" in msg and "\n" not in msg


def test_the_python_tool_runs_in_the_sandbox():
    """Model-written code goes through grpokit.sandbox; its own failure is the tool's
    answer (the model reads it), not a failed call."""
    from grpokit.tools.builtin import python

    box = {"python": python}
    assert run_call(ToolCall("python", {"code": "print(6 * 7)"}), box, 30).content == "42\n"
    out = run_call(ToolCall("python", {"code": "print(1)\n1 / 0"}), box, 30)
    assert out.failure is None
    assert out.content.startswith("1\n") and "[stopped: exit status 1]" in out.content
    assert "ZeroDivisionError" in out.content


def test_an_async_tool_is_awaited():
    import asyncio

    async def double(x: int) -> int:
        """Double a number.

        Args:
            x: The number.
        """
        await asyncio.sleep(0)
        return 2 * x

    tools = {"double": double}
    assert run_call(ToolCall("double", {"x": 21}), tools, 5).content == "42"
