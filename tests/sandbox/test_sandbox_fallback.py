"""The sandbox's fallback levels (docs/sandbox.md), forced on this machine:

- ``uid``: what a root process gets without working namespaces (forced with
  ``isolation="uid"`` or ``GRPOKIT_SANDBOX_ISOLATION=uid``);
- ``userns`` and ``none``: what a non-root user gets, with and without unprivileged user
  namespaces; run for real from a helper process that this test starts as an unprivileged uid.

Each runs the basic and the hostile programs of test_sandbox_hostile.py; the expected
scores include the documented holes (1.0 = the attack got through) so the docs stay true.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import grpokit
from grpokit import sandbox
from grpokit.rewards import get_reward_funcs
from grpokit.sandbox import run_python, score_many
from grpokit.sandbox.reap import kill_uid, pids_of

ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(not ROOT, reason="forcing the fallbacks needs root")

_spec = importlib.util.spec_from_file_location(
    "sandbox_hostile_programs", Path(__file__).with_name("test_sandbox_hostile.py")
)
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)
hostile = H.hostile  # the fixture

# What gets through each fallback (1.0), as docs/sandbox.md says:
UID_HOLES = {
    "read_project": 1.0,  # files readable by everyone stay readable
    "see_processes": 1.0,  # /proc shows every process
    "write_outside": 1.0,  # /var/tmp, /dev/shm are writable (and cleaned up afterwards)
}


def test_uid_level_through_the_reward_and_env_var(hostile, monkeypatch):
    monkeypatch.setenv("GRPOKIT_SANDBOX_ISOLATION", "uid")
    assert run_python("print(1)").isolation == "uid"
    names = list(hostile.programs)
    fn = get_reward_funcs([{"code": {"timeout": 1.5}}])[0]
    texts = [H.completion(hostile.programs[n]) for n in names] + [H.completion(H.GOOD)]
    scores = fn(None, texts, verification_info=[{"test_cases": [H.CASE]}] * len(texts))
    assert dict(zip(names + ["good"], scores)) == H.EXPECTED | UID_HOLES | {"good": 1.0}
    # the files it wrote to /var/tmp and /dev/shm were removed, its processes killed
    assert hostile.leftovers() == {}


def test_uid_level_without_seccomp(hostile):
    """Without the filter: the network is open (documented), processes and files are still
    cleaned up by uid, the caller is still out of reach."""
    names = [
        "fork_bomb", "network", "kill_parent", "killpg_parent", "kill_all", "prlimit_parent",
        "raise_limits", "detached_child", "solves_then_detaches", "write_outside", "gigabytes",
    ]  # fmt: skip
    jobs = [(hostile.programs[n], [H.CASE]) for n in names]
    scores = score_many(jobs, timeout=1.5, isolation="uid", seccomp=False)
    holes = UID_HOLES | {"network": 1.0}
    assert dict(zip(names, scores)) == {n: (H.EXPECTED | holes)[n] for n in names}
    assert hostile.connections() == [hostile.marker.encode()]
    assert hostile.leftovers() == {}


def test_uid_level_detached_child_gone_at_return(hostile):
    for seccomp in (True, False):
        r = run_python(hostile.programs["solves_then_detaches"], isolation="uid", seccomp=seccomp)
        assert r.stdout == "3\n", r  # the Result (stderr, status) says why when it fails
        assert H.marker_pids(hostile.marker) == [] and H.sandbox_procs() == []


# ------------------------------------------------ non-root: `userns` and `none`, as a real user

_HELPER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])  # the directory holding grpokit/ (standard library only)
import grpokit.sandbox as sbx
job = json.load(sys.stdin)
level = job["isolation"]
out = {"auto": sbx.resolve_isolation(), "info": sbx.sandbox_info(level), "scores": {}, "results": {}}
lang = job.get("language", "python")
jobs = [(code, [job["case"]], lang) for code in job["programs"].values()]
scores = sbx.score_many(jobs, timeout=job["timeout"], isolation=level)
out["scores"] = dict(zip(job["programs"], scores))
run = sbx.run_cpp if lang == "cpp" else sbx.run_python
for name in job["detail"]:
    r = run(job["programs"][name], job["case"]["input"], timeout=job["timeout"],
            isolation=level)
    out["results"][name] = [r.returncode, r.killed_reason, r.stdout[-300:], r.stderr[-300:]]
print(json.dumps(out))
"""

CAPS = "print(''.join(ln for ln in open('/proc/self/status') if ln[:7] in ('CapEff:', 'Seccomp')))"


def _traversable(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [path, *path.parents])


def _as_user(uid: int, job: dict, work: str) -> dict:
    src = Path(grpokit.__file__).resolve().parents[1]
    env = {"PATH": "/usr/bin:/bin", "HOME": work, "GRPOKIT_SANDBOX_TMPDIR": work}
    p = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        + [sandbox.PYTHON, "-I", "-c", _HELPER, str(src)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
        timeout=120,
    )
    # the helper (the sandbox's parent) survived every attack and reported
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


