"""C++ in the sandbox (issue 18): g++ runs inside the sandbox, the binary in a fresh one per
case; hostile programs and compile-time bombs, through the `code` reward and directly.

As in test_sandbox_hostile.py, a run-time attack prints 3 only if it got through, so a
contained one scores 0; after each test nothing is left (processes with the marker, processes
of the sandbox uids, marker files, staging directories, connections to the test's server).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from grpokit.rewards import get_reward_funcs
from grpokit.sandbox import compile_program, run_binary, run_cpp, run_tests, score_many

HERE = Path(__file__).resolve().parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


H = _load("sandbox_hostile_programs_cpp", HERE / "test_sandbox_hostile.py")
C = _load("sandbox_cpp_programs", HERE / "cpp_programs.py")
hostile = H.hostile  # the fixture: marker, server, staging root, leftover checks

pytestmark = pytest.mark.skipif(not H.ROOT, reason="the namespaces level needs root")

GOOD = "#include <iostream>\nint main() { long long a, b; std::cin >> a >> b; std::cout << a + b << '\\n'; }\n"
CPP_INFO = {"language": "cpp", "test_cases": [H.CASE]}
FAST = {"compile_timeout": 20.0}


def cpp_completion(code: str, tag: str = "cpp") -> str:
    return f"Here is my solution.\n```{tag}\n{code}```\n"


def programs(h) -> dict:
    return C.runtime_programs(h.marker, h.port, H.PROJECT_FILE, H.HOME, str(H.REPO))


EXPECTED = {n: 0.0 for n in C.runtime_programs("m", 1, "p", "h", "r")} | {
    "solves_then_detaches": 1.0
}


def test_compile_and_run():
    c = compile_program(GOOD, **FAST)
    assert c.ok and c.binary.startswith(b"\x7fELF") and c.error == ""
    for a, b in ((1, 2), (-5, 10**15)):
        r = run_binary(c.binary, f"{a} {b}\n")
        assert (r.returncode, r.stdout, r.killed_reason) == (0, f"{a + b}\n", None)
    r = run_cpp("int main() { return 3; }", **FAST)
    assert r.returncode == 3 and r.killed_reason is None
    r = run_cpp("int main() { undeclared(); }", **FAST)
    assert r.killed_reason == "compile" and "undeclared" in r.stderr and "error" in r.stderr
    cases = [{"input": "1 2", "output": "3"}, {"input": "2 2", "output": "5"}]
    assert run_tests(GOOD, cases, language="c++", **FAST) == 0.5


def test_code_reward_cpp_rows():
    fn = get_reward_funcs([{"code": {"timeout": 3, "compile_timeout": 30}}])[0]
    cases = [{"input": f"{a} {b}\n", "output": f"{a + b}\n"} for a, b in ((1, 2), (40, 2), (7, 7))]
    info = {"language": "cpp", "test_cases": cases}
    half = '#include <cstdio>\nint main() { puts("3"); }\n'
    texts = [
        cpp_completion(GOOD),
        cpp_completion(GOOD, "c++"),
        cpp_completion("int main() { return 1; }") + "\nfixed:\n" + cpp_completion(GOOD),
        cpp_completion(GOOD) + "\nfinal:\n" + cpp_completion(half),  # the LAST block runs
        "```python\nprint(3)\n```",  # a Python block on a C++ row: no code
        cpp_completion("int main() { this is not C++ }"),
    ]
    infos = [info, json.dumps(info | {"language": "c++"}), info, info, info, info]
    out = fn(None, texts, verification_info=infos)
    assert out == [1.0, 1.0, 1.0, pytest.approx(1 / 3), 0.0, 0.0]
    # python and C++ rows in one call
    py = {"language": "python", "test_cases": cases}
    good_py = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert fn(None, [good_py, cpp_completion(GOOD)], verification_info=[py, info]) == [1.0, 1.0]
    binary = get_reward_funcs([{"binary_code": {"compile_timeout": 30}}])[0]
    assert binary(
        None, [cpp_completion(GOOD), cpp_completion(half)], verification_info=[info] * 2
    ) == [1.0, 0.0]


def test_hostile_cpp_through_the_code_reward(hostile):
    parent = os.getppid()  # 1 already when the suite runs detached (setsid, nohup)
    P = programs(hostile)
    names = list(P)
    fn = get_reward_funcs([{"code": {"timeout": 1.5, "compile_timeout": 30}}])[0]
    texts = [cpp_completion(P[n]) for n in names] + [cpp_completion(GOOD)]
    scores = fn(None, texts, verification_info=[CPP_INFO] * len(texts))
    assert dict(zip(names + ["good"], scores)) == EXPECTED | {"good": 1.0}
    assert hostile.leftovers() == {}
    assert os.getppid() == parent  # our parent was not killed (kill(getppid(), 9))


def test_hostile_cpp_without_seccomp(hostile):
    """The namespaces, uid and rlimits alone contain the C++ programs too."""
    P = programs(hostile)
    jobs = [(P[n], [H.CASE], "cpp") for n in P]
    scores = score_many(jobs, timeout=1.5, seccomp=False, compile_timeout=30)
    assert dict(zip(P, scores)) == EXPECTED
    assert hostile.leftovers() == {}


def test_cpp_attacks_fail_for_the_right_reason(hostile):
    P = programs(hostile)
    bins = {n: compile_program(P[n], compile_timeout=30) for n in P}
    assert all(c.ok for c in bins.values()), {n: c.error for n, c in bins.items() if not c.ok}

    def run(name, **kw):
        return run_binary(bins[name].binary, "1 2\n", **{"timeout": 3, **kw})

    assert run("loop").killed_reason in ("timeout", "SIGXCPU", "SIGKILL")
    assert run("sleep").timed_out
    r = run("memory_bomb", memory_mb=256)
    # std::bad_alloc -> abort(); the filter denies tgkill, so glibc's abort ends in SIGSEGV
    assert r.killed_reason == "SIGSEGV" and "bad_alloc" in r.stderr
    r = run("memory_bomb", memory_mb=256, seccomp=False)
    assert r.killed_reason == "SIGABRT" and "bad_alloc" in r.stderr
    assert run("huge_file").killed_reason == "SIGXFSZ"
    assert run("segfault").killed_reason == "SIGSEGV"
    r = run("gigabytes", max_output_bytes=50_000)
    assert r.killed_reason == "output" and len(r.stdout) == 50_000 and not r.timed_out
    for name in ("kill_parent", "kill_all", "network"):
        r = run(name)
        assert r.stdout == "" and r.returncode in (0, 1), (name, r)
    assert run("read_project").stdout == "0\n"
    assert run("compile_sees_project").stdout == "0\n"
    assert run("write_outside").stdout == "0\n"
    assert hostile.leftovers() == {}


def test_compile_time_bombs(hostile):
    """Each bomb ends with a clear status: the compiler killed by a limit, or a compile error;
    never a binary, and nothing left behind."""
    out = {}
    for name, src in C.compile_bombs().items():
        c = compile_program(src, compile_timeout=8, compile_memory_mb=512)
        out[name] = (c.ok, c.result.killed_reason, c.error)
    assert all(not ok for ok, _, _ in out.values()), out
    assert all(err.startswith(("compile error", "compiler killed")) for _, _, err in out.values())
    # the ones whose way of failing is certain
    assert "nested depth" in out["include_self"][2]
    assert "-ftemplate-depth" in out["template_depth"][2]
    assert (
        out["constexpr_cpu"][1] in ("timeout", "SIGXCPU", "SIGKILL")
        or "constexpr" in out["constexpr_cpu"][2]
    )
    assert hostile.leftovers() == {}


# ------------------------------------------------------------------ the fallback levels
F = _load("sandbox_fallback_cpp", HERE / "test_sandbox_fallback.py")
UID_HOLES = F.UID_HOLES | {"compile_sees_project": 1.0}  # world-readable: the compiler sees it


def test_uid_level(hostile):
    P = programs(hostile)
    jobs = [(P[n], [H.CASE], "cpp") for n in P]
    scores = score_many(jobs, timeout=1.5, isolation="uid", compile_timeout=30)
    assert dict(zip(P, scores)) == EXPECTED | UID_HOLES
    assert hostile.leftovers() == {}  # its files in /var/tmp removed, processes killed


NONE_PROGRAMS = [
    "loop", "fork_bomb", "memory_bomb", "huge_file", "network", "kill_parent", "kill_all",
    "detached_child", "solves_then_detaches", "gigabytes", "segfault",
]  # fmt: skip


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv to become non-root")
@pytest.mark.parametrize("level", ["userns", "none"])
def test_non_root_levels(hostile, level):
    """As a real unprivileged user: g++ and the programs under `userns` (the whole suite, as
    `namespaces`) and `none` (the attacks it is documented to stop)."""
    uid = F.sandbox.UID_BASE - 1
    work = tempfile.mkdtemp(prefix="grpokit-sbx-user-")
    os.chmod(work, 0o755)
    os.chown(work, uid, uid)
    P = programs(hostile)
    names = list(P) if level == "userns" else NONE_PROGRAMS
    job = {
        "isolation": level,
        "language": "cpp",
        "programs": {n: P[n] for n in names} | {"good": GOOD},
        "case": H.CASE,
        "timeout": 1.5,
        "detail": ["kill_parent", "good"],
    }
    try:
        out = F._as_user(uid, job, work)
        assert out["scores"] == {n: EXPECTED[n] for n in names} | {"good": 1.0}
        assert out["results"]["good"][:3] == [0, None, "3\n"]
        assert out["results"]["kill_parent"][2] == ""
        assert F.pids_of(uid) == [] and os.listdir(work) == []
        assert hostile.leftovers() == {}
    finally:
        F.kill_uid(uid)
        shutil.rmtree(work, ignore_errors=True)


def test_missing_compiler_is_an_error_not_a_zero(monkeypatch):
    from grpokit.sandbox import SandboxError
    from grpokit.sandbox import cpp as sandbox_cpp

    monkeypatch.setattr(sandbox_cpp, "CXX", "/nonexistent/g++")
    with pytest.raises(
        SandboxError, match="C\\+\\+ needs g\\+\\+, not found at /nonexistent/g\\+\\+"
    ):
        compile_program(GOOD)
    fn = get_reward_funcs(["code"])[0]
    with pytest.raises(SandboxError, match="install it"):
        fn(None, [cpp_completion(GOOD)], verification_info=[CPP_INFO])
