"""Hostile completions against the sandbox (issue 8), through the `code` reward.

Each program prints 3 (the answer its test case wants) only if its attack got through, so a
contained attack scores 0 through the reward, and an escape shows up as a score of 1. Besides
the score, every test checks what the attack would leave: processes (a marker in their
command line, and any process of the sandbox's uids), files (the marker in /tmp, /var/tmp,
/dev/shm, the project, the home directory, /), connections to a server on 127.0.0.1, the
sandbox's staging directories. The same programs run inside a training step in
test_sandbox_train.py and through the fallback levels in test_sandbox_fallback.py.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from grpokit.rewards import get_reward_funcs
from grpokit.sandbox import run_python, score_many
from grpokit.sandbox import sandbox_processes as sandbox_procs

REPO = Path(__file__).resolve().parents[2]  # the checkout (tests/sandbox/ is two down)
PROJECT_FILE = str(REPO / "pyproject.toml")
HOME = os.path.expanduser("~")
CASE = {"input": "1 2\n", "output": "3"}
GOOD = "a, b = map(int, input().split())\nprint(a + b)\n"
ROOT = os.geteuid() == 0


def hostile_programs(marker: str, port: int) -> dict[str, str]:
    P = {}
    P["loop"] = "while True:\n    pass\n"
    P["sleep"] = "import time\ntime.sleep(600)\nprint(3)\n"
    P["fork_bomb"] = textwrap.dedent("""\
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """)
    P["memory_bomb"] = "x = bytearray(3 << 30)\nx[-1] = 1\nprint(3)\n"
    P["huge_file"] = "with open('big', 'wb') as f:\n    f.write(b'0' * (100 << 20))\nprint(3)\n"
    P["read_project"] = f"print(3 if 'grpokit' in open({PROJECT_FILE!r}).read() else 0)\n"
    P["read_home"] = f"import os\nprint(3 if os.listdir({HOME!r}) else 0)\n"
    P["see_processes"] = (
        "import os\nprint(3 if sum(p.isdigit() for p in os.listdir('/proc')) > 10 else 0)\n"
    )
    # /tmp (its cwd) and /dev/shm are the program's own tmpfs in the namespace levels
    P["write_outside"] = textwrap.dedent(f"""\
        import os
        ok = []
        for d in ({str(REPO)!r}, {HOME!r}, '/var/tmp', '/dev/shm', '/tmp', '/'):
            try:
                with open(os.path.join(d, {marker!r} + '-file'), 'w') as f:
                    f.write('x')
                ok.append(d)
            except OSError:
                pass
        print(3 if [d for d in ok if d not in ('/tmp', '/dev/shm')] else 0)
        """)
    P["network"] = textwrap.dedent(f"""\
        import socket
        s = socket.create_connection(('127.0.0.1', {port}), timeout=2)
        s.sendall(b'{marker}')
        print(3)
        """)
    P["kill_parent"] = "import os\nos.kill(os.getppid(), 9)\nprint(3)\n"
    P["killpg_parent"] = "import os\nos.killpg(os.getpgid(os.getppid()), 9)\nprint(3)\n"
    P["kill_all"] = "import os\nos.kill(-1, 9)\n"  # kill -1 as the sandbox user
    P["prlimit_parent"] = (
        "import os, resource\n"
        "resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (3, 3))\nprint(3)\n"
    )
    P["raise_limits"] = textwrap.dedent("""\
        import resource
        raised = 0
        for r in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NPROC,
                  resource.RLIMIT_FSIZE):
            try:
                resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
                raised += 1
            except (ValueError, OSError):
                pass
        print(3 if raised else 0)
        """)
    detach = textwrap.dedent(f"""\
        import os, sys
        if os.fork() == 0:
            try:
                os.setsid()
            except OSError:
                pass
            if os.fork() == 0:
                os.execv(sys.executable,
                         [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])
            os._exit(0)
        """)
    P["detached_child"] = detach
    P["solves_then_detaches"] = detach + "print(3)\n"  # honest: it does answer
    P["gigabytes"] = (
        "import sys\nb = b'x' * (1 << 20)\nwhile True:\n    sys.stdout.buffer.write(b)\n"
    )
    P["stderr_gigabytes"] = P["gigabytes"].replace("stdout", "stderr")
    return P


# Scores under `namespaces` (and, below, the fallback levels' documented differences)
EXPECTED = {name: 0.0 for name in hostile_programs("m", 1)} | {"solves_then_detaches": 1.0}


def marker_pids(marker: str) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        out.append(int(p))
            except OSError:
                pass
    return out


def marker_files(marker: str) -> list[str]:
    dirs = ["/tmp", "/var/tmp", "/dev/shm", str(REPO), HOME, "/", tempfile.gettempdir()]
    return sorted({f for d in dirs for f in glob.glob(os.path.join(d, marker + "*"))})


class Hostile:
    """One test's marker, server, staging root, and the checks that nothing is left."""

    def __init__(self, stage: str):
        self.marker = "grpokit-hostile-" + uuid.uuid4().hex[:10]
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.server.setblocking(False)
        self.port = self.server.getsockname()[1]
        self.stage = stage
        self.programs = hostile_programs(self.marker, self.port)

    def connections(self) -> list[bytes]:
        got = []
        while True:
            try:
                conn, _ = self.server.accept()
            except BlockingIOError:
                return got
            conn.settimeout(1)
            try:
                got.append(conn.recv(100))
            except OSError:
                got.append(b"")
            conn.close()

    def leftovers(self, network_allowed: bool = False, grace: float = 3.0) -> dict:
        # A process that was SIGKILLed may still show in /proc for a moment while the kernel
        # tears it down (seen under load, ~1 run in 4 of the uid-level test); a process that
        # escaped the cleanup is still there after the grace period.
        end = time.monotonic() + grace
        while (marker_pids(self.marker) or sandbox_procs()) and time.monotonic() < end:
            time.sleep(0.05)
        left = {
            "processes": marker_pids(self.marker),
            "sandbox_uid_processes": sandbox_procs(),
            "files": marker_files(self.marker),
            "staging": os.listdir(self.stage),
        }
        conns = self.connections()
        if not network_allowed:
            left["connections"] = conns
        return {k: v for k, v in left.items() if v}

    def cleanup(self) -> None:
        for pid in marker_pids(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for f in marker_files(self.marker):
            os.unlink(f)
        self.server.close()
        shutil.rmtree(self.stage, ignore_errors=True)


@pytest.fixture
def hostile(monkeypatch):
    # world-traversable (the `uid` level's programs run inside it), removed afterwards
    stage = tempfile.mkdtemp(prefix="grpokit-sbx-test-")
    os.chmod(stage, 0o711)
    monkeypatch.setenv("GRPOKIT_SANDBOX_TMPDIR", stage)
    h = Hostile(stage)
    yield h
    h.cleanup()


def completion(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\n"


pytestmark = pytest.mark.skipif(not ROOT, reason="the namespaces level needs root")


def test_hostile_suite_through_the_code_reward(hostile):
    parent = os.getppid()  # 1 already when the suite runs detached (setsid, nohup)
    names = list(hostile.programs)
    fn = get_reward_funcs([{"code": {"timeout": 1.5}}])[0]
    texts = [completion(hostile.programs[n]) for n in names] + [completion(GOOD)]
    scores = fn(None, texts, verification_info=[{"test_cases": [CASE]}] * len(texts))
    assert dict(zip(names + ["good"], scores)) == EXPECTED | {"good": 1.0}
    assert hostile.leftovers() == {}
    assert os.getppid() == parent  # the caller (this process) is alive, its parent too


def test_hostile_suite_namespace_layer_without_seccomp(hostile):
    """The same suite with the syscall filter off: the namespaces, uid and rlimits alone
    contain it."""
    names = list(hostile.programs)
    jobs = [(hostile.programs[n], [CASE]) for n in names]
    scores = score_many(jobs, timeout=1.5, seccomp=False)
    assert dict(zip(names, scores)) == EXPECTED
    assert hostile.leftovers() == {}


@pytest.mark.parametrize("seccomp", [True, False])
def test_attacks_fail_for_the_right_reason(hostile, seccomp):
    P = hostile.programs

    def run(name, **kw):
        return run_python(P[name], "1 2\n", timeout=5, seccomp=seccomp, **kw)

    r = run("kill_parent")
    assert r.returncode == 1 and "PermissionError" in r.stderr
    r = run("prlimit_parent")
    assert r.returncode == 1 and "PermissionError" in r.stderr
    r = run("raise_limits")
    assert r.returncode == 0 and r.stdout == "0\n"
    r = run("network")
    assert r.returncode == 1
    assert ("PermissionError" if seccomp else "Network is unreachable") in r.stderr
    r = run("read_project")
    assert "FileNotFoundError" in r.stderr
    r = run("memory_bomb", memory_mb=256)
    assert "MemoryError" in r.stderr
    r = run("gigabytes", max_output_bytes=50_000)
    assert r.killed_reason == "output" and len(r.stdout) == 50_000 and not r.timed_out
    for name in ("detached_child", "solves_then_detaches"):
        r = run(name)
        assert r.returncode == 0 and not r.timed_out
        # gone at once: the namespace died with the program
        assert marker_pids(hostile.marker) == []
    assert hostile.leftovers() == {}
