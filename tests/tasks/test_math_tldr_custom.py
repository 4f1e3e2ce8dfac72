"""math (math-verify grader), tldr (length grader) and custom (any table) tasks."""

import pytest

from grpokit.rewards import get_reward_funcs
from grpokit.tasks import TaskDataError, get_task


@pytest.fixture
def math_dir(tmp_path, write_jsonl):
    rows = [
        {
            "problem": "Half of 1?",
            "solution": "It is $\\boxed{\\frac12}$.",
            "answer": "\\frac{1}{2}",
            "generations": ["long"] * 3,
            "uuid": "a",
        },
        {"problem": "Root of 8?", "solution": "So $x=\\boxed{2\\sqrt{2}}$.", "answer": ""},
        {"problem": "No answer", "solution": "no latex here", "answer": None},
    ]
    write_jsonl(tmp_path / "train.jsonl", rows)
    return tmp_path


def test_math_rows(math_dir):
    rows = get_task("math", dataset_name=str(math_dir)).build("train")
    assert [r["solution"] for r in rows] == [
        "$\\frac{1}{2}$",
        "So $x=\\boxed{2\\sqrt{2}}$.",
        "no latex here",
    ]
    assert set(rows[0]) == {"prompt", "problem", "answer", "solution"}  # bulky columns dropped
    assert "\\boxed{}" in rows[0]["prompt"][0]["content"]


@pytest.mark.parametrize(
    "completion, i, ok",
    [
        ("<think>x</think><answer>\\boxed{0.5}</answer>", 0, True),
        ("so $\\boxed{\\dfrac{1}{2}}$", 0, True),
        ("the answer is 0.5", 0, False),  # no LaTeX answer, no anchor-less fallback
        ("$\\boxed{1/3}$", 0, False),
        ("$\\boxed{\\sqrt{8}}$", 1, True),  # gold from the solution's \\boxed
        ("$\\boxed{2.83}$", 1, False),
        ("$\\boxed{1}$", 2, False),  # unparseable gold: never correct
        ("", 0, False),
    ],
)
def test_math_grader(math_dir, completion, i, ok):
    t = get_task("math", dataset_name=str(math_dir))
    row = t.build("train")[i]
    assert t.is_correct(completion, row) is ok
    (accuracy,) = get_reward_funcs(t.default_reward_funcs)  # what the task trains on
    got = accuracy(prompts=[None], completions=[completion], solution=[row["solution"]])[0]
    assert (got == 1.0) is ok  # None (gold does not parse) is not correct either


def test_math_default_source_is_the_hub_id():
    t = get_task("math")
    assert t.source == "open-r1/OpenR1-Math-220k" and t.default_reward_funcs == ("accuracy",)


def test_tldr(tmp_path, write_jsonl):
    write_jsonl(
        tmp_path / "train.jsonl",
        [
            {"prompt": "POST: a\nTL;DR:", "completion": "c"},
            {"prompt": [{"role": "user", "content": "POST: b"}], "completion": "c"},
        ],
    )
    t = get_task("tldr", dataset_name=str(tmp_path), target_length=20, tolerance=2)
    rows = t.build("train")
    assert [r["prompt"] for r in rows] == [
        "POST: a\nTL;DR:",  # TRL's standard format: the string is the model input
        [{"role": "user", "content": "POST: b"}],  # conversational: through the chat template
    ]
    t_sys = get_task("tldr", dataset_name=str(tmp_path), system_prompt="Be brief.")
    assert t_sys.build("train")[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "POST: a\nTL;DR:"},
    ]
    assert rows[0]["target_length"] == 20
    assert t.is_correct("x" * 20, rows[0]) and t.is_correct(" " + "x" * 20 + "\n", rows[0])
    assert t.is_correct("x" * 18, rows[0])
    assert not t.is_correct("x" * 23, rows[0]) and not t.is_correct("", rows[0])
    # the length the reward measures: whitespace counts, as in the smoltldr tutorial
    assert not t.is_correct(" " + "x" * 22 + "\n", rows[0])
    (reward,) = get_reward_funcs(t.default_reward_funcs)
    texts = ["x" * n for n in range(15, 26)] + [" " + "x" * 19, "x" * 21 + "\n\n"]
    scores = reward(prompts=[None] * len(texts), completions=texts, target_length=[20] * len(texts))
    assert [t.is_correct(x, rows[0]) for x in texts] == [s >= -2 for s in scores]
    assert get_task("tldr").source == "mlabonne/smoltldr"
    with pytest.raises(TaskDataError, match="target_length"):
        get_task("tldr", target_length=0)


def test_custom_with_answer(tmp_path):
    (tmp_path / "qa.csv").write_text("q,a,topic,junk\nWhat is 2+2?,4,add,z\nAnd 3*3?,9,mul,z\n")
    t = get_task(
        "custom",
        dataset_name=str(tmp_path / "qa.csv"),
        prompt_column="q",
        answer_column="a",
        reward_columns=["topic"],
    )
    rows = t.build("train")
    assert rows[0]["answer"] == "4" and rows[0]["topic"] == "add" and "junk" not in rows[0]
    assert rows[0]["prompt"][-1] == {"role": "user", "content": "What is 2+2?"}
    assert t.default_reward_funcs == ("correctness", "xml_format")
    assert t.is_correct("<answer>4</answer>", rows[0])
    assert not t.is_correct("4", rows[0])
    correctness, xml_format = get_reward_funcs(t.default_reward_funcs)
    texts = [
        "<answer>4</answer>",
        "4",
        "<answer>$4.0</answer>",
        "<answer>4",
        "<answer>.4e1</answer>",
    ]
    scores = correctness(prompts=[None] * 5, completions=texts, answer=["4"] * 5)
    assert [t.is_correct(x, rows[0]) for x in texts] == [s > 0 for s in scores]
    texts = ["<reasoning>r</reasoning><answer>4</answer>", "<answer>4</answer>"]
    assert [t.is_formatted(x) for x in texts] == [
        s == 0.8 for s in xml_format(prompts=[None] * 2, completions=texts)
    ]


