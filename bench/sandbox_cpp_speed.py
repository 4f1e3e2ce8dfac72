"""How long a C++ compile + run takes in the sandbox here (docs/sandbox.md, C++).

    python bench/sandbox_cpp_speed.py [repeats]

For a small a+b program with <iostream>, the same with <bits/stdc++.h> (what every
ioi_code submission includes), and g++ outside the sandbox for comparison: wall clock and
CPU (user + system of the children, from getrusage) of the compile and of one run.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time

from grpokit.sandbox import CXX, CXX_FLAGS, compile_program, resolve_isolation, run_binary

SMALL = (
    "#include <iostream>\n"
    "int main() { long long a, b; std::cin >> a >> b; std::cout << a + b << '\\n'; }\n"
)
STDCXX = (
    "#include <bits/stdc++.h>\nusing namespace std;\n"
    "int main() { long long a, b; cin >> a >> b; cout << a + b << '\\n'; }\n"
)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(fn, *args):
    c0, t0 = cpu(), time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0, cpu() - c0


def outside(src: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "prog.cpp")
        with open(path, "w") as f:
            f.write(src)
        cmd = [CXX, *CXX_FLAGS, "-o", os.path.join(d, "prog"), path]
        _, wall, c = timed(subprocess.run, cmd)
    return wall, c


def main(repeats: int) -> None:
    print(f"isolation {resolve_isolation()}, load {os.getloadavg()[0]:.1f}, {CXX} {CXX_FLAGS}")
    compile_program("int main() {}")  # the level's probe, once
    for name, src in (("<iostream>", SMALL), ("<bits/stdc++.h>", STDCXX)):
        for _ in range(repeats):
            c, cw, cc = timed(compile_program, src)
            assert c.ok, c.error
            r, rw, rc = timed(run_binary, c.binary, "1 2\n")
            assert r.stdout == "3\n", r
            ow, oc = outside(src)
            print(
                f"{name:16s} sandbox compile {cw:5.2f} s wall {cc:5.2f} s CPU | run {rw * 1000:4.0f}"
                f" ms wall {rc * 1000:4.0f} ms CPU | g++ outside {ow:5.2f} s wall {oc:5.2f} s CPU"
                f" | binary {len(c.binary)} bytes"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
