"""Tools and an environment the tool tests name by file path (``tools: [path.py:name]``)."""

import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def broken(x: int) -> int:
    """A tool that always raises.

    Args:
        x: Any integer.
    """
    raise RuntimeError(f"broken on {x}")


def slow(seconds: float) -> str:
    """Spin in Python for a while.

    Args:
        seconds: How long to spin.
    """
    t0 = time.time()
    while time.time() - t0 < seconds:
        pass
    return "done"


def no_docstring(x: int) -> int:
    return x


class GuessingGame:
    """Guess a secret number (the row's answer); the environment says higher or lower."""

    made = 0  # instances made (the pool reuses them)

    def __init__(self):
        GuessingGame.made += 1
        self.secret = None
        self.found = False
        self.guesses = []

    def reset(self, answer=None, **row):
        self.secret = int(answer)
        self.found = False
        self.guesses = []
        return " (guess it with the guess tool)"

    def get_reward(self) -> float:
        return 1.0 if self.found else 0.0

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: Your guess.
        """
        self.guesses.append(number)
        if number == self.secret:
            self.found = True
            return "correct"
        return "higher" if number < self.secret else "lower"


def tool_turns(prompts, completions, **kw):
    """Reward: the tool messages in each completion (rewards receive the conversation)."""
    return [float(sum(m["role"] == "tool" for m in c)) for c in completions]


def guesses_made(prompts, completions, environments=None, **kw):
    """Reward: how many guesses each completion's environment saw."""
    return [float(len(e.guesses)) for e in environments]


class NoReset:
    """Not an environment: no reset."""

    def step(self, text: str) -> str:
        """Echo.

        Args:
            text: Anything.
        """
        return text
