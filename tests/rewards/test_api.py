"""get_reward_funcs specs, names, errors, plugins; completion_text."""

import pytest

from grpokit.rewards import completion_text, get_reward_funcs, register_reward, registered_rewards
from grpokit.rewards.registry import lookup


def test_every_builtin_is_named_by_its_registry_name():
    for name in registered_rewards():
        if lookup(name)[0].__module__.startswith("grpokit.rewards"):
            (fn,) = get_reward_funcs([name])
            assert fn.__name__ == name


def test_spec_forms():
    def mine(prompts, completions, **kw):
        return [1.0] * len(completions)

    a, b, c, d = get_reward_funcs(["format", {"cosine": {"max_len": 10}}, {"cosine": None}, mine])
    assert (a.__name__, b.__name__, c.__name__, d) == ("format", "cosine", "cosine", mine)
    assert [f.__name__ for f in get_reward_funcs("accuracy")] == ["accuracy"]  # one spec


def test_errors_are_clear():
    with pytest.raises(KeyError, match="did you mean 'accuracy'"):
        get_reward_funcs(["acuracy"])
    with pytest.raises(TypeError, match=r"'cosine' has no parameter.*maxlen.*accepts.*max_len"):
        get_reward_funcs([{"cosine": {"maxlen": 3}}])
    with pytest.raises(TypeError, match="takes no parameters"):
        get_reward_funcs([{"format": {"x": 1}}])
    with pytest.raises(TypeError, match="mapping"):
        get_reward_funcs([{"cosine": [1, 2]}])
    with pytest.raises(ValueError, match="one reward per entry"):
        get_reward_funcs([{"format": None, "accuracy": None}])
    with pytest.raises(ValueError, match="max_len"):
        get_reward_funcs([{"cosine": {"max_len": "long"}}])
    with pytest.raises(TypeError, match="must be a name"):
        get_reward_funcs([3])


def test_plugin_from_file_and_module(tmp_path, monkeypatch):
    f = tmp_path / "my_rewards.py"
    f.write_text(
        "def shout(prompts, completions, **kw):\n"
        "    return [float(c.isupper()) for c in completions]\n"
        "def longer_than(n=3):\n"
        "    def f(prompts, completions, **kw):\n"
        "        return [float(len(c) > n) for c in completions]\n"
        "    return f\n"
    )
    (fn,) = get_reward_funcs([f"{f}:shout"])
    assert fn(prompts=["p", "p"], completions=["HI", "hi"]) == [1.0, 0.0]
    (fn,) = get_reward_funcs([{f"{f}:longer_than": {"n": 1}}])  # a plugin factory
    assert (fn.__name__, fn(None, ["a", "ab"])) == ("longer_than", [0.0, 1.0])
    monkeypatch.syspath_prepend(str(tmp_path))
    (fn,) = get_reward_funcs(["my_rewards:shout"])
    assert fn(None, ["OK"]) == [1.0]
    with pytest.raises(FileNotFoundError, match="nowhere.py"):
        get_reward_funcs(["nowhere.py:f"])
    with pytest.raises(ImportError, match="no_such_module_xyz"):
        get_reward_funcs(["no_such_module_xyz:f"])
    with pytest.raises(AttributeError, match="no function 'nope'"):
        get_reward_funcs([f"{f}:nope"])


def test_register_reward():
    @register_reward("test_api_const")
    def test_api_const(prompts, completions, **kw):
        return [0.5] * len(completions)

    assert "test_api_const" in registered_rewards()
    assert get_reward_funcs(["test_api_const"])[0](None, ["a"], anything=[1]) == [0.5]
    with pytest.raises(ValueError, match="twice"):
        register_reward("test_api_const")(lambda *a, **k: [])


@pytest.mark.parametrize(
    "c,text",
    [
        ("plain", "plain"),
        ([{"role": "assistant", "content": "a"}], "a"),
        ([{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}], "ab"),
        ([{"role": "tool", "content": "t"}, {"role": "assistant", "content": "a"}], "a"),
        ([{"role": "user", "content": "u"}], "u"),  # no assistant message: the last one
        ([{"content": "no role"}], "no role"),
        (
            [{"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "image"}]}],
            "x",
        ),
        ([{"role": "assistant", "content": None}], ""),
        ({"role": "assistant", "content": "d"}, "d"),
        ([], ""),
        (None, ""),
    ],
)
def test_completion_text(c, text):
    assert completion_text(c) == text