NONE_PROGRAMS = [
    "loop", "fork_bomb", "memory_bomb", "huge_file", "network", "kill_parent", "killpg_parent",
    "kill_all", "prlimit_parent", "raise_limits", "detached_child", "solves_then_detaches",
    "gigabytes",
]  # fmt: skip


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv to become non-root")
@pytest.mark.parametrize("level", ["userns", "none"])
def test_non_root_levels_as_a_real_unprivileged_user(hostile, level):
    """`userns` (what `auto` picks for a non-root user where unprivileged user namespaces
    work, as here) runs the whole suite like `namespaces`; `none` the attacks it is
    documented to stop (with the filter)."""
    if not _traversable(Path(sandbox.__file__).resolve().parent):
        pytest.skip("grpokit's source is not readable by other users")
    uid = sandbox.UID_BASE - 1  # unused by anything else, so leftovers are attributable
    work = tempfile.mkdtemp(prefix="grpokit-sbx-user-")
    os.chmod(work, 0o755)
    os.chown(work, uid, uid)
    names = list(hostile.programs) if level == "userns" else NONE_PROGRAMS
    job = {
        "isolation": level,
        "programs": {n: hostile.programs[n] for n in names} | {"good": H.GOOD, "caps": CAPS},
        "case": H.CASE,
        "timeout": 1.5,
        "detail": ["kill_parent", "kill_all", "network", "gigabytes", "caps"],
    }
    try:
        out = _as_user(uid, job, work)
        assert out["auto"] == "userns"
        assert out["info"]["isolation"] == level and out["info"]["seccomp"] is True
        assert out["scores"] == {n: H.EXPECTED[n] for n in names} | {"good": 1.0, "caps": 0.0}
        res = out["results"]
        assert res["kill_parent"][0] == 1 and "PermissionError" in res["kill_parent"][3]
        assert res["kill_all"][0] == 1 and "PermissionError" in res["kill_all"][3]
        assert "PermissionError" in res["network"][3]
        assert res["gigabytes"][1] == "output"
        caps = dict(ln.split(":", 1) for ln in res["caps"][2].splitlines() if ":" in ln)
        assert caps["CapEff"].strip() == "0000000000000000"  # root of its namespace only
        assert caps["Seccomp"].strip() == "2"
        assert H.marker_pids(hostile.marker) == []
        assert pids_of(uid) == []
        assert os.listdir(work) == []  # staging directories removed
        assert hostile.leftovers() == {}
    finally:
        kill_uid(uid)
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("tools", ["setpriv", "forked"])
def test_kill_uid_reaches_detached_processes_of_the_uid(tools, monkeypatch, caplog):
    """kill_uid ends every process of the uid, each in its own session (as a program's
    setsid children are), with setpriv + kill and with the forked fallback; nothing of it is
    left for /proc to show, and no "survived" warning."""
    from grpokit.sandbox import reap

    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv to start processes as the uid")
    if tools == "forked":
        monkeypatch.setattr(reap, "_sweep_tools", lambda: None)
    elif reap._sweep_tools() is None:
        pytest.skip("needs setpriv and kill")
    uid = 0x70000000 + 250  # the sandbox range (grpokit/sandbox/uids.py), one no lease uses
    kill_uid(uid)
    spawn = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "60"]
    procs = [subprocess.Popen(spawn, start_new_session=True) for _ in range(3)]
    try:
        deadline = time.monotonic() + 10
        while len(pids_of(uid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(pids_of(uid)) == 3
        with caplog.at_level("WARNING", logger="grpokit.sandbox"):
            kill_uid(uid)
        assert pids_of(uid) == []
        assert [p.wait(timeout=5) for p in procs] == [-9, -9, -9]
        assert "survived" not in caplog.text
    finally:
        for p in procs:
            p.kill()


@pytest.mark.parametrize("level", ["uid", "namespaces"])
def test_next_run_on_a_uid_whose_killed_processes_await_reaping(hostile, monkeypatch, level):
    """A fork bomb's processes, killed at its timeout, stay zombies until pid 1 reaps them
    (1-2 s on this machine) and count against their uid's RLIMIT_NPROC meanwhile. A correct
    program run next on that uid could not fork and would score 0 (every time the same uid
    came right back, before the fix; the likely cause of test_uid_level_detached_child's
    one failure in a fresh clone): the lease takes another uid, or, when it is the only
    one, allows the leftovers on top of the process limit."""
    if level == "namespaces" and sandbox.resolve_isolation() != "namespaces":
        pytest.skip("namespaces are not available here")
    uids = importlib.import_module("grpokit.sandbox.uids")
    monkeypatch.setattr(uids.random, "randrange", lambda n: 0)  # always try UID_BASE first
    for count in (uids.UID_COUNT, 1):  # another uid free; UID_BASE the only one
        monkeypatch.setattr(uids, "UID_COUNT", count)
        run_python(hostile.programs["fork_bomb"], isolation=level, timeout=1.0)
        left = sum(  # its leftovers, zombies included (for the message)
            1 for d in os.listdir("/proc") if d.isdigit() and _owner(d) == uids.UID_BASE
        )
        r = run_python(hostile.programs["solves_then_detaches"], isolation=level)
        assert r.stdout == "3\n", (left, r)
        assert H.marker_pids(hostile.marker) == [] and H.sandbox_procs() == []


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
