"""Training-health alerts: the run watches its own metrics and says, in one line, what is
wrong and what to change (``docs/health.md``).

Pure: ``HealthMonitor`` is fed the metric dicts the trainer logs (one per optimizer step,
TRL's names: ``frac_reward_zero_std``, ``completions/clipped_ratio``, ``entropy``, ``kl``,
``grad_norm``, ``loss``, ``reward``, ``rewards/<name>/mean``) and the held-out evaluations;
it never sees a model. Each detector turns a step into bad / good / undecided; an alert
*fires* once when its condition has held for its number of steps and *clears* once it has
been good for ``clear_steps`` steps: one line each, never a line every step. The trainer's
glue (console, ``status.json``, ``stop``) is ``grpokit.status.HealthAlerts``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

# Thresholds (health_params overrides any of them). Metric names are TRL's.
HEALTH_DEFAULTS: dict[str, float] = {
    "frac_reward_zero_std": 0.75,  # no_signal: at least this fraction of groups equal ...
    "zero_std_steps": 5,  # ... on each of this many consecutive steps
    "reward_silent_steps": 10,  # a reward function constant over its first N steps
    "clipped_ratio": 0.5,  # truncated: more than this fraction of completions cut off ...
    "clipped_steps": 3,  # ... on each of this many consecutive steps
    "entropy_min": 0.03,  # entropy_collapse: mean token entropy below this (nats) ...
    "entropy_drop": 10.0,  # ... or this many times below its mean over the first 3 steps
    "entropy_steps": 3,
    "stuck_share": 0.5,  # ... while at least this share of the unsolved sampled groups is stuck
    "spike_factor": 10.0,  # grad_norm / kl above this x the median of ...
    "spike_window": 20,  # ... the last this many steps (at least 5 of them)
    "kl_floor": 0.05,  # kl_spike only above this (KL grows from 0 early in any run)
    "zero_loss_steps": 3,  # loss exactly 0 on each of this many consecutive steps
    "clear_steps": 2,  # an alert clears after this many good steps in a row
    "solved_accuracy": 0.95,  # train accuracy at which no_signal / entropy_collapse say "solved"
}
# Solved / stuck groups: over every group sampled in a step (dynamic sampling's dropped ones
# too), ``grpokit.dynamic.sampled_metrics``; ``accuracy`` is the trained batch's.
SAMPLED_ACC, SOLVED, STUCK = "sampled/accuracy", "sampled/solved_groups", "sampled/stuck_groups"
HEALTH_MODES = ("warn", "stop", "off")
# A detector's verdict between its fire and clear thresholds: the step is not bad (a bad
# streak must be consecutive steps) and not good (clearing needs good steps in a row).
HOLD = "hold"
SOLVED_ADVICE = "stop here (max_steps) or draw harder problems"


def health_mode(value: str | bool) -> str:
    """health_checks as one of HEALTH_MODES: YAML 1.1 reads a bare ``off`` as false (and
    ``on`` as true: warn)."""
    if isinstance(value, bool):
        return "warn" if value else "off"
    return value


def check_params(params: dict) -> str | None:
    """None when ``params`` (health_params) is valid, else the one-line problem and fix."""
    for k, v in params.items():
        if k not in HEALTH_DEFAULTS:
            return f"health_params: unknown key {k!r}; use any of {', '.join(HEALTH_DEFAULTS)}"
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            return f"health_params: {k}={v!r} must be a number > 0 (default {HEALTH_DEFAULTS[k]})"
    return None


DROPPED = "dynamic_sampling/dropped_frac"  # groups of equal rewards dynamic sampling dropped


def _num(v: Any) -> float | None:
    """A metric as a float; None when missing or not finite (a tensor is read with float)."""
    if v is None or isinstance(v, (str, bool)):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _g(x: float) -> str:
    return f"{x:.3g}"


@dataclass
class Event:
    """An alert firing or clearing: ``key`` is its name (``health/<key>`` in the metrics)."""

    key: str
    step: int
    fired: bool
    line: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "alert": self.key, "event": "fired" if self.fired else "cleared",
                "line": self.line}  # fmt: skip


class HealthMonitor:
    """Every detector over a run's metrics. ``settings``: the run's config values the advice
    quotes (num_generations, beta, max_completion_length, learning_rate, ...)."""

    def __init__(self, settings: dict[str, Any] | None = None, params: dict | None = None):
        self.s = dict(settings or {})
        self.p = {**HEALTH_DEFAULTS, **(params or {})}
        self.active: dict[str, str] = {}  # key -> the line that fired it
        self.seen: set[str] = set()  # keys that ever fired (their health/* metric is logged)
        self.events: list[dict[str, Any]] = []
        self.bad: dict[str, int] = {}  # consecutive bad steps per key
        self.good: dict[str, int] = {}
        self.hist: dict[str, list] = {
            "grad_norm": [], "kl": [], "entropy": [], "interval": [], "accuracy": []
        }  # fmt: skip
        self.rewards: dict[str, dict[str, Any]] = {}  # per reward function, its first steps
        self.last_eval: tuple[int, float, int] | None = None  # step, accuracy, samples

    # ------------------------------------------------------------------ feeding
    def observe(self, step: int, m: dict[str, Any]) -> list[Event]:
        """One optimizer step's metrics: the alerts that fired or cleared at it."""
        self._track_accuracy(m)
        verdicts = [
            ("no_signal", *self._no_signal(m)),
            ("truncated", *self._truncated(m)),
            ("entropy_collapse", *self._entropy(m)),
            ("grad_norm_spike", *self._spike("grad_norm", m)),
            ("zero_loss", *self._zero_loss(m)),
        ]
        if _num(self.s.get("beta")):  # beta 0: kl is not computed (always 0)
            verdicts.append(("kl_spike", *self._spike("kl", m)))
        verdicts += self._reward_silent(m)
        r = _num(m.get("reward"))
        if r is not None:
            per = {k[8:-5]: _num(v) for k, v in m.items() if _is_reward_mean(k)}
            self.hist["interval"].append((step, r, per))
        events = []
        for key, bad, line, need in verdicts:
            events += self._update(key, step, bad, line, need)
        return events

    def observe_eval(self, step: int, result: dict[str, Any]) -> list[Event]:
        """A held-out evaluation (``accuracy``, ``num_prompts``, ``num_samples``): reward
        hacking is judged between it and the previous one."""
        acc = _num(result.get("accuracy"))
        if acc is None:
            return []
        n = int(_num(result.get("num_prompts")) or 1) * int(_num(result.get("num_samples")) or 1)
        bad, line = self._hacking(acc, n)
        self.last_eval, self.hist["interval"] = (step, acc, n), []
        return self._update("reward_hacking", step, bad, line, 1, clear_after=1)

    def metrics(self) -> dict[str, float]:
        """``health/<key>``: 1.0 while the alert is active, 0.0 after it cleared; only the
        alerts that fired in this run (a healthy run logs none)."""
        return {f"health/{k}": float(k in self.active) for k in sorted(self.seen)}

    def summary(self) -> dict[str, Any]:
        return {"active": dict(self.active), "events": list(self.events)}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (JSON-safe), so a resumed run neither repeats nor forgets
        an alert."""
        keep = ("active", "events", "bad", "good", "hist", "rewards", "last_eval")
        return {**{k: getattr(self, k) for k in keep}, "seen": sorted(self.seen)}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        for k, v in (state or {}).items():
            setattr(self, k, set(v) if k == "seen" else v)

    # ------------------------------------------------------------------ episodes
    def _update(self, key, step, bad, line, need, clear_after=None) -> list[Event]:
        """Count the streaks; fire at ``need`` bad steps in a row, clear at clear_steps good."""
        if bad is None:
            return []
        if bad == HOLD:  # between the thresholds: ends a bad streak, starts no good one
            self.bad[key] = self.good[key] = 0
            return []
        self.bad[key] = self.bad.get(key, 0) + 1 if bad else 0
        self.good[key] = 0 if bad else self.good.get(key, 0) + 1
        if bad and key not in self.active and self.bad[key] >= need:
            line = f"health {key} at step {step}: {line}"
            self.active[key] = line
            self.seen.add(key)
            return [self._event(key, step, True, line)]
        clear_after = clear_after or int(self.p["clear_steps"])
        if not bad and key in self.active and self.good[key] >= clear_after:
            del self.active[key]
            return [self._event(key, step, False, f"health {key} cleared at step {step}: {line}")]
        return []

    def _event(self, key: str, step: int, fired: bool, line: str) -> Event:
        e = Event(key, step, fired, line)
        self.events.append(e.to_dict())
        return e

    # ------------------------------------------------------------------ detectors
    # Each returns (bad: True / False / HOLD / None = no data, the line, steps needed to fire).
    def _no_signal(self, m):
        f, need = _num(m.get("frac_reward_zero_std")), int(self.p["zero_std_steps"])
        if f is None:
            return None, "", need
        th = self.p["frac_reward_zero_std"]
        if f < th:
            return False, f"frac_reward_zero_std {_g(f)}", need
        acc, r = _num(m.get(SAMPLED_ACC, m.get("accuracy"))), _num(m.get("reward"))
        why = f"; train accuracy {acc:.0%}" if acc is not None else ""
        why += f", mean reward {_g(r)}" if r is not None else ""
        solved = self._solved(need)
        if solved is not None:
            line = (
                f"frac_reward_zero_std >= {_g(th)} for {need} steps (now {_g(f)}): the model "
                f"already solves the training prompts ({self._accuracy_words(solved, need)}), so its "
                f"groups agree and further steps teach nothing; {SOLVED_ADVICE}"
            )
            return True, line, need
        line = (
            f"frac_reward_zero_std >= {_g(th)} for {need} steps (now {_g(f)}): "
            f"most groups give all {self.s.get('num_generations', 'G')} completions the same "
            f"reward, so their advantages are 0 and they teach nothing{why}; raise "
            "num_generations, use data neither too hard nor too easy for the model, or set "
            "dynamic_sampling: true"
        )
        return True, line, need

    def _truncated(self, m):
        c, need = _num(m.get("completions/clipped_ratio")), int(self.p["clipped_steps"])
        if c is None:
            return None, "", need
        th, L = self.p["clipped_ratio"], self.s.get("max_completion_length", "?")
        if c <= th:
            return False, f"completions/clipped_ratio {_g(c)}", need
        line = (
            f"{c:.0%} of completions hit max_completion_length ({L}) "
            f"(completions/clipped_ratio > {_g(th)} for {need} steps): their rewards judge cut-off "
            "text; raise max_completion_length, or add a length penalty (reward_funcs: "
            "soft_overlong_punishment) or mask_truncated_completions: true"
        )
        return True, line, need

    def _entropy(self, m):
        e, need = _num(m.get("entropy")), int(self.p["entropy_steps"])
        if e is None:
            return None, "", need
        start = self.hist["entropy"]
        if len(start) < 3:
            start.append(e)
            return None, "", need
        ref = sum(start) / len(start)
        low, drop = self.p["entropy_min"], self.p["entropy_drop"]
        th = max(low, ref / drop)
        if e >= th:  # cleared only at twice the threshold: no flapping around it
            return (False if e >= 2 * th else HOLD), f"entropy {_g(e)} (start {_g(ref)})", need
        head = (
            f"mean token entropy {_g(e)} (start {_g(ref)}; alert below "
            f"{_g(low)} or {_g(drop)}x under the start, {need} steps): "
        )
        acc = self._solved(need)
        if acc is not None:  # converged, not collapsed: the advice is to stop, not to explore
            return True, head + (
                f"the policy is near-deterministic because it solves the training prompts "
                f"({self._accuracy_words(acc, need)}); further steps teach little: {SOLVED_ADVICE}"
            ), need  # fmt: skip
        stuck = self._stuck_share(m)
        if stuck is not None and stuck < self.p["stuck_share"]:  # sure where right only
            return False, (
                f"entropy {_g(e)} (start {_g(ref)}) but only {stuck:.0%} of the unsolved groups "
                "have equal rewards: the policy is sure where it is right and still varies "
                "where it is not"
            ), need  # fmt: skip
        return True, head + self._entropy_advice(m), need

    def _stuck_share(self, m) -> float | None:
        """Of the sampled groups not all correct, the share whose rewards are all equal (the
        completions agree where the task is not learnt: no signal there); None without the
        sampled/* metrics or without an unsolved group."""
        solved, stuck = _num(m.get(SOLVED)), _num(m.get(STUCK))
        if solved is None or stuck is None or solved >= 1.0:
            return None
        return stuck / (1.0 - solved)

    def _entropy_advice(self, m) -> str:
        """What to change for a collapsed entropy, given the bonus the run already has: an
        adaptive bonus at its cap, a fixed one, or none; with the share of groups whose
        rewards no longer differ when the step logged it."""
        zero, dropped = _num(m.get("frac_reward_zero_std")), _num(m.get(DROPPED))
        spread, stuck = "", self._stuck_share(m)
        if stuck is not None:
            spread = (
                f" ({stuck:.0%} of the sampled groups not yet solved have equal rewards: their "
                "completions agree without being right)"
            )
        elif dropped is not None:  # dynamic sampling: the kept groups all differ
            spread = f" ({dropped:.0%} of the sampled groups had equal rewards and were dropped)"
        elif zero is not None:
            spread = f" ({zero:.0%} of this step's groups have equal rewards)"
        coef, cap = _num(m.get("entropy_coef")), _num(self.s.get("entropy_coef_max"))
        if self.s.get("use_adaptive_entropy"):
            at_cap = coef is not None and cap is not None and coef >= cap - 1e-12
            bonus = (
                f"the adaptive entropy bonus is at its cap (entropy_coef {_g(coef)} = "
                f"entropy_coef_max): raise entropy_coef_max or entropy_target"
                if at_cap
                else f"the adaptive entropy bonus (entropy_coef {_g(coef or 0.0)}) is still "
                "rising towards entropy_target: raise entropy_coef_delta for a faster response"
            )
        elif _num(self.s.get("entropy_coef")):
            bonus = f"raise the entropy bonus (entropy_coef, now {_g(self.s['entropy_coef'])})"
        else:
            bonus = "add an entropy bonus (entropy_coef, or use_adaptive_entropy: true)"
        return (
            f"the policy has become near-deterministic, so its groups differ less{spread}; "
            f"{bonus}, lower learning_rate, or raise temperature"
        )

    def _track_accuracy(self, m) -> None:
        """Keep the train accuracy (over every sampled completion when logged: dynamic
        sampling trains on a batch without the solved groups) of the last steps the
        detectors look back over; a step without it ends the window."""
        acc, hist = (
            _num(m.get(SAMPLED_ACC, m.get("accuracy"))),
            self.hist.setdefault("accuracy", []),
        )
        if acc is None:
            hist.clear()
            return
        hist.append(acc)
        keep = max(int(self.p["zero_std_steps"]), int(self.p["entropy_steps"]), 1)
        del hist[:-keep]

    def _accuracy_words(self, acc: float, need: int) -> str:
        n = min(need, len(self.hist.get("accuracy") or []))
        return f"train accuracy {acc:.0%}" + (f" over the last {n} steps" if n > 1 else "")

    def _solved(self, need: int) -> float | None:
        """The mean train accuracy over the ``need`` steps an alert looked at (fewer when the
        run has logged fewer) when it is at least solved_accuracy, else None. Those steps, not
        the last one: with a few prompts a step, a policy that writes one template is right on
        every prompt of some steps (both prompts of the kind the template solves), which is
        not solving the task."""
        hist = (self.hist.get("accuracy") or [])[-max(1, need) :]  # [] when this step has none
        if not hist:
            return None
        acc = sum(hist) / len(hist)
        return acc if acc >= self.p["solved_accuracy"] else None

    def _spike(self, name: str, m):
        v, hist = _num(m.get(name)), self.hist[name]
        if v is None:
            return None, "", 1
        prev = hist[-int(self.p["spike_window"]) :]
        hist.append(v)
        del hist[: -int(self.p["spike_window"])]
        if len(prev) < 5 or statistics.median(prev) <= 0:
            return None, "", 1
        med, k = statistics.median(prev), self.p["spike_factor"]
        if v <= k * med or (name == "kl" and v <= self.p["kl_floor"]):
            return False, f"{name} {_g(v)} ({_g(v / med)}x its running median)", 1
        advice = {
            "grad_norm": f"an unstable update; lower learning_rate (now {self.s.get('learning_rate')})"
            f", keep max_grad_norm on (now {self.s.get('max_grad_norm')}) or raise warmup_ratio",
            "kl": "the policy jumped away from the reference; lower learning_rate, raise beta "
            f"(now {self.s.get('beta')}) or lower epsilon",
        }[name]
        line = (
            f"{name} {_g(v)} is {_g(v / med)}x its running median {_g(med)} "
            f"(alert above {_g(k)}x): {advice}"
        )
        return True, line, 1

    def _zero_loss(self, m):
        loss, need = _num(m.get("loss")), int(self.p["zero_loss_steps"])
        if loss is None:
            return None, "", need
        if loss != 0.0:
            return False, f"loss {_g(loss)}", need
        f, beta = _num(m.get("frac_reward_zero_std")), _num(self.s.get("beta")) or 0.0
        g = _num(m.get("grad_norm"))
        head = f"loss is exactly 0 for {need} steps"
        if f == 1.0 and beta == 0.0 and self._solved(need) is not None:
            line = (
                f"{head}, as expected here: the model solves every training prompt, so every "
                "group's rewards are equal, every advantage is 0, and beta is 0 (no KL term); "
                f"further steps teach nothing: {SOLVED_ADVICE}"
            )
        elif f == 1.0 and beta == 0.0:
            line = (
                f"{head}, as expected here: every group's rewards are equal, so every advantage "
                "is 0, and beta is 0 (no KL term); the model learns nothing: see no_signal "
                "(raise num_generations, change the data or rewards, dynamic_sampling: true)"
            )
        elif g:
            line = (
                f"{head} but the gradient is not (grad_norm {_g(g)}): expected, the update is "
                "real; at the first step on a batch the probability ratio is 1 and each group's "
                "advantages sum to 0, so completions of equal length (e.g. all truncated) give a "
                "loss value of 0; nothing to change for this"
            )
        else:
            fs = _g(f) if f is not None else "?"
            line = (
                f"{head} with grad_norm {g} although not every advantage is 0 "
                f"(frac_reward_zero_std {fs}): not expected, no token carries a gradient; check "
                "that completions keep loss tokens (mask_truncated_completions: true with every "
                "completion truncated masks them all: raise max_completion_length) and the "
                "reward_weights"
            )
        return True, line, need

    def _reward_silent(self, m) -> list[tuple]:
        out, K = [], int(self.p["reward_silent_steps"])
        for key in [k for k in m if _is_reward_mean(k)]:
            name = key[8:-5]
            mean, std = _num(m[key]), _num(m.get(f"rewards/{name}/std"))
            r = self.rewards.setdefault(name, {"n": 0, "means": [], "varied": False})
            r["n"] += 1
            if mean is not None:
                if (std or 0.0) > 0 or any(abs(mean - x) > 1e-9 for x in r["means"][:1]):
                    r["varied"] = True
                r["means"] = r["means"][:1] or [mean]
            if r["varied"]:
                out.append((f"reward_silent/{name}", False, f"{name} varies", K))
            elif r["n"] >= K:
                out.append((f"reward_silent/{name}", True, self._silent_line(name, r, K), 1))
        return out

    def _silent_line(self, name: str, r: dict, K: int) -> str:
        if not r["means"]:
            what = "returned None (no score) for every completion"
        elif r["means"][0] == 0.0:
            what = "never fired: it returned 0 for every completion"
        else:
            what = f"returned the same value ({_g(r['means'][0])}) for every completion"
        return (
            f"reward function {name} {what} over the first {K} "
            "steps, so it adds nothing to the advantages; check that it matches the completions' "
            "format and the dataset columns it reads, or drop it from reward_funcs"
        )

    def _hacking(self, acc: float, n: int) -> tuple[bool | None, str]:
        prev, steps = self.last_eval, self.hist["interval"]
        if prev is None or len(steps) < 2:
            return None, ""
        k = max(1, min(5, len(steps) // 2))
        first, last = steps[:k], steps[-k:]

        def mean(rows, name=None):
            vals = [r[1] if name is None else r[2].get(name) for r in rows]
            vals = [v for v in vals if v is not None]
            return sum(vals) / len(vals) if vals else None

        r0, r1 = mean(first), mean(last)
        p0, n0 = prev[1], prev[2]
        noise = 2 * math.sqrt(p0 * (1 - p0) / n0 + acc * (1 - acc) / n)
        if not (r1 > r0 and p0 - acc > max(noise, 0.02)):  # clears once accuracy recovers
            return (False if acc > p0 else None), f"held-out accuracy {acc:.1%} (was {p0:.1%})"
        rises = {f: (mean(last, f) or 0.0) - (mean(first, f) or 0.0) for f in last[-1][2]}
        names = [f"{f} {d:+.3g}" for f, d in sorted(rises.items(), key=lambda x: -x[1]) if d > 0]
        line = (
            f"training reward rose {_g(r0)} -> {_g(r1)} while held-out "
            f"accuracy fell {p0:.1%} -> {acc:.1%} (steps {prev[0]} -> {steps[-1][0]}): the "
            f"policy may be gaming {', '.join(names) or 'the rewards'}; read completions.jsonl, "
            "tighten those reward functions or lower their reward_weights"
        )
        return True, line


def _is_reward_mean(k: str) -> bool:
    return k.startswith("rewards/") and k.endswith("/mean")
