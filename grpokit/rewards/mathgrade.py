"""math-verify grading, correct and time-bounded from any thread.

math-verify bounds its own work with ``signal.alarm``, which only works in a process's main
thread: called from any other thread, ``parse`` raises (math-verify 0.9), and with its
timeouts disabled a pathological answer such as ``\\boxed{9^{9^{9^9}}}`` can run for hours.
So grading always happens in one long-lived worker process, started lazily with
``python -m grpokit.rewards._mathworker``:

- inside the worker, math-verify runs in the worker's main thread with its own default
  timeouts (5 s per parse / per comparison), so timeouts score exactly as in open-r1;
- the caller (any thread) waits at most ``hard_timeout`` seconds per sample; a worker that
  overruns (C code that a signal cannot interrupt) is killed and restarted, and that sample
  scores as wrong.

A whole batch goes to the worker in one message and results stream back one by one, so the
overhead is one round trip per batch plus a pickle per sample. The worker also caches parsed
gold answers: in GRPO each gold appears ``num_generations`` times in a row.
"""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
import threading
from functools import lru_cache
from multiprocessing.connection import Connection
from pathlib import Path

log = logging.getLogger("grpokit")

HARD_TIMEOUT_S = 20.0  # per sample, on top of math-verify's own 5 s timeouts
STARTUP_TIMEOUT_S = 120.0  # importing sympy on a loaded machine can take a while

# A job is (mode, completion_text, gold_text).
#   "accuracy": open-r1 accuracy_reward -> 1.0 / 0.0, None when the gold does not parse
#               or verify raises.
#   "length":   the correctness used by open-r1's len_reward and cosine reward -> 1.0 / 0.0,
#               None when the gold does not parse.
MODES = ("accuracy", "length")


# ---------------------------------------------------------------------- grading (worker side)
def _answer_config(boxed):
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig

    # open-r1 also passes equations=True, deprecated and without effect in latex2sympy2 1.x
    norm = NormalizationConfig(
        nits=False,
        malformed_operators=False,
        basic_latex=True,
        boxed=boxed,
        units=True,
    )
    # boxed_match_priority=0: a \boxed{} answer is tried first
    return [
        LatexExtractionConfig(
            normalization_config=norm, boxed_match_priority=0, try_extract_without_anchor=False
        )
    ]


@lru_cache(maxsize=4096)
def _gold(solution: str, mode: str):
    from math_verify import LatexExtractionConfig, parse

    if mode == "accuracy":  # open-r1 parses the gold with math-verify's default targets
        return parse(solution, extraction_mode="first_match")
    return parse(
        solution, extraction_mode="first_match", extraction_config=[LatexExtractionConfig()]
    )


def grade_one(mode: str, content: str, solution: str) -> float | None:
    """One sample, as open-r1 scores it. Call only from a process's main thread."""
    from math_verify import parse, verify

    gold = _gold(solution, mode)
    if len(gold) == 0:
        return None
    boxed = "all" if mode == "accuracy" else True
    answer = parse(content, extraction_config=_answer_config(boxed), extraction_mode="first_match")
    try:
        if mode == "accuracy":
            return float(verify(gold, answer))
        return float(verify(answer, gold))  # open-r1's len/cosine pass them in this order
    except Exception as e:  # noqa: BLE001  math-verify on odd expressions
        log.debug("math-verify verify failed: %s", e)
        return None if mode == "accuracy" else 0.0


def serve(read_fd: int, write_fd: int) -> None:
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # timeouts are expected noise
    try:
        import latex2sympy2_extended  # noqa: F401
        import math_verify  # noqa: F401

        grade_one("accuracy", "$1$", "$1$")  # warm up: imports and first parse
    except Exception as e:  # noqa: BLE001
        outbox.send(("error", f"{type(e).__name__}: {e}"))
        return
    outbox.send(("ready", None))
    while True:
        try:
            jobs = inbox.recv()
        except EOFError:  # the parent has gone
            return
        for job in jobs:
            try:
                outbox.send(grade_one(*job))
            except Exception as e:  # noqa: BLE001  never let one sample stop the worker
                log.debug("math-verify failed: %s", e)
                outbox.send(None if job[0] == "accuracy" else 0.0)


# ---------------------------------------------------------------------- client (any thread)
class MathGrader:
    """Grades (mode, completion, gold) jobs in a worker process; safe from any thread."""

    def __init__(self, hard_timeout: float = HARD_TIMEOUT_S):
        self.hard_timeout = hard_timeout
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._inbox: Connection | None = None  # we send jobs here
        self._outbox: Connection | None = None  # we read results here
        self._pid = os.getpid()
        self.restarts = 0

    # -- worker life
    def _start(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # so `-m grpokit...` finds this copy
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "grpokit.rewards._mathworker",
                    str(to_child_r),
                    str(from_child_w),
                ],
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._inbox = Connection(to_child_w, readable=False)
        self._outbox = Connection(from_child_r, writable=False)
        if not self._outbox.poll(STARTUP_TIMEOUT_S):
            self._kill()
            raise RuntimeError(f"math-verify worker did not start within {STARTUP_TIMEOUT_S}s")
        try:
            status, detail = self._outbox.recv()
        except EOFError:
            status, detail = "error", "the worker exited while starting"
        if status != "ready":
            self._kill()
            raise RuntimeError(
                f"math-verify worker failed to start ({detail}); "
                "install math-verify: pip install 'math-verify[antlr4_13_2]'"
            )

    def _kill(self) -> None:
        if self._proc is not None and self._pid == os.getpid():
            self._proc.kill()
            self._proc.wait()
        for conn in (self._inbox, self._outbox):
            if conn is not None:
                conn.close()
        self._proc = self._inbox = self._outbox = None

    def _ensure(self) -> None:
        if self._pid != os.getpid():  # forked: the handles belong to the parent process
            self._proc = self._inbox = self._outbox = None
            self._pid = os.getpid()
        if self._proc is None or self._proc.poll() is not None:
            self._kill()
            self._start()

    def close(self) -> None:
        with self._lock:
            self._kill()

    # -- grading
    def grade(self, jobs: list[tuple[str, str, str]]) -> list[float | None]:
        """One result per job, in order. A sample that overruns ``hard_timeout`` scores 0.0."""
        out: list[float | None] = []
        with self._lock:
            while len(out) < len(jobs):
                self._ensure()
                self._inbox.send(jobs[len(out) :])
                while len(out) < len(jobs):
                    try:
                        if not self._outbox.poll(self.hard_timeout):
                            raise TimeoutError
                        out.append(self._outbox.recv())
                    except (TimeoutError, EOFError, OSError) as e:
                        what = "took too long" if isinstance(e, TimeoutError) else "crashed"
                        log.warning(
                            "math-verify %s on a sample (limit %.0fs): scored 0.0",
                            what,
                            self.hard_timeout,
                        )
                        self._kill()
                        self.restarts += 1
                        out.append(0.0)
                        break  # restart the worker with the remaining jobs
        return out


GRADER = MathGrader()
atexit.register(GRADER.close)
