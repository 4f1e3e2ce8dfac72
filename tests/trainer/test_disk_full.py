"""A full disk while training: the run is not lost to a traceback at the first checkpoint.

The output directory is a real 96 KiB tmpfs (mounted in a user + mount namespace with
``unshare``), so the kernel itself answers ENOSPC: a checkpoint of the tiny model (~440 KB)
cannot fit, the metrics and evaluations (a few KB) can. Skipped where namespaces are not
allowed."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

RECIPE = dict(
    task="arithmetic",
    task_params={"digits": 1, "train_size": 64, "test_size": 4},
    num_generations=4,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=1,
    max_completion_length=6,
    learning_rate=1e-3,
    max_steps=2,
    save_steps=1,
    max_eval_samples=4,
    seed=11,
)


def _can_mount_tmpfs(where: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=96k none {where}"],
        capture_output=True,
    )
    return r.returncode == 0


def _train_on_tmpfs(tmp_path: Path, model: str, size: str, **overrides):
    """Train the tiny recipe with its output directory a tmpfs of ``size``; the directory's
    files are copied to ``keep`` at the end (the mount goes with the namespace). Returns the
    finished process, the output directory and ``keep``."""
    out, keep = tmp_path / "out", tmp_path / "keep"
    out.mkdir()
    keep.mkdir()
    if not _can_mount_tmpfs(out):
        pytest.skip("unshare cannot mount a tmpfs here")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "model_name_or_path": model, **overrides}))
    script = (
        f"mount -t tmpfs -o size={size} none {out} && "
        f"{sys.executable} -m grpokit train {recipe} --output_dir {out}; rc=$?; "
        f"cp -a {out}/. {keep}/; exit $rc"
    )
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300
    )
    return r, out, keep


def test_a_full_disk_skips_checkpoints_with_one_line_and_keeps_the_results(
    tmp_path, tiny_model_dir
):
    r, out, keep = _train_on_tmpfs(tmp_path, tiny_model_dir, "96k")

    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 1, r.stderr[-3000:]
    lines = [x for x in r.stderr.splitlines() if "not saved: no space left on device" in x]
    # checkpoint-1, checkpoint-2 and the final model: each said once, with the fix
    assert [x.split(" not saved")[0].split("] ")[-1] for x in lines] == [
        "checkpoint-1",
        "checkpoint-2",
        f"the final model ({out / 'final'})",
    ]
    assert all("save_total_limit" in x and "MB free" in x for x in lines)
    last = r.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("error: the final model was not saved")
        and "trained weights are lost" in last
    )
    # training went on: both steps logged, the skipped checkpoints counted; both evaluations
    rows = [json.loads(x) for x in (keep / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in rows if "loss" in x]
    assert [x["step"] for x in steps] == [1, 2]
    assert steps[-1]["checkpoints_not_saved"] == 1  # logged before step 2's own checkpoint
    summary = json.loads((keep / "eval_summary.json").read_text())
    assert set(summary) >= {"before", "after"}
    # no partial copy left behind to fill the disk further
    assert not [p.name for p in keep.iterdir() if p.name.startswith((".checkpoint", ".final"))]
    assert not (keep / "final").exists() and not list(keep.glob("checkpoint-*"))


def test_when_a_checkpoint_fits_but_the_final_model_does_not_resume_is_offered(
    tmp_path, tiny_model_dir
):
    """Room for the one checkpoint (step 2, ~440 KB), not for the final model (~150 KB) next
    to it: the closing line names the checkpoint to resume from, and it is complete."""
    r, out, keep = _train_on_tmpfs(
        tmp_path, tiny_model_dir, "520k", save_steps=2, write_report=False
    )

    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 1, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert "--resume: it continues from" in last and "checkpoint-2" in last, last
    assert (keep / "checkpoint-2" / "trainer_state.json").exists()
    assert not (keep / "final").exists() and not (keep / ".final.tmp").exists()


def test_a_disk_that_fills_during_the_optimizer_state_is_said_as_full(tmp_path, tiny_model_dir):
    """Room for the model's weights (~130 KB), not for the optimizer state next to them
    (~270 KB): torch.save's writer fails with a stream error that names no OS error (as on a
    real disk that filled up under a 50-step run), and that is told as a full disk too."""
    r, out, keep = _train_on_tmpfs(
        tmp_path, tiny_model_dir, "256k", max_steps=1, write_report=False
    )

    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [x for x in r.stderr.splitlines() if "not saved: no space left on device" in x]
    assert lines and lines[0].split(" not saved")[0].endswith("checkpoint-1"), r.stderr[-3000:]
    assert not [p.name for p in keep.iterdir() if p.name.startswith(".checkpoint")]
    assert not list(keep.glob("checkpoint-*"))
