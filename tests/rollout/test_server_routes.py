"""The rollout server's HTTP routes in the main env (no vLLM): its request handler around a
stand-in engine. Serving a real model is tested in tests/vllm (./run test-vllm)."""

import json
import threading
import urllib.error
import urllib.request
from http.server import HTTPServer

import pytest
import torch

from grpokit.rollout import vllm_engine
from grpokit.rollout.server import make_handler

INFO = {"status": "ok", "model": "m", "protocol": vllm_engine.PROTOCOL}
EXPECTED = {"w": (2, 2)}


@pytest.fixture
def server(monkeypatch):
    calls = []

    def run_vllm(llm, prompts, params, eos_ids, seeds):
        calls.append((llm, prompts, params, eos_ids, seeds))
        if params.max_new_tokens == 13:
            raise RuntimeError("engine failed")
        return [[7] * params.max_new_tokens for _ in prompts], [[-0.5] for _ in prompts]

    monkeypatch.setattr(vllm_engine, "run_vllm", run_vllm)
    monkeypatch.setattr(vllm_engine, "load_weights_into", lambda llm, w: float(len(w)))
    httpd = HTTPServer(("127.0.0.1", 0), make_handler("the-llm", INFO, EXPECTED))
    httpd.RequestHandlerClass.log_message = lambda *a: None
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", calls
    httpd.shutdown()
    httpd.server_close()
    t.join()


def _call(url, body=None):
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _generate(base, prompts, seeds, max_new_tokens=2):
    body = {"prompts": prompts, "seeds": seeds, "params": {"max_new_tokens": max_new_tokens}}
    return _call(base + "/generate", json.dumps({**body, "eos_ids": [0]}).encode())


def test_health_and_unknown_endpoints(server):
    base, _ = server
    assert _call(base + "/health") == (200, INFO)
    code, r = _call(base + "/nope")
    assert code == 404 and "try /health" in r["error"]
    code, r = _call(base + "/nope", b"{}")
    assert code == 404 and "no such endpoint /nope" in r["error"]


def test_generate_passes_the_request_to_the_engine(server):
    base, calls = server
    code, r = _generate(base, [[1, 2], [3]], [5, 6])
    assert code == 200 and r == {"token_ids": [[7, 7], [7, 7]], "logprobs": [[-0.5], [-0.5]]}
    llm, prompts, params, eos_ids, seeds = calls[0]
    assert (llm, prompts, eos_ids, seeds) == ("the-llm", [[1, 2], [3]], [0], [5, 6])
    assert params.max_new_tokens == 2


def test_bad_requests_are_400_and_failures_500(server):
    base, _ = server
    code, r = _generate(base, [[1]], [1, 2])
    assert code == 400 and "prompts and seeds differ in length" in r["error"]
    code, r = _call(base + "/generate", b"not json")
    assert code == 400 and r["error"].startswith("bad request")
    code, r = _generate(base, [[1]], [1], max_new_tokens=13)
    assert code == 500 and r["error"] == "RuntimeError: engine failed"
    assert _call(base + "/health")[0] == 200  # and the server goes on


def test_update_weights_checks_names_and_shapes(server):
    base, _ = server
    ok = vllm_engine.tensors_to_bytes({"w": torch.zeros(2, 2)})
    assert _call(base + "/update_weights", ok) == (200, {"seconds": 1.0})
    bad = vllm_engine.tensors_to_bytes({"w": torch.zeros(3, 2), "extra": torch.zeros(1)})
    code, r = _call(base + "/update_weights", bad)
    assert code == 400 and "do not fit the served model" in r["error"]
    assert "w (3, 2) (server (2, 2))" in r["error"] and "unknown tensor extra" in r["error"]


def test_generate_names_the_weights_it_expects(server):
    """A push sets the served version; a request for another version is refused (409)
    instead of sampling stale weights, and a failed push leaves no version to match."""
    base, _ = server
    ok = vllm_engine.tensors_to_bytes({"w": torch.zeros(2, 2)})
    assert _call(base + "/update_weights?version=run-1", ok)[0] == 200
    assert _call(base + "/health")[1]["weights_version"] == "run-1"

    def gen(version):
        body = {"prompts": [[1]], "seeds": [1], "params": {"max_new_tokens": 1}}
        body.update(eos_ids=[0], weights_version=version)
        return _call(base + "/generate", json.dumps(body).encode())

    assert gen("run-1")[0] == 200
    code, r = gen("run-0")
    assert code == 409 and "weights version 'run-0' but the server holds 'run-1'" in r["error"]
    bad = vllm_engine.tensors_to_bytes({"w": torch.zeros(3, 2)})
    assert _call(base + "/update_weights?version=run-2", bad)[0] == 400
    assert gen("run-1")[0] == 409 and gen("run-2")[0] == 409
