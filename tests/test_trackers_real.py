"""report_to with the real tracker libraries (tensorboard, wandb offline, mlflow, trackio):
one short run logs to all four, and each tracker's own storage is read back and compared
with metrics.jsonl, row by row. Each test is skipped when its library is not installed."""

import glob
import importlib.util
import json
import os
import struct
from pathlib import Path

import pytest

from grpokit.testing import tiny_run_config

TRACKERS = ["tensorboard", "wandb", "mlflow", "trackio"]
RUN_NAME = "tldr-lr3e-6"  # run_name: each tracker's own name for the run (not output_dir's)


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    have = []
    for name, module in zip(TRACKERS, ["tensorboard", "wandb", "mlflow", "trackio"]):
        # find_spec, not import: trackio fixes its storage directory when first imported
        if importlib.util.find_spec(module) is not None:
            have.append(name)
    if not have:
        pytest.skip("no tracker library installed")
    out = tmp_path_factory.mktemp("trackers") / "run"
    env = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(("WANDB_", "MLFLOW_"))}
    os.environ.pop("TRACKIO_DIR", None)
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(
        tiny_model_dir, out, max_steps=3, log_completions=True, report_to=have, run_name=RUN_NAME
    )
    try:
        GRPOTrainer(cfg).train()
    finally:
        os.environ.pop("TRACKIO_DIR", None)
        os.environ.update(env)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    completions = [json.loads(x) for x in (out / "completions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    return out, rows, completions


def _numbers(row):
    return {
        k: v
        for k, v in row.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _same(logged: dict, row: dict, rel=1e-6):
    want = _numbers(row)
    assert want, "no metrics to compare"
    missing = sorted(set(want) - set(logged))
    assert not missing, f"tracker lacks {missing}"
    for k, v in want.items():
        assert logged[k] == pytest.approx(v, rel=rel, abs=1e-7), k


def test_tensorboard(run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, rows, _ = run
    assert [p.name for p in (out / "tensorboard").iterdir()] == [RUN_NAME]
    ea = EventAccumulator(
        str(out / "tensorboard" / RUN_NAME), size_guidance={"scalars": 0, "tensors": 0}
    )
    ea.Reload()
    by_step: dict[int, dict] = {}
    for tag in ea.Tags()["scalars"]:
        for e in ea.Scalars(tag):
            by_step.setdefault(e.step, {})[tag] = e.value
    assert sorted(by_step) == [r["step"] for r in rows]
    for r in rows:
        _same(by_step[r["step"]], r, rel=1e-6)  # stored as float32
    text = ea.Tensors("completions/text_summary")
    assert [t.step for t in text] == [1, 2, 3]
    md = text[0].tensor_proto.string_val[0].decode()
    assert md.startswith("| prompt | completion | reward | advantage |")


def _wandb_records(path: str):
    """Records of a .wandb file (a LevelDB-style log of protobuf records: 7-byte file
    header, 32 KiB blocks, each chunk with crc32 / length / type)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", "not a .wandb file"
    block, pos, buf = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and n == 0:
            break
        buf += data[pos : pos + n]
        pos += n
        if kind in (1, 4):  # FULL or LAST chunk
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            buf = b""
            yield rec


def test_wandb_offline(run):
    pytest.importorskip("wandb")
    out, rows, completions = run
    files = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1, "one offline run"
    hist, names = [], []
    for rec in _wandb_records(files[0]):
        if rec.WhichOneof("record_type") == "run":
            names.append(rec.run.display_name)
        if rec.WhichOneof("record_type") == "history":
            hist.append(
                {
                    (i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                    for i in rec.history.item
                }
            )
    assert [h["_step"] for h in hist] == [r["step"] for r in rows]
    assert names and set(names) == {RUN_NAME}
    for h, r in zip(hist, rows):
        _same(h, r, rel=1e-12)
        assert h["completions_table/_type"] == "table-file"
        assert h["completions_table/nrows"] == sum(c["step"] == r["step"] for c in completions)
    tables = sorted(
        glob.glob(str(out / "wandb" / "offline-run-*" / "files" / "media" / "table" / "*.json"))
    )
    assert len(tables) == 3
    t = json.loads(Path(tables[0]).read_text())
    assert t["columns"][:4] == ["prompt", "completion", "reward", "advantage"]
    first = [c for c in completions if c["step"] == 1]
    assert [row[1] for row in t["data"]] == [c["completion"] for c in first]


def test_mlflow(run):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    out, rows, _ = run
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("grpokit")
    (r0,) = client.search_runs([exp.experiment_id])
    assert r0.info.run_name == RUN_NAME
    assert r0.data.params["learning_rate"] == "0.001"
    by_step: dict[int, dict] = {}
    for key in r0.data.metrics:
        for m in client.get_metric_history(r0.info.run_id, key):
            by_step.setdefault(m.step, {})[key] = m.value
    for r in rows:
        _same(by_step[r["step"]], r, rel=1e-12)
    arts = [a.path for a in client.list_artifacts(r0.info.run_id, "completions")]
    assert arts == [f"completions/step_{s:07d}.json" for s in (1, 2, 3)]
    assert (out / "mlartifacts").is_dir()


def test_trackio(run):
    pytest.importorskip("trackio")
    out, rows, _ = run
    os.environ["TRACKIO_DIR"] = str(out / "trackio")
    try:
        from trackio.sqlite_storage import SQLiteStorage

        assert SQLiteStorage.get_project_db_path("grpokit").parent == out / "trackio"
        assert SQLiteStorage.get_runs("grpokit") == [RUN_NAME]
        logs = SQLiteStorage.get_logs("grpokit", RUN_NAME)
    finally:
        os.environ.pop("TRACKIO_DIR", None)
    by_step: dict[int, dict] = {}
    for entry in logs:
        by_step.setdefault(entry["step"], {}).update(entry)
    assert sorted(by_step) == [r["step"] for r in rows]
    for r in rows:
        _same(by_step[r["step"]], r, rel=1e-12)
        assert "completions_table" in by_step[r["step"]]
