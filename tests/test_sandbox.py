import os
import socket
import time

from grpokit.rewards import get_reward_funcs
from grpokit.sandbox import run_python, score_many

CASES = [{"input": "1 2\n", "output": "3"}, {"input": "5 7\n", "output": "12"}]
INFO = {"language": "python", "test_cases": CASES}


def _run(code, **kw):
    return run_python(code, timeout=2, cpu_seconds=2, **kw)


def _nobody_procs():
    n = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if os.stat(f"/proc/{p}").st_uid == 65534:
                    n += 1
            except OSError:
                pass
    return n


def test_correct_solution_through_reward():
    fn = get_reward_funcs(["code"])[0]
    good = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    bad = "```python\nprint(0)\n```"
    assert fn(None, [good, bad, "no code"], verification_info=[INFO] * 3) == [1.0, 0.0, 0.0]


def test_infinite_loop_times_out():
    r = _run("while True: pass")
    assert r.timed_out and r.wall_time < 4


def test_fork_bomb_capped_and_cleaned():
    r = _run("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass")
    assert r.wall_time < 5
    deadline = time.monotonic() + 3
    while _nobody_procs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _nobody_procs() == 0


def test_memory_bomb():
    r = _run("x = bytearray(2_000_000_000)\nprint('ok')", memory_mb=256)
    assert "ok" not in r.stdout and r.returncode != 0


def test_huge_file():
    r = _run("open('f','wb').write(b'0' * 50_000_000)\nprint('ok')", max_file_mb=1)
    assert "ok" not in r.stdout


def test_no_user_files():
    r = _run("print(open('/work/main/pyproject.toml').read())")
    assert "grpokit" not in r.stdout


def test_no_network():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    r = _run(
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('ok')"
    )
    s.close()
    assert "ok" not in r.stdout


def test_env_secret(monkeypatch):
    monkeypatch.setenv("SECRET", "hunter2")
    r = _run("import os\nprint(os.environ)")
    assert "hunter2" not in r.stdout


def test_pool_with_loops():
    good = "a, b = map(int, input().split())\nprint(a + b)"
    jobs = [(good, CASES)] * 4 + [("while True: pass", CASES[:1])] * 2
    t0 = time.monotonic()
    out = score_many(jobs, max_workers=2, timeout=1, cpu_seconds=1)
    assert out == [1.0] * 4 + [0.0] * 2
    assert time.monotonic() - t0 < 8


def test_code_task_splits_and_grader():
    from grpokit.tasks import get_task

    task = get_task("code")
    train, test = task.build("train"), task.build("test")
    assert len(train) + len(test) == 30 and len(test) == 6
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert all(2 <= len(r["verification_info"]["test_cases"]) <= 4 for r in train + test)
    row = next(r for r in train + test if r["id"] == "code-00")
    good = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert task.is_correct(good, row) and not task.is_correct("print(3)", row)
