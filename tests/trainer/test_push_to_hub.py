"""push_to_hub: real runs of ``grpokit train`` that upload through huggingface_hub's own
client to a local HTTP server standing in for the hub (HF_ENDPOINT). The server speaks
the few routes an upload uses (whoami-v2, repos/create, preupload, commit with files sent
inline) and keeps what it receives, so the test compares the uploaded bytes with the files
on disk. A hub that cannot take the uploads fails the run at its start, before any model
loads."""

import base64
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from grpokit.testing import tiny_run_config

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_test_write_token"


class _Hub(BaseHTTPRequestHandler):
    repos: dict  # repo id -> {path: bytes}
    log: list  # (method, path, detail)

    def log_message(self, *a):
        pass

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {TOKEN}":
            return True
        self._reply(401, {"error": "Invalid credentials in Authorization header"})
        return False

    def do_GET(self):
        if not self._authorised():
            return
        if self.path == "/api/whoami-v2":
            self.log.append(("GET", "whoami", None))
            return self._reply(200, {"name": "tester", "type": "user", "orgs": []})
        self._reply(404, {"error": "not here"})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not self._authorised():
            return
        if self.path == "/api/repos/create":
            req = json.loads(body)
            repo = f"{req.get('organization') or 'tester'}/{req['name']}"
            self.repos.setdefault(repo, {})
            self.log.append(("POST", "create", (repo, req.get("visibility"))))
            return self._reply(200, {"url": f"http://{self.headers['Host']}/{repo}"})
        parts = self.path.split("?")[0].split("/")  # /api/models/<org>/<name>/<verb>/<rev>
        repo, verb = f"{parts[3]}/{parts[4]}", parts[5]
        if verb == "preupload":
            files = [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                for f in json.loads(body)["files"]
            ]
            return self._reply(200, {"files": files})
        if verb == "commit":
            lines = [json.loads(x) for x in body.splitlines() if x.strip()]
            message = next(x["value"]["summary"] for x in lines if x["key"] == "header")
            paths = []
            for x in lines:
                if x["key"] == "file":
                    self.repos[repo][x["value"]["path"]] = base64.b64decode(x["value"]["content"])
                    paths.append(x["value"]["path"])
            self.log.append(("POST", "commit", (repo, message, sorted(paths))))
            return self._reply(
                200,
                {
                    "commitUrl": f"http://{self.headers['Host']}/{repo}/commit/1",
                    "commitOid": "1" * 40,
                },
            )
        self._reply(404, {"error": "not here"})


@pytest.fixture
def hub():
    handler = type("Hub", (_Hub,), {"repos": {}, "log": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()


def _train(tmp_path, tiny_model_dir, endpoint, token, **overrides):
    out = tmp_path / "run"
    values = tiny_run_config(tiny_model_dir, out, **overrides).to_dict()
    values["hub_token"] = overrides.get("hub_token")  # to_dict leaves the token out
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(values))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
    )  # fmt: skip
    if token:
        env["HF_TOKEN"] = token
    r = subprocess.run(
        [sys.executable, "-m", "grpokit", "train", str(recipe)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return r, out


def test_all_checkpoints_and_the_final_model_are_uploaded(tmp_path, tiny_model_dir, hub):
    endpoint, h = hub
    r, out = _train(
        tmp_path, tiny_model_dir, endpoint, TOKEN, push_to_hub=True, hub_model_id="grpo-tiny",
        hub_strategy="all_checkpoints", hub_private_repo=True, save_steps=1,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    files = h.repos["tester/grpo-tiny"]
    assert h.log[:2] == [
        ("GET", "whoami", None),
        ("POST", "create", ("tester/grpo-tiny", "private")),
    ]
    commits = [d[1] for m, what, d in h.log if what == "commit"]
    assert commits == [
        "grpokit: step 1", "grpokit: step 1: checkpoint",
        "grpokit: step 2", "grpokit: step 2: checkpoint", "grpokit: end of training",
    ]  # fmt: skip
    for step in (1, 2):  # each whole checkpoint in its own folder, byte for byte
        ckpt = out / f"checkpoint-{step}"
        for f in ckpt.iterdir():
            assert files[f"checkpoint-{step}/{f.name}"] == f.read_bytes(), f.name
    # the repo root holds the model (never optimizer or trainer state): the final one last
    final = out / "final"
    for f in final.iterdir():
        assert files[f.name] == f.read_bytes(), f.name
    assert not any(k in files for k in ("optimizer.pt", "trainer_state.json", "rng.pt"))
    # the token went over the wire only: never into the run's files
    for p in out.rglob("*"):
        if p.is_file():
            assert TOKEN.encode() not in p.read_bytes(), p


def test_hub_strategy_end_uploads_once(tmp_path, tiny_model_dir, hub):
    endpoint, h = hub
    r, out = _train(
        tmp_path,
        tiny_model_dir,
        endpoint,
        None,
        push_to_hub=True,
        hub_strategy="end",
        save_steps=1,
        hub_token=TOKEN,
    )  # fmt: skip  (the recipe's hub_token, no HF_TOKEN)
    assert r.returncode == 0, r.stderr[-3000:]
    commits = [d for m, what, d in h.log if what == "commit"]
    assert [c[1] for c in commits] == ["grpokit: end of training"]
    assert commits[0][0] == "tester/run"  # hub_model_id unset: output_dir's name, user's namespace
    assert sorted(commits[0][2]) == sorted(p.name for p in (out / "final").iterdir())
    for p in out.rglob("*"):  # the recipe's token is never written into the run
        if p.is_file():
            assert TOKEN.encode() not in p.read_bytes(), p


@pytest.mark.parametrize(
    "endpoint,token,match",
    [
        ("http://127.0.0.1:9", TOKEN, "hub error: push_to_hub: the hub at http://127.0.0.1:9"),
        (None, None, "hub error: push_to_hub needs a Hugging Face token"),
        (None, "hf_wrong", "did not accept the token"),
    ],
)
def test_a_hub_that_cannot_take_the_uploads_fails_at_the_start(
    tmp_path, tiny_model_dir, hub, endpoint, token, match
):
    r, out = _train(
        tmp_path, tiny_model_dir, endpoint or hub[0], token, push_to_hub=True, max_steps=50
    )
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert match in err[-1] and "Traceback" not in r.stderr
    assert not out.exists() or not list(out.iterdir())  # nothing trained, nothing written
