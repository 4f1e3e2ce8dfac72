"""bench/learning.py replaces only the directories it made: a user's run given as --output_dir
is refused, never deleted."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "bench_learning", Path(__file__).resolve().parents[1] / "bench" / "learning.py"
)
learning = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learning)


def test_a_directory_it_did_not_make_is_refused_and_kept(tmp_path):
    run = tmp_path / "my_run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit, match="not made by bench/learning.py"):
        learning.clear_own_dir(run)
    assert (run / "metrics.jsonl").read_text() == "{}\n"


def test_its_own_directory_and_an_empty_one_are_replaced(tmp_path):
    for out in (tmp_path / "new", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        learning.clear_own_dir(out)
        (out / "old.json").write_text("x")
        learning.clear_own_dir(out)  # a re-run of the bench
        assert not (out / "old.json").exists()
        assert (out / learning.MARK).exists()


def test_a_directory_an_earlier_bench_made_is_replaced(tmp_path):
    one, seeds = tmp_path / "one", tmp_path / "seeds"
    one.mkdir()
    (one / "bench_learning.json").write_text("{}")  # a single run's result, before the mark
    (seeds / "seed-0").mkdir(parents=True)
    (seeds / "seed-0" / "metrics.jsonl").write_text("{}\n")
    (seeds / "bench_learning.json").write_text("{}")  # the --seeds parent's result
    for out in (one, seeds / "seed-0"):
        learning.clear_own_dir(out)
        assert [p.name for p in out.iterdir()] == [learning.MARK]
