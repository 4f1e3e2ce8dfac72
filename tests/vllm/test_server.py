"""``grpokit rollout-server`` as a separate process: weights pushed over HTTP reach it
(greedy equality with the trainer's model afterwards), a mismatched model is refused, and a
server that dies or hangs gives a clear error within the timeout instead of a hang."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here; run ./run test-vllm")
import torch

from grpokit.rollout.base import SamplingParams
from grpokit.rollout.hf import HFRolloutEngine
from grpokit.rollout.vllm_engine import VLLMError, VLLMServerEngine

from .conftest import REAL_MODEL, make_vllm_tiny

GREEDY = SamplingParams(max_new_tokens=16, greedy=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: str, port: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="2")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "grpokit",
            "rollout-server",
            "--model",
            model_dir,
            "--port",
            str(port),
            "--max_model_len",
            "256",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def server(vllm_tiny_dir):
    port = free_port()
    proc = start_server(vllm_tiny_dir, port)
    yield proc, port
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _load(path):
    from grpokit.models import load_model_and_tokenizer

    model, tok, _ = load_model_and_tokenizer(path)
    return model.eval(), tok


def _prompts(tok):
    enc = tok(["3 + 4 =", "hello world, the", "a b c d e"], return_tensors="pt", padding=True)
    return enc.input_ids, enc.attention_mask


def test_server_weight_push_then_greedy_equals_trainer(server, vllm_tiny_dir):
    proc, port = server
    model, tok = _load(vllm_tiny_dir)
    eng = VLLMServerEngine(model, tok, "127.0.0.1", port, timeout=180)
    assert eng.info["model_signature"]["hidden_size"] == 64
    ids, mask = _prompts(tok)
    hf = HFRolloutEngine(model, tok)
    before = hf.generate(ids, mask, GREEDY)
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    eng.weights_updated()
    after = hf.generate(ids, mask, GREEDY)
    assert not torch.equal(after.completion_ids, before.completion_ids)
    got = eng.generate(ids, mask, GREEDY)
    print(f"server weight push {eng.sync_seconds:.3f} s")
    assert torch.equal(got.completion_mask, after.completion_mask)
    assert torch.equal(got.completion_ids, after.completion_ids)
    assert got.sampling_logps is not None


def test_mismatched_model_is_refused(server, tmp_path):
    _, port = server
    other = make_vllm_tiny(tmp_path / "other", seed=1)
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(other)
    cfg.num_hidden_layers = 3
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_config(cfg)
    tok = AutoTokenizer.from_pretrained(other)
    with pytest.raises(VLLMError, match=r"num_hidden_layers: server 2 vs trainer 3"):
        VLLMServerEngine(model, tok, "127.0.0.1", port, timeout=60)


def test_wrong_weights_are_refused_by_the_server(server, vllm_tiny_dir):
    _, port = server
    model, tok = _load(vllm_tiny_dir)
    eng = VLLMServerEngine(model, tok, "127.0.0.1", port, timeout=60)
    eng.model = torch.nn.Linear(3, 3)  # the push carries tensors the server does not have
    with pytest.raises(VLLMError, match="HTTP 400.*do not fit the served model"):
        eng.sync_weights()


def test_hung_server_times_out(vllm_tiny_dir):
    """A server that accepts connections and never answers: an error after the timeout."""
    model, tok = _load(vllm_tiny_dir)
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    port = lsock.getsockname()[1]
    held = []
    stop = threading.Event()

    def accept():
        lsock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(lsock.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        # the client's own timeout ends the wait (a hang would never raise)
        with pytest.raises(
            VLLMError, match="no rollout server answered.*within vllm_server_timeout=3 s"
        ):
            VLLMServerEngine(model, tok, "127.0.0.1", port, timeout=3)
    finally:
        stop.set()
        t.join()
        lsock.close()


def test_server_killed_mid_run_gives_a_clear_error_quickly(vllm_tiny_dir):
    port = free_port()
    proc = start_server(vllm_tiny_dir, port)
    try:
        model, tok = _load(vllm_tiny_dir)
        eng = VLLMServerEngine(model, tok, "127.0.0.1", port, timeout=180)
        ids, mask = _prompts(tok)
        eng.generate(ids, mask, GREEDY)  # works while it lives
        long = SamplingParams(max_new_tokens=200, min_new_tokens=200)
        big_ids, big_mask = ids.repeat(8, 1), mask.repeat(8, 1)
        errors = []

        def run():
            try:
                eng.generate(big_ids, big_mask, long, num_generations=8)
            except VLLMError as e:
                errors.append(e)

        th = threading.Thread(target=run)
        th.start()
        time.sleep(1.0)  # the request is in flight
        os.killpg(proc.pid, signal.SIGKILL)
        th.join(timeout=60)  # far below the client's 180 s timeout: a hang guard
        assert not th.is_alive(), "the client hung after the server died"
        # the lost connection was noticed as such, not by waiting out the timeout
        assert errors and "rollout server" in str(errors[0]) and "Is it running" in str(errors[0])
        assert "did not answer within" not in str(errors[0])
        with pytest.raises(VLLMError, match="Is it running"):  # and the next request too
            eng.generate(ids, mask, GREEDY)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_grpo_steps_with_the_server(server, vllm_tiny_dir, tmp_path):
    """A short GRPO run with vllm_mode: server; afterwards the server holds the trained
    weights (its greedy output equals the trained model's)."""
    import json

    from grpokit.testing import tiny_run_config
    from grpokit.trainer import GRPOTrainer

    _, port = server
    cfg = tiny_run_config(
        vllm_tiny_dir,
        tmp_path / "run",
        use_vllm=True,
        vllm_mode="server",
        vllm_server_port=port,
        vllm_server_timeout=120,
        max_steps=3,
        max_completion_length=8,
        learning_rate=1e-2,
        write_report=False,
    )
    tr = GRPOTrainer(cfg)
    tr.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    assert len(rows) == 3
    for r in rows:
        assert r["sampling/sampling_logp_difference/mean"] < 1e-3  # fp32 on both sides
        assert r["sampling/is_capped_frac"] == 0.0
        assert r["time/weight_sync"] > 0
    ids, mask = _prompts(tr.tokenizer)
    tr.model.eval()
    mine = HFRolloutEngine(tr.model, tr.tokenizer).generate(ids, mask, GREEDY)
    tr.engine.weights_updated()  # the last step's weights are pushed before this request
    theirs = tr.engine.generate(ids, mask, GREEDY)
    assert torch.equal(theirs.completion_ids, mine.completion_ids)


@pytest.mark.skipif(not os.path.isdir(REAL_MODEL), reason=f"{REAL_MODEL} is not on this machine")
def test_real_model_server_greedy_equal_after_push():
    """SmolLM2-135M-Instruct, fp32: after a weight push, 3 chat prompts decoded greedily to
    their EOS give the same tokens from the server as from the trainer's model."""
    model, tok = _load(REAL_MODEL)
    port = free_port()
    proc = start_server(REAL_MODEL, port)
    try:
        eng = VLLMServerEngine(model, tok, "127.0.0.1", port, timeout=300)
        msgs = [
            [{"role": "user", "content": q}]
            for q in ["What is 12 + 7?", "Name three colors.", "Write a haiku about rain."]
        ]
        texts = [
            tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in msgs
        ]
        enc = tok(texts, return_tensors="pt", padding=True)
        with torch.no_grad():
            g = torch.Generator().manual_seed(0)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 1e-3)
        eng.weights_updated()
        params = SamplingParams(max_new_tokens=48, greedy=True)
        got = eng.generate(enc.input_ids, enc.attention_mask, params)
        print(f"SmolLM2 fp32 weight push over HTTP: {eng.sync_seconds:.2f} s")
        ref = HFRolloutEngine(model, tok).generate(enc.input_ids, enc.attention_mask, params)
        assert not ref.truncated.any()  # all three reach EOS: the whole answer is compared
        assert torch.equal(got.completion_ids, ref.completion_ids)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
