"""grpokit.sandbox basics: limits, rewards, pool, the code task, what code inside can read.
Hostile programs: test_sandbox_hostile.py; fallback levels: test_sandbox_fallback.py; a
training step: test_sandbox_train.py; the 30 problems' reference solutions:
test_sandbox_references.py (all in tests/sandbox/)."""

import os
import resource
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from grpokit import sandbox
from grpokit.rewards import get_reward_funcs
from grpokit.sandbox import SandboxError, resolve_isolation, run_python, score_many
from grpokit.sandbox import run as sandbox_run
from grpokit.sandbox import sandbox_processes as sandbox_procs

CASES = [{"input": "1 2\n", "output": "3"}, {"input": "5 7\n", "output": "12"}]
INFO = {"language": "python", "test_cases": CASES}
ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]  # the checkout, wherever it is


def _run(code, **kw):
    kw.setdefault("timeout", 2)
    return run_python(code, **kw)


def test_correct_solution_through_reward():
    fn = get_reward_funcs(["code"])[0]
    good = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    half = "```python\nprint(3)\n```"
    bad = "```python\nprint(0)\n```"
    out = fn(None, [good, half, bad, "no code"], verification_info=[INFO] * 4)
    assert out == [1.0, 0.5, 0.0, 0.0]
    binary = get_reward_funcs(["binary_code"])[0]
    assert binary(None, [good, half], verification_info=[INFO] * 2) == [1.0, 0.0]


def test_reward_reads_json_column_and_last_block():
    fn = get_reward_funcs([{"code": {"timeout": 2}}])[0]
    two = "```python\nprint(0)\n```\nbetter:\n```python\nprint(sum(map(int, input().split())))\n```"
    import json

    assert fn(None, [two], verification_info=[json.dumps(INFO)]) == [1.0]
    with pytest.raises(ValueError, match="language 'rust' is not supported; use python or cpp"):
        fn(None, [two], verification_info=[{"language": "rust", "test_cases": CASES}])


@pytest.mark.skipif(not ROOT, reason="namespaces need root")
def test_auto_isolation_is_namespaces_here():
    assert resolve_isolation() == "namespaces"
    assert sandbox.sandbox_info()["seccomp"] is True
    r = _run(
        "import os\nprint(os.getcwd(), os.getuid(), sum(p.isdigit() for p in os.listdir('/proc')) <= 3)"
    )
    cwd, uid, few = r.stdout.split()
    assert cwd == "/tmp" and few == "True"
    assert sandbox.UID_BASE <= int(uid) < sandbox.UID_BASE + sandbox.UID_COUNT


