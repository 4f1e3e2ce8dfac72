"""math-verify grading from any thread, with a hard time bound."""

import threading

from grpokit.rewards import get_reward_funcs
from grpokit.rewards.mathgrade import MathGrader

HANG = r"The answer is $\boxed{9^{9^{9^{9}}}}$"  # math-verify's own 5 s timeout fires on it


def test_accuracy_from_threads_is_correct():
    (acc,) = get_reward_funcs(["accuracy"])
    out = {}

    def work(i):
        out[i] = acc(None, [rf"so \boxed{{{i}}}", r"\boxed{0}"], solution=[f"${i}$"] * 2)

    threads = [threading.Thread(target=work, args=(i,)) for i in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert out == {1: [1.0, 0.0], 2: [1.0, 0.0], 3: [1.0, 0.0]}


def test_length_and_cosine_from_a_thread():
    (length, cosine) = get_reward_funcs(["length", "cosine"])
    out = []

    def work():
        out.append(length(None, [r"\boxed{1}", r"\boxed{1}xx"], solution=["$1$"] * 2))
        out.append(cosine(None, [""], solution=["$1$"]))

    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=120)
    assert out == [[0.5, -0.5], [0.0]]


def test_overrunning_sample_is_killed_scored_wrong_and_the_batch_goes_on():
    grader = MathGrader(hard_timeout=1.0)
    try:
        out = []
        jobs = [
            ("accuracy", r"\boxed{2}", "$2$"),
            ("accuracy", HANG, "$3$"),
            ("accuracy", r"\boxed{3}", "$3$"),
        ]
        t = threading.Thread(target=lambda: out.append(grader.grade(jobs)))
        t.start()
        t.join(timeout=120)
        assert out == [[1.0, 0.0, 1.0]]
        assert grader.restarts == 1
    finally:
        grader.close()
