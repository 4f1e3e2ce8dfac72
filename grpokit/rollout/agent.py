"""Multi-turn rollouts with tools and environments (docs/tools.md).

Each completion is a conversation: the model writes a turn until EOS or ``</tool_call>``;
a call is parsed and run (``grpokit.tools``), its result appended as a tool message (the
template's tokens, never re-tokenising what the model wrote), and the model goes on, until a
turn without a call, ``max_tool_calling_iterations`` calls, or ``max_completion_length``
tokens, counted as TRL counts them: every completion token, the model's and the tools'.

- A turn cut by the budget ends the completion (truncated). A tool result that does not
  fit (with room for one more token after it) is dropped and the completion ends there,
  truncated, as TRL rolls it back.
- A call beyond ``max_tool_calling_iterations`` is left unrun: the completion ends with it
  (not truncated: the model ended its turn).
- Every failure (malformed call, unknown tool, the tool raised or timed out) becomes the
  tool message the model reads and is counted in the episode; the rollout never raises.

The completion's tokens are [turn | injected | turn | injected | ... | turn]; ``tool_mask``
is 1 on the turns (the model's tokens) and 0 on the injected ones (the end of the assistant
turn the template writes after ``</tool_call>``, the tool turn, the next assistant header).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.prompts import tokenize_prompts
from grpokit.rewards.text import completion_text
from grpokit.rollout.base import Rollout, SamplingParams
from grpokit.rollout.stops import EOS, LENGTH, STOP, StopStrings
from grpokit.tools import Environments, Tool, ToolFormat, parse_call, run_call, split_call
from grpokit.tools.parse import MalformedCall
from grpokit.tools.template import CALL_CLOSE

OVERFLOW, LIMIT = "overflow", "limit"  # a tool result did not fit; the call limit was reached


@dataclass
class Episode:
    """One completion's conversation."""

    messages: list[dict[str, Any]] = field(default_factory=list)  # assistant / tool, in order
    ids: list[int] = field(default_factory=list)  # the completion's tokens
    mask: list[int] = field(default_factory=list)  # tool_mask: 1 model, 0 injected
    logps: list[float] | None = field(default_factory=list)  # the engine's (vLLM), 0 injected
    calls: int = 0  # tool calls run (failed ones included)
    failures: dict[str, int] = field(default_factory=dict)  # by kind (tools.FAILURE_KINDS)
    ended: str = ""  # eos, limit (a call left unrun), length, overflow
    environment: Any = None
    transcript: str = ""  # the completion decoded with its special tokens (for logs)

    @property
    def truncated(self) -> bool:
        return self.ended in (LENGTH, OVERFLOW)


def _assistant(text: str, ended: str) -> dict[str, Any]:
    """The assistant message of one turn: the text, or for a turn ending in a call, the
    text before the call and the parsed call (a malformed block stays in the text)."""
    if ended != STOP:
        return {"role": "assistant", "content": text}
    before, body = split_call(text)
    call = parse_call(body)
    if isinstance(call, MalformedCall):
        return {"role": "assistant", "content": text, "call": call}
    fn = {"name": call.name, "arguments": call.arguments}
    return {"role": "assistant", "content": before, "tool_calls": [{"type": "function", "function": fn}], "call": call}  # fmt: skip