def _read_inside(path) -> str:
    """What sandboxed code gets when it reads ``path``: its text, or the exception's name."""
    code = (
        "import os, sys\n"
        f"p = {str(path)!r}\n"
        "try:\n"
        "    print(repr(sorted(os.listdir(p)) if os.path.isdir(p) else open(p).read()))\n"
        "except Exception as e:\n"
        "    print(type(e).__name__)\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.skipif(not ROOT, reason="namespaces need root")
def test_code_inside_cannot_read_the_checkout_or_the_callers_temp_files(tmp_path):
    """The promise (docs/sandbox.md), checked by reading, not by a list of hidden
    directories: wherever this checkout is (/work, /home, /srv, or /tmp, which the sandbox
    replaces with its own tmpfs), code inside cannot read a file in it, nor this test's own
    source, nor a file in the caller's temp dir; and it sees /root, /var and the caller's
    home as empty. The files are world-readable, so only the mounts can stop the read: the
    error must be "not found", not "permission denied"."""
    token = uuid.uuid4().hex
    in_repo = REPO / f".grpokit-sbx-secret-{token}"
    in_tmp = tmp_path / "secret.txt"
    try:
        for path in (in_repo, in_tmp):
            path.write_text(token)
            path.chmod(0o644)
        for path in (Path(__file__).resolve(), in_repo, in_tmp):
            assert path.read_text()  # readable by this process...
            assert _read_inside(path) == "FileNotFoundError", path  # ...not from inside
        assert _read_inside(REPO) == "FileNotFoundError"
        for d in {"/root", "/var", os.path.expanduser("~")}:
            if os.path.isdir(d) and os.listdir(d):
                assert _read_inside(d) in ("[]", "FileNotFoundError"), d
    finally:
        in_repo.unlink(missing_ok=True)


def test_isolation_argument_checked():
    with pytest.raises(ValueError, match="choose one of"):
        resolve_isolation("chroot")
    if ROOT:
        for level in ("none", "userns"):  # the program would run as (namespace) root
            with pytest.raises(SandboxError, match="as root"):
                run_python("print(1)", isolation=level)


def test_infinite_loop_times_out():
    r = _run("while True: pass", timeout=1)
    assert r.timed_out and r.killed_reason == "timeout" and r.returncode == -9


def test_closed_pipes_do_not_end_the_clock():
    """A program that closes stdout/stderr and keeps running is still killed at the timeout."""
    r = _run("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(30)", timeout=1)
    assert r.timed_out


def test_fork_bomb_capped_and_cleaned():
    r = _run("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", timeout=1)
    assert r.timed_out
    assert sandbox_procs() == []  # gone when run_python returns, no waiting


def test_threads_fork_and_subprocess_still_work():
    code = (
        "import os, subprocess, sys, threading\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "pid = os.fork()\n"
        "if pid == 0: os._exit(7)\n"
        "print('child', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        "print(subprocess.run([sys.executable, '-c', 'print(5)'], capture_output=True).stdout)\n"
        "import multiprocessing as mp\n"
        "with mp.Pool(2) as pool: print(pool.map(abs, [-1, -2]))"
    )
    r = _run(code)
    assert r.stdout.split("\n")[:4] == ["thread", "child 7", "b'5\\n'", "[1, 2]"], r.stderr


def test_memory_bomb():
    r = _run("x = bytearray(2_000_000_000)\nprint('ok')", memory_mb=256)
    assert "ok" not in r.stdout and "MemoryError" in r.stderr


def test_huge_file():
    r = _run("open('f','wb').write(b'0' * 50_000_000)\nprint('ok')", max_file_mb=1)
    assert "ok" not in r.stdout and "File too large" in r.stderr


def test_big_stdin_round_trip():
    data = "x" * 3_000_000 + "\n"
    r = _run("import sys\nprint(len(sys.stdin.readline()))", stdin=data)
    assert r.stdout.strip() == str(len(data))


def test_gigabytes_of_output_are_cut_while_running():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = "import sys\nb = b'x' * (1 << 20)\nwhile True:\n    sys.stdout.buffer.write(b)"
    r = _run(code, timeout=20, max_output_bytes=100_000)
    assert r.killed_reason == "output" and not r.timed_out
    assert len(r.stdout) == 100_000
    r = _run(code.replace("stdout", "stderr"), timeout=20, max_output_bytes=100_000)
    assert r.killed_reason == "output" and len(r.stderr) == 100_000
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kb < 100_000  # never buffered the gigabytes in this process


def test_no_user_files(tmp_path):
    """Hidden by an allow-list, not a list of usual places: this checkout (wherever CI put
    it), and a world-readable directory at a top-level path nobody told the sandbox about."""
    paths = [str(REPO / "pyproject.toml")]
    made = None
    if ROOT:
        made = f"/grpokit-sbx-test-{os.getpid()}"
        os.makedirs(made, mode=0o755)
        with open(f"{made}/secret", "w") as f:
            f.write("grpokit secret")
        os.chmod(f"{made}/secret", 0o644)
        paths.append(f"{made}/secret")
    try:
        for path in paths:
            assert "grpokit" in open(path).read()  # readable by this process...
            r = _run(f"print(open({path!r}).read())")
            assert "grpokit" not in r.stdout and "FileNotFoundError" in r.stderr, path
        if made:
            assert made in sandbox.sandbox_info()["hidden"]
            r = _run("import os\nprint(sorted(os.listdir('/')))\nprint(os.listdir('/var'))")
            assert r.returncode == 0, r.stderr
    finally:
        if made:
            import shutil

            shutil.rmtree(made)


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
    r = _run("import os\nprint(dict(os.environ))")
    assert "hunter2" not in r.stdout and "PATH" in r.stdout


def test_pool_with_loops():
    good = "a, b = map(int, input().split())\nprint(a + b)"
    jobs = [(good, CASES)] * 4 + [("while True: pass", CASES[:1])] * 2 + [("x", [])]
    out = score_many(jobs, max_workers=2, timeout=1)
    assert out == [1.0] * 4 + [0.0] * 3


def test_pool_is_bounded(monkeypatch):
    """Never more sandboxes at once than workers."""
    running, peak, lock = [0], [0], threading.Lock()
    real = sandbox_run.run_program

    def counting(*a, **k):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            time.sleep(0.05)
            return real(*a, **k)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(sandbox_run, "run_program", counting)  # what score_many calls
    score_many([("print(3)", CASES)] * 4, max_workers=2)
    assert peak[0] == 2


def test_one_sandbox_run_per_program_reward_and_grader_agree(monkeypatch):
    """A group's identical completions run once; the task's grader (a step's accuracy) and
    the reward reuse one verdict; other limits, cases or isolation levels run again."""
    from grpokit.rewards import code as code_reward
    from grpokit.tasks import get_task

    ran = []
    real = code_reward.score_many

    def counting(jobs, **kw):
        ran.extend(j[0] for j in jobs)
        return real(jobs, **kw)

    monkeypatch.setattr(code_reward, "score_many", counting)
    good = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    bad = "```python\nprint(3)\n```"
    fn = get_reward_funcs(["code"])[0]
    assert fn(None, [good, bad, good, "no code", good], verification_info=[INFO] * 5) == [
        1.0, 0.5, 1.0, 0.0, 1.0,
    ]  # fmt: skip
    assert len(ran) == 2
    task = get_task("code")
    row = {"verification_info": INFO}
    assert task.is_correct(good, row) and not task.is_correct(bad, row)
    assert len(ran) == 2  # the grader reused the reward's verdicts
    assert get_reward_funcs([{"code": {"timeout": 2}}])[0](
        None, [good], verification_info=[INFO]
    ) == [1.0]
    other = {"test_cases": CASES[:1]}
    assert fn(None, [bad], verification_info=[other]) == [1.0]
    monkeypatch.setenv("GRPOKIT_SANDBOX_ISOLATION", "uid" if ROOT else "userns")
    assert fn(None, [bad], verification_info=[INFO]) == [0.5]
    assert len(ran) == 5
    monkeypatch.setattr(code_reward, "RECENT_SCORES", 1)
    fn(None, [good, bad, good], verification_info=[INFO] * 3)  # more than kept: still right
    assert len(code_reward._recent) == 1


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


def test_binary_code_threshold_is_open_r1s():
    """binary_code is 1.0 above a 0.99 pass rate (open-r1), not only at 1.0: 100 of 101."""
    from grpokit.rewards.code import binary_score

    cases = [{"input": f"{i}\n", "output": f"{i}\n"} for i in range(101)]
    wrong_once = "```python\ns = input()\nprint('x' if s == '0' else s)\n```"
    info = {"language": "python", "test_cases": cases}
    rate = get_reward_funcs(["code"])[0](None, [wrong_once], verification_info=[info])
    assert rate == [100 / 101]
    assert get_reward_funcs(["binary_code"])[0](None, [wrong_once], verification_info=[info]) == [
        1.0
    ]
    assert [binary_score(r) for r in (0.99, 0.9901, 1.0, 0.5)] == [0.0, 1.0, 1.0, 0.0]
