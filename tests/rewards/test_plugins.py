"""Plugins in ms-swift's style: classes with __call__(self, completions, **kwargs), and files
that register them in an ``orms`` dict, as real files written by the tests."""

import sys
import textwrap

import pytest

from grpokit.rewards import get_reward_funcs
from grpokit.scoring import score

SWIFT_PLUGIN = """
import re
from typing import List

from swift.{where} import ORM, orms

CALLS = []
MADE = []


class CountdownORM(ORM):
    def __init__(self, args=None, **kwargs):
        super().__init__(args)
        MADE.append(self)

    def __call__(self, completions, target, nums, **kwargs) -> List[float]:
        CALLS.append(dict(completions=completions, target=target, nums=nums, **kwargs))
        out = []
        for c, t, ns in zip(completions, target, nums):
            m = re.search(r"<answer>(.*?)</answer>", c)
            eq = m.group(1).split("=")[0] if m else ""
            ok = sorted(int(x) for x in re.findall(r"\\d+", eq)) == sorted(ns)
            out.append(1.0 if m and ok and abs(eval(eq) - t) < 1e-5 else 0.0)
        return out


orms["external_countdown"] = CountdownORM
"""

PROMPTS = [
    [{"role": "system", "content": "Think first."}, {"role": "user", "content": "3 5 7 -> 22"}],
    [{"role": "user", "content": "1 2 3 -> 6"}],
]
TEXTS = ["<think>x</think><answer>3 * 5 + 7 = 22</answer>", "<answer>1 + 2 * 3</answer>"]
COLUMNS = {"nums": [[3, 5, 7], [1, 2, 3]], "target": [22, 6], "completion_ids": [[1, 2], [3]]}


def completions():
    return [[{"role": "assistant", "content": t}] for t in TEXTS]


def plugin_module(path):
    return sys.modules[f"grpokit_reward_plugin_{path.stem}"]


@pytest.mark.parametrize("where", ["rewards", "plugin"])  # ms-swift 4 and 3 import paths
def test_an_ms_swift_plugin_file_runs_unchanged(tmp_path, where):
    path = tmp_path / f"plugin_{where}.py"
    path.write_text(SWIFT_PLUGIN.format(where=where))
    by_key, by_class = get_reward_funcs([f"{path}:external_countdown", f"{path}:CountdownORM"])
    assert (by_key.__name__, by_class.__name__) == ("external_countdown", "CountdownORM")
    assert "swift" not in sys.modules  # the lent names are gone after the import
    rewards = score([by_key], PROMPTS, completions(), COLUMNS)
    assert rewards[:, 0].tolist() == [1.0, 0.0]  # 1 + 2*3 = 7, not 6
    mod = plugin_module(path)
    # called as ms-swift calls it: text completions, columns and messages, no prompts
    (call,) = mod.CALLS
    assert call["completions"] == TEXTS
    assert call["nums"] == COLUMNS["nums"] and call["target"] == COLUMNS["target"]
    assert call["messages"] == [p + c for p, c in zip(PROMPTS, completions())]
    assert call["response_token_ids"] == COLUMNS["completion_ids"]
    assert "trainer_state" in call and "prompts" not in call
    # instantiated once each, and reused across calls
    score([by_key], PROMPTS, completions(), COLUMNS)
    assert len(mod.MADE) == 2 and len(mod.CALLS) == 2


def test_module_class_with_parameters_and_string_prompts(tmp_path, monkeypatch):
    (tmp_path / "my_orms.py").write_text(
        textwrap.dedent(
            """
            class LengthORM:
                def __init__(self, scale=1.0):
                    self.scale = scale

                def __call__(self, completions, messages, **kwargs):
                    assert messages[0][0] == {"role": "user", "content": "q0"}
                    return [self.scale * len(c) for c in completions]
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    (fn,) = get_reward_funcs([{"my_orms:LengthORM": {"scale": 0.5}}])
    assert fn(prompts=["q0", "q1"], completions=["abcd", "ab"]) == [2.0, 1.0]
    with pytest.raises(TypeError, match="LengthORM.*cannot be made with"):
        get_reward_funcs([{"my_orms:LengthORM": {"scael": 0.5}}])


def test_async_orm_and_trl_style_classes(tmp_path):
    path = tmp_path / "more.py"
    path.write_text(
        textwrap.dedent(
            """
            from swift.rewards import AsyncORM

            class Slow(AsyncORM):
                async def __call__(self, completions, **kwargs):
                    return [float(len(c)) for c in completions]

            class TrlStyle:
                def __call__(self, prompts, completions, **kwargs):
                    return [float(p == "p") for p in prompts]
            """
        )
    )
    slow, trl = get_reward_funcs([f"{path}:Slow", f"{path}:TrlStyle"])
    assert slow(prompts=["p", "q"], completions=["abc", "a"]) == [3.0, 1.0]
    assert trl(prompts=["p", "q"], completions=["abc", "a"]) == [1.0, 0.0]


def test_plugin_mistakes_are_named(tmp_path):
    path = tmp_path / "needs_swift.py"
    path.write_text("from swift.utils import get_logger\n")
    with pytest.raises(ImportError, match="imports swift.utils, which needs ms-swift"):
        get_reward_funcs([f"{path}:X"])
    path = tmp_path / "plain.py"
    path.write_text("from swift.rewards import orms\norms['a'] = lambda completions, **k: []\n")
    with pytest.raises(
        AttributeError, match="no function 'b' .or class, nor an entry of its orms dict"
    ):
        get_reward_funcs([f"{path}:b"])
    assert "swift" not in sys.modules


@pytest.mark.parametrize(
    "entry, message",
    [
        ("[acuracy]", "config error: reward_funcs: unknown reward function 'acuracy'; did you"),
        ("[/no/such.py:f]", "config error: reward_funcs: reward plugin file '/no/such.py' does"),
        ("[my/model]", "model error: reward model 'my/model' is not a registered reward"),
    ],
)
def test_a_bad_entry_is_one_line_from_the_cli(tmp_path, capsys, entry, message):
    from grpokit.cli import main
    from grpokit.testing import make_tiny_model

    lm = make_tiny_model(tmp_path / "lm")
    capsys.readouterr()  # the saving progress bars
    argv = ["train", "--task", "arithmetic", "--reward_funcs", entry, "--reward_weights", "[1]"]
    argv += ["--model_name_or_path", str(lm), "--output_dir", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
