"""``grpokit rollout-server``: a vLLM generation server for ``vllm_mode: server``.

Standard library HTTP, one request at a time on the main thread, JSON in and out:

    GET  /health          model, grpokit version, protocol, model signature, tokenizer size,
                          the version of the weights it holds
    POST /generate        {"prompts": [[ids]], "seeds": [int], "params": {...}, "eos_ids": [..],
                           "weights_version": str or null}
                          -> {"token_ids": [[ids]], "logprobs": [[float]]}; a request for
                          weights other than those held -> 409 (it would sample stale ones)
    POST /update_weights?version=V  body: a safetensors file of the policy's state dict (HF
                          names) -> {"seconds": float}; names or shapes that do not match -> 400

One server serves every process of one training run (``torchrun`` / ``accelerate launch``):
requests wait their turn in the listen queue; rank 0 alone pushes weights.
"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlsplit

from grpokit.rollout.base import SamplingParams


def serve(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    dtype: str = "float32",
    max_model_len: int | None = None,
    gpu_memory_utilization: float = 0.9,
    enforce_eager: bool = True,
    seed: int = 0,
    ready=None,
) -> None:
    """Load ``model`` into vLLM and answer requests until interrupted."""
    from grpokit.rollout.vllm_engine import make_llm

    t0 = time.time()
    llm = make_llm(
        model,
        dtype=dtype,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        enforce_eager=enforce_eager,
        seed=seed,
    )
    info = _health_info(model, dtype)
    # the names and shapes a weight update must have (checkpoint names of the HF model)
    expected = _expected_shapes(model)
    # one thread: every vLLM call runs on the thread that built the engine (a weight reload
    # from a handler thread gave wrong outputs), and requests are served one at a time
    httpd = _Server((host, port), make_handler(llm, info, expected))
    print(
        f"[rollout-server] {model} ready on http://{host}:{port} "
        f"(vllm {info['vllm_version']}, start-up {time.time() - t0:.1f} s)",
        flush=True,
    )
    if ready is not None:
        ready(httpd)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()


class _Server(HTTPServer):
    request_queue_size = 128  # every training process may connect at once (default 5)


class Conflict(Exception):
    """A request that must not be served with the weights the server holds (HTTP 409)."""


def _health_info(model: str, dtype: str) -> dict:
    """What GET /health answers: the trainer checks it fits before the first request."""
    import vllm
    from transformers import AutoConfig, AutoTokenizer

    import grpokit
    from grpokit.rollout.vllm_engine import PROTOCOL, model_signature

    tok = AutoTokenizer.from_pretrained(model)
    return {
        "status": "ok",
        "model": model,
        "grpokit_version": grpokit.__version__,
        "vllm_version": vllm.__version__,
        "protocol": PROTOCOL,
        "model_signature": model_signature(AutoConfig.from_pretrained(model)),
        "tokenizer_size": len(tok),
        "dtype": dtype,
        "weights_version": None,  # None: the model's files; then the last push's version
    }


def make_handler(llm, info: dict, expected: dict[str, tuple]) -> type[BaseHTTPRequestHandler]:
    """The requests of a server for ``llm``: GET /health, POST /generate, /update_weights.
    A bad request is a 400, any other failure a 500 (the server keeps going)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # one line per request on stderr, no noise
            sys.stderr.write(f"[rollout-server] {self.command} {self.path} {fmt % args}\n")

        def _send(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            n = int(self.headers.get("Content-Length", "0"))
            return self.rfile.read(n)

        def do_GET(self):
            if self.path == "/health":
                self._send(200, info)
            else:
                self._send(404, {"error": f"no such endpoint {self.path}; try /health"})

        def do_POST(self):
            url = urlsplit(self.path)
            try:
                if url.path == "/generate":
                    self._send(200, _generate(llm, self._body(), info))
                elif url.path == "/update_weights":
                    version = parse_qs(url.query).get("version", [None])[0]
                    info["weights_version"] = "(a push that failed)"
                    self._send(200, _update_weights(llm, expected, self._body()))
                    info["weights_version"] = version
                else:
                    self._send(404, {"error": f"no such endpoint {self.path}"})
            except Conflict as e:
                self._send(409, {"error": str(e)})
            except (ValueError, KeyError, TypeError) as e:
                self._send(400, {"error": f"bad request: {e}"})
            except Exception as e:  # noqa: BLE001 - reported to the trainer, server keeps going
                self._send(500, {"error": f"{type(e).__name__}: {e}"})

    return Handler


def _generate(llm, body: bytes, info: dict) -> dict:
    """POST /generate: sample the prompts, one seed each, from the weights the request names."""
    from grpokit.rollout.vllm_engine import run_vllm

    req = json.loads(body)
    want, have = req.get("weights_version"), info.get("weights_version")
    if want != have:
        raise Conflict(
            f"this request is for weights version {want!r} but the server holds {have!r}: "
            "another training run pushed to this server since (one server serves one run), "
            "or this run's last push did not complete"
        )
    params = SamplingParams(**req["params"])
    prompts, seeds = req["prompts"], req["seeds"]
    if len(prompts) != len(seeds):
        raise ValueError("prompts and seeds differ in length")
    ids, lps = run_vllm(llm, prompts, params, req["eos_ids"], seeds)
    return {"token_ids": ids, "logprobs": lps}


def _update_weights(llm, expected: dict[str, tuple], body: bytes) -> dict:
    """POST /update_weights: load the policy's weights (a safetensors file) into ``llm``."""
    from grpokit.rollout.vllm_engine import load_weights_into, tensors_from_bytes

    weights = tensors_from_bytes(body)
    _check_weights(weights, expected)
    return {"seconds": load_weights_into(llm, weights)}


def _expected_shapes(model: str) -> dict[str, tuple]:
    """Checkpoint tensor names and shapes, read from the model's safetensors headers."""
    from pathlib import Path

    from safetensors import safe_open

    out: dict[str, tuple] = {}
    for f in sorted(Path(model).glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            for k in sf.keys():
                out[k] = tuple(sf.get_slice(k).get_shape())
    return out


def _check_weights(weights: dict, expected: dict[str, tuple]) -> None:
    if not expected:
        return  # no safetensors files to compare against (e.g. a .bin checkpoint)
    bad = [
        f"{k} {tuple(v.shape)} (server {expected[k]})"
        for k, v in weights.items()
        if k in expected and tuple(v.shape) != expected[k]
    ]
    unknown = [k for k in weights if k not in expected and not k.endswith("lm_head.weight")]
    if bad or unknown:
        raise ValueError(
            "the pushed weights do not fit the served model: "
            + "; ".join(bad[:3] + [f"unknown tensor {k}" for k in unknown[:3]])
            + " - serve the training model"
        )
