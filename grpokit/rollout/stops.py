"""Stop strings for grpokit's decode loop, and how a generated turn ended.

A multi-turn rollout generates each assistant turn until EOS or a stop string (the end of
a tool call, ``</tool_call>``). Text, not token ids, is matched: a tokenizer may spell the
string with different tokens in different contexts. Only rows whose newest token could end
a stop string (its text holds the string's last character) are decoded, the last few tokens
of the row only.
"""

from __future__ import annotations

import torch

EOS, STOP, LENGTH = "eos", "stop", "length"  # how a turn ended


class StopStrings:
    """The ``stop`` of ``sampler.sample``: rows whose text now contains one of ``strings``
    end; ``at[row]`` is the row's length (tokens) including the token that completed it.
    Built once per tokenizer (it decodes the vocabulary once); ``start()`` before each turn."""

    def __init__(self, tokenizer, strings: list[str], vocab_size: int = 0):
        self.tokenizer, self.strings = tokenizer, [s for s in strings if s]
        self.window = max((len(s) for s in self.strings), default=0) + 1
        self.at: dict[int, int] = {}
        last = {s[-1] for s in self.strings}
        pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        self.candidates = torch.zeros(max(vocab_size, len(pieces)), dtype=torch.bool)
        self.candidates[: len(pieces)] = torch.tensor([any(c in p for c in last) for p in pieces])

    def start(self) -> StopStrings:
        self.at = {}
        return self

    def __call__(self, tokens: torch.Tensor, rows: torch.Tensor, t: int, check: torch.Tensor):
        hit = torch.zeros_like(check)
        cand = check & self.candidates.to(tokens.device)[tokens[rows, t]]
        for i in torch.nonzero(cand).squeeze(1).tolist():
            r = int(rows[i])
            tail = tokens[r, max(0, t + 1 - self.window) : t + 1].tolist()
            text = self.tokenizer.decode(tail, skip_special_tokens=False)
            if any(s in text for s in self.strings):
                hit[i] = True
                self.at[r] = t + 1
        return hit


def turn_segments(
    tokens: torch.Tensor, eos_ids: list[int], stops: StopStrings | None
) -> list[tuple[list[int], str]]:
    """Each row of a turn's (N, T) sampled tokens cut where it ended: (ids, how) with how
    ``eos`` (EOS included), ``stop`` (through the token completing a stop string) or
    ``length`` (the whole row: the turn ran out of tokens)."""
    out = []
    eos = set(eos_ids)
    for r, row in enumerate(tokens.tolist()):
        if stops is not None and r in stops.at:
            out.append((row[: stops.at[r]], STOP))
            continue
        end = next((i for i, x in enumerate(row) if x in eos), None)
        out.append((row, LENGTH) if end is None else (row[: end + 1], EOS))
    return out