def test_custom_prompt_only_and_chat_prompts(tmp_path, write_jsonl):
    f = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"messages": [{"role": "user", "content": "hi"}]},
            {
                "messages": [
                    {"role": "system", "content": "mine"},
                    {"role": "user", "content": "yo"},
                ]
            },
        ],
    )
    t = get_task("generic", dataset_name=str(f), prompt_column="messages", system_prompt="S")
    rows = t.build("train")
    assert rows[0]["prompt"] == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi"},
    ]
    assert rows[1]["prompt"][0] == {"role": "system", "content": "mine"}
    assert t.default_reward_funcs == () and not t.is_correct("anything", rows[0])


def test_custom_errors(tmp_path, write_jsonl):
    with pytest.raises(TaskDataError, match="needs dataset_name"):
        get_task("custom")
    f = write_jsonl(tmp_path / "p.jsonl", [{"text": "hi"}])
    with pytest.raises(TaskDataError, match=r"lacks column\(s\) \['prompt'\]"):
        get_task("custom", dataset_name=str(f)).build("train")


def test_math_grader_works_off_the_main_thread(math_dir):
    import threading

    t = get_task("math", dataset_name=str(math_dir))
    row, out = t.build("train")[0], []
    th = threading.Thread(target=lambda: out.append(t.is_correct("$\\boxed{0.5}$", row)))
    th.start()
    th.join()
    assert out == [True]


DEMO = [
    {"role": "user", "content": "Using the numbers [1, 2], create an equation that equals 3."},
    {"role": "assistant", "content": "<think>1 + 2 = 3</think><answer>1 + 2</answer>"},
]


def test_every_task_takes_demonstrations_between_system_prompt_and_question(tmp_path, write_jsonl):
    """``demonstrations`` is a task_param of every task, not only arithmetic's."""
    cd = get_task("countdown", seed=0, count=3, max_number=9, target_range=[1, 20],
                  train_size=5, test_size=3, demonstrations=DEMO)  # fmt: skip
    plain = get_task("countdown", seed=0, count=3, max_number=9, target_range=[1, 20],
                     train_size=5, test_size=3)  # fmt: skip
    for row, ref in zip(cd.build("test"), plain.build("test")):
        assert row["prompt"] == [ref["prompt"][0], *DEMO, ref["prompt"][1]]
    # a plain-text prompt becomes chat messages, as it does with a system prompt
    f = write_jsonl(tmp_path / "p.jsonl", [{"messages": [{"role": "user", "content": "hi"}]},
                                           {"messages": [{"role": "system", "content": "m"},
                                                         {"role": "user", "content": "yo"}]},
                                           {"messages": "text"}])  # fmt: skip
    rows = get_task("generic", dataset_name=str(f), prompt_column="messages",
                    demonstrations=DEMO).build("train")  # fmt: skip
    assert rows[0]["prompt"] == [*DEMO, {"role": "user", "content": "hi"}]
    assert rows[1]["prompt"] == [{"role": "system", "content": "m"}, *DEMO,
                                 {"role": "user", "content": "yo"}]  # fmt: skip
    assert rows[2]["prompt"] == [*DEMO, {"role": "user", "content": "text"}]
    with pytest.raises(TaskDataError, match="task countdown: demonstrations"):
        get_task("countdown", demonstrations="1 + 2 = 3")


def test_a_dataset_row_asked_in_the_demonstrations_is_left_out(tmp_path, write_jsonl, caplog):
    """Like the generated tasks' draws: a row whose question is a demonstration's (its worked
    answer is in every prompt) is in no split, and the warning counts it."""
    rows = [{"question": f"What is {k} + {k}?", "answer": f"step #### {2 * k}"} for k in range(6)]
    d = tmp_path / "gsm"
    d.mkdir()
    write_jsonl(d / "train.jsonl", rows[:4])
    write_jsonl(d / "test.jsonl", rows[4:])
    demo = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "2"},
            {"role": "user", "content": "What is 5 + 5?"}, {"role": "assistant", "content": "10"}]  # fmt: skip
    task = get_task("gsm8k", dataset_name=str(d), demonstrations=demo)
    with caplog.at_level("WARNING", logger="grpokit"):
        train, test = task.build("train"), task.build("test")
    assert [r["question"] for r in train] == ["What is 0 + 0?", "What is 2 + 2?", "What is 3 + 3?"]
    assert [r["question"] for r in test] == ["What is 4 + 4?"]
    assert train[1]["prompt"][-1] == {"role": "user", "content": "What is 2 + 2?"}
    assert "1 row(s) of split 'train' left out" in caplog.text
    assert "1 row(s) of split 'test' left out" in caplog.text
    plain = get_task("gsm8k", dataset_name=str(d))
    assert len(plain.build("train")) == 4 and len(plain.build("test")) == 2
