"""Run untrusted Python and C++ (model-written code) with hard limits. See docs/sandbox.md.

C++ (``run_cpp``, ``compile_program`` + ``run_binary``, ``score_many`` with language
``cpp``): ``g++`` itself runs inside the sandbox under the same level and limits (its own
clock and memory), and the binary runs in a fresh sandbox per test case.

Four isolation levels, chosen by ``isolation=`` or ``GRPOKIT_SANDBOX_ISOLATION``
(``auto`` picks the strongest that works on this machine, after one probe run):

- ``namespaces`` (root + ``unshare``): fresh net, pid, mount, ipc and uts namespaces. Inside,
  every mount is read-only, every top-level directory but the system ones (/usr, /etc, /lib,
  /bin, /dev, /sys, ...) is covered by an empty read-only tmpfs (so /home, /root, /var, /srv and
  a project anywhere outside the system directories are hidden; also the caller's cwd and
  home, wherever they are), /proc shows only the
  sandbox, and /tmp (its working directory) and /dev/shm are small private tmpfs. The
  program runs as a dedicated uid; when it ends, the namespace's init ends and the kernel kills
  everything the program left running.
- ``userns`` (not root, unprivileged user namespaces allowed): the same namespaces and mounts
  inside a new user namespace; the program is that namespace's root with every capability
  dropped, i.e. the caller's user outside, which cannot see or reach the caller's processes.
- ``uid`` (root, no namespaces): the dedicated uid, killed by uid and its files in the
  temporary directories removed after each run. Network, and files readable by everyone,
  are NOT isolated.
- ``none`` (not root, no user namespaces): rlimits and the seccomp filter only; the program
  runs as the caller's user and can read and write the caller's files. Not a security
  boundary.

``userns`` and ``none`` are refused as root. In every level: rlimits (CPU, address space,
file size, processes, core=0, open files), a seccomp filter (x86_64/aarch64: no signals to
other processes, no sockets, no new session or process group, no namespaces, no ptrace, no
SysV/POSIX IPC, no io_uring), a cleaned environment, a fresh staging directory removed
afterwards, a wall-clock limit and an output cap enforced while reading (the parent never holds
more than ``max_output_bytes`` + 64 KiB per stream). When ``run_python`` returns, no process of
the run is left (in ``none``: with the filter active).

The rooms: ``levels`` (the level names, what each needs), ``isolation`` (which level a run
gets here), ``hidden`` (what the namespace levels cover), ``launcher.py`` (the program that
builds the sandbox, run by path in the child), ``child`` (one run: stage, launch, stop),
``pipes`` (stdin and capped output against the clock), ``reap`` (finding and killing what a
run left), ``uids`` (the dedicated uids), ``files`` (staging directory, temp-dir debris),
``run`` (the run API below). Standard library only: importing this package is instant.
"""

from grpokit.sandbox.child import Limits, Program, Result, python_program
from grpokit.sandbox.cpp import CXX, CXX_FLAGS, Compiled, binary_program
from grpokit.sandbox.hidden import HIDE_ALWAYS, SYSTEM_DIRS, hide_paths
from grpokit.sandbox.isolation import resolve_isolation, sandbox_info
from grpokit.sandbox.launcher import SETUP_FAILED
from grpokit.sandbox.levels import ISOLATIONS, NS_LEVELS, PYTHON, SandboxError
from grpokit.sandbox.run import (
    LANGUAGES,
    case_passes,
    compile_program,
    default_workers,
    language_of,
    output_matches,
    run_binary,
    run_cpp,
    run_program,
    run_python,
    run_tests,
    score_many,
)
from grpokit.sandbox.uids import UID_BASE, UID_COUNT, sandbox_processes

__all__ = [
    "CXX",
    "CXX_FLAGS",
    "LANGUAGES",
    "Compiled",
    "Program",
    "binary_program",
    "compile_program",
    "language_of",
    "output_matches",
    "python_program",
    "run_binary",
    "run_cpp",
    "run_program",
    "HIDE_ALWAYS",
    "ISOLATIONS",
    "NS_LEVELS",
    "PYTHON",
    "SETUP_FAILED",
    "SYSTEM_DIRS",
    "UID_BASE",
    "UID_COUNT",
    "Limits",
    "Result",
    "SandboxError",
    "case_passes",
    "default_workers",
    "hide_paths",
    "resolve_isolation",
    "run_python",
    "run_tests",
    "sandbox_info",
    "sandbox_processes",
    "score_many",
]