class Agent:
    """Runs the multi-turn rollouts of a round (``rollout``) on a rollout engine that has
    ``generate_turn`` (grpokit's decode loop)."""

    def __init__(
        self,
        tokenizer,
        tools: list[Tool],
        environments: Environments | None = None,
        *,
        max_iterations: int | None = None,
        timeout: float = 10.0,
        max_prompt_length: int | None = None,
        prompt_truncation: str = "truncate",
        model: str = "the model",
        vocab_size: int = 0,
    ):
        self.tokenizer, self.tools, self.environments = tokenizer, tools, environments
        env_tools = environments.tools if environments is not None else []
        self.format = ToolFormat(tokenizer, [t.schema for t in tools + env_tools], model)
        self.max_iterations = max_iterations
        self.timeout = timeout
        self.max_prompt_length, self.prompt_truncation = max_prompt_length, prompt_truncation
        self.stops = StopStrings(tokenizer, [CALL_CLOSE], vocab_size)

    def rollout(
        self, engine, rows: list[dict], G: int, params: SamplingParams, counters=None
    ) -> Rollout:
        """``G`` multi-turn completions of each row's prompt, each at most
        ``params.max_new_tokens`` tokens (the model's and the tools')."""
        limit = params.max_new_tokens
        prompts = [r["prompt"] for r in rows for _ in range(G)]
        envs = self._reset(rows, G, prompts)
        shared = envs[0] is None  # no observations: a group's G completions share its prompt
        step = G if shared else 1
        texts = [self.format.render_prompt(p) for p in prompts[::step]]
        p_ids, p_mask = tokenize_prompts(
            self.tokenizer, texts, self.max_prompt_length, self.prompt_truncation, counters
        )
        p_ids, p_mask = p_ids.repeat_interleave(step, 0), p_mask.repeat_interleave(step, 0)
        contexts = [ids[m.bool()].tolist() for ids, m in zip(p_ids, p_mask)]
        episodes = [Episode(environment=e) for e in envs]
        toolboxes = [self._toolbox(e) for e in envs]
        active = list(range(len(episodes)))
        shared = shared and G > 1  # the first turn of a group shares its prompt's prefill
        while active:
            room = [limit - len(episodes[i].ids) for i in active]
            if shared:
                turns = engine.generate_turn(
                    contexts[::G], params, max_new_tokens=limit, stops=self.stops,
                    num_generations=G,
                )  # fmt: skip
                shared = False
            else:
                turns = engine.generate_turn(
                    [contexts[i] + episodes[i].ids for i in active], params,
                    max_new_tokens=max(room), stops=self.stops,
                )  # fmt: skip
            active = [
                i
                for i, r, turn in zip(active, room, turns)
                if self.add_turn(episodes[i], toolboxes[i], *turn[:2], r, limit, *turn[2:])
            ]
        model = getattr(engine, "model", None)  # the rollout lives where the policy does
        dev = next(model.parameters()).device if model is not None else p_ids.device
        return self._assemble(p_ids.to(dev), p_mask.to(dev), episodes, engine.pad_id)

    def _reset(self, rows, G: int, prompts: list) -> list:
        """Each completion's environment, reset with its row; a string ``reset`` returns is
        appended to the completion's last user message (TRL)."""
        if self.environments is None:
            return [None] * len(prompts)
        if any(isinstance(r["prompt"], str) for r in rows):
            raise ValueError("environment_factory needs chat prompts (messages), not strings")
        envs = self.environments.take(len(prompts))
        for i, env in enumerate(envs):
            obs = env.reset(**rows[i // G])
            if obs is not None:
                last = prompts[i][-1]
                prompts[i] = [*prompts[i][:-1], {**last, "content": last["content"] + str(obs)}]
        return envs

    def _toolbox(self, env) -> dict:
        box = {t.name: t.fn for t in self.tools}
        if env is not None:
            box.update(Environments.tools_of(env))
        return box

    def add_turn(
        self,
        ep: Episode,
        toolbox: dict,
        seg: list[int],
        how: str,
        room: int,
        limit: int,
        logps=None,
    ):
        """Add one generated turn to ``ep`` (``logps``: the engine's log-probs of its tokens,
        vLLM's); run its call. True when the model goes on."""
        if len(seg) > room:
            seg, how = seg[:room], LENGTH
        ep.ids += seg
        ep.mask += [1] * len(seg)
        ep.logps = None if logps is None or ep.logps is None else ep.logps + list(logps[: len(seg)])
        msg = _assistant(self.tokenizer.decode(seg, skip_special_tokens=True), how)
        call = msg.pop("call", None)
        ep.messages.append(msg)
        if how != STOP:
            ep.ended = how
            return False
        if self.max_iterations is not None and ep.calls >= self.max_iterations:
            ep.ended = LIMIT
            return False
        out = run_call(call, toolbox, self.timeout)
        ep.calls += 1
        if out.failure:
            ep.failures[out.failure] = ep.failures.get(out.failure, 0) + 1
        injected = self.format.injected_ids(out.name, out.content)
        if len(ep.ids) + len(injected) >= limit:
            ep.ended = OVERFLOW  # the result is dropped (TRL rolls it back)
            return False
        ep.messages.append({"role": "tool", "name": out.name, "content": out.content})
        ep.ids += injected
        ep.mask += [0] * len(injected)
        if ep.logps is not None:
            ep.logps += [0.0] * len(injected)
        return True

    def _assemble(self, p_ids, p_mask, episodes: list[Episode], pad_id: int) -> Rollout:
        N, C = len(episodes), max(1, max(len(e.ids) for e in episodes))
        ids = torch.full((N, C), pad_id, dtype=torch.long)
        cmask = torch.zeros((N, C), dtype=torch.long)
        tmask = torch.zeros((N, C), dtype=torch.long)
        for i, e in enumerate(episodes):
            n = len(e.ids)
            ids[i, :n], cmask[i, :n], tmask[i, :n] = torch.tensor(e.ids), 1, torch.tensor(e.mask)
            e.transcript = self.tokenizer.decode(e.ids, skip_special_tokens=False)
        truncated = torch.tensor([e.truncated for e in episodes])
        texts = [completion_text(e.messages) for e in episodes]
        dev = p_ids.device
        s_lp = None  # the engine's log-probs of the sampled tokens (vLLM), 0 elsewhere
        if all(e.logps is not None and len(e.logps) == len(e.ids) for e in episodes):
            s_lp = torch.zeros((N, C), dtype=torch.float32)
            for i, e in enumerate(episodes):
                s_lp[i, : len(e.ids)] = torch.tensor(e.logps, dtype=torch.float32)
            s_lp = s_lp.to(dev)
        return Rollout(
            p_ids, p_mask, ids.to(dev), cmask.to(dev), truncated.to(dev), texts, s_lp,
            tool_mask=tmask.to(dev), episodes=episodes,
        )  # fmt: skip


def ended_counts(episodes: list[Episode]) -> dict[str, int]:
    """How many completions ended each way (eos, stop, limit, length, overflow)."""
    out: dict[str, int] = {}
    for e in episodes:
        out[e.ended] = out.get(e.ended, 0) + 1
    return out


__all__ = ["Agent", "EOS", "Episode", "LENGTH", "LIMIT", "OVERFLOW", "STOP", "ended_counts"]
