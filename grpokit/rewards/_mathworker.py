"""Entry point of the math-verify worker process: ``python -m grpokit.rewards._mathworker R W``
(R, W: pipe file descriptors). See ``grpokit.rewards.mathgrade``."""

import sys

from grpokit.rewards.mathgrade import serve

if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
