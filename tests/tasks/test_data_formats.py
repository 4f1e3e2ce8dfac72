"""Local data through the ``datasets`` library (parquet shards, .arrow, save_to_disk
directories, csv as strings), rows made when read, ms-swift's ``dataset#N`` sample, and the
hub path with the hub unreachable."""

import numpy as np
import pytest

from grpokit.tasks import TaskDataError, get_task, task_for_dataset
from grpokit.tasks.sources import load_table, parse_dataset_name, read_file, sample_indices

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _gsm8k_rows(lo, hi):
    return [{"question": f"q{i}", "answer": f"work #### {i}", "id": i} for i in range(lo, hi)]


def _shards(root, split, rows, n):
    (root / "data").mkdir(parents=True, exist_ok=True)
    per = -(-len(rows) // n)
    for s in range(n):
        part = pa.Table.from_pylist(rows[s * per : (s + 1) * per])
        pq.write_table(part, root / "data" / f"{split}-{s:05d}-of-{n:05d}.parquet")


def test_parquet_shard_directory_splits_in_order(tmp_path):
    _shards(tmp_path, "train", _gsm8k_rows(0, 25), 3)
    _shards(tmp_path, "test", _gsm8k_rows(100, 104), 1)
    t = get_task("gsm8k", dataset_name=str(tmp_path))
    train, test = t.build("train"), t.build("test")
    assert [r["answer"] for r in train] == [str(i) for i in range(25)]  # shard order kept
    assert [r["answer"] for r in test] == ["100", "101", "102", "103"]
    assert [r["answer"] for r in t.build("train", limit=7)] == [str(i) for i in range(7)]
    assert train[3]["prompt"][-1] == {"role": "user", "content": "q3"}
    assert set(train[3]) == {"prompt", "question", "answer"}  # the id column is not kept


def test_rows_are_made_when_read_not_at_build(tmp_path):
    _shards(tmp_path, "train", _gsm8k_rows(0, 50), 2)
    rows = get_task("gsm8k", dataset_name=str(tmp_path)).build("train")
    assert not isinstance(rows, list) and len(rows) == 50
    assert rows[-1]["answer"] == "49" and rows[10:12][1]["question"] == "q11"
    assert rows == [r for r in rows]  # the same rows each time they are read


def test_arrow_file_and_save_to_disk_directories(tmp_path):
    ds = datasets.Dataset.from_list(_gsm8k_rows(0, 6))
    datasets.DatasetDict(
        {"train": ds, "test": datasets.Dataset.from_list(_gsm8k_rows(50, 52))}
    ).save_to_disk(str(tmp_path / "dict"))
    t = get_task("gsm8k", dataset_name=str(tmp_path / "dict"))
    assert [r["answer"] for r in t.build("test")] == ["50", "51"]
    assert len(t.build("train")) == 6
    with pytest.raises(TaskDataError, match="no 'validation' split.*it has \\['train', 'test'\\]"):
        t.build("validation")
    ds.save_to_disk(str(tmp_path / "one"))
    one = get_task("gsm8k", dataset_name=str(tmp_path / "one"))
    assert [r["answer"] for r in one.build("train")] == [str(i) for i in range(6)]
    with pytest.raises(TaskDataError, match="serves as the 'train' split"):
        one.build("test")
    arrow = next((tmp_path / "one").glob("*.arrow"))
    assert read_file(arrow) == _gsm8k_rows(0, 6)


def test_csv_fields_stay_strings(tmp_path):
    (tmp_path / "x.csv").write_text("q,a,n\nhello,007,1\n,2.50,\n")
    assert read_file(tmp_path / "x.csv") == [
        {"q": "hello", "a": "007", "n": "1"},
        {"q": "", "a": "2.50", "n": ""},
    ]


def test_sample_indices_follow_ms_swift():
    """N < rows: the first N of numpy's RandomState(seed) permutation; N >= rows: every row
    N // rows times, then N % rows rows of that permutation."""
    assert sample_indices(10, 4, 42) == np.random.RandomState(42).permutation(10)[:4].tolist()
    assert sample_indices(10, 4, 42) != sample_indices(10, 4, 7)
    got = sample_indices(4, 11, 3)
    assert got[:8] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert got[8:] == np.random.RandomState(3).permutation(4)[:3].tolist()
    assert sample_indices(5, 10, 0) == [0, 1, 2, 3, 4] * 2


def test_dataset_name_sample_count(tmp_path, write_jsonl):
    write_jsonl(tmp_path / "d" / "train.jsonl", _gsm8k_rows(0, 20))
    write_jsonl(tmp_path / "d" / "test.jsonl", _gsm8k_rows(100, 103))
    t = get_task("gsm8k", dataset_name=f"{tmp_path / 'd'}#5", seed=42)
    want = np.random.RandomState(42).permutation(20)[:5].tolist()
    assert [r["answer"] for r in t.build("train")] == [str(i) for i in want]
    assert len(t.build("test")) == 3  # the held-out split is not sampled
    big = get_task("gsm8k", dataset_name=f"{tmp_path / 'd'}#45", seed=1).build("train")
    counts = np.bincount([int(r["answer"]) for r in big], minlength=20)
    assert len(big) == 45 and sorted(set(counts.tolist())) == [2, 3] and counts.sum() == 45
    # with test_size the hold-out comes first; the sample is drawn from the rest
    h = get_task("gsm8k", dataset_name=f"{tmp_path / 'd'}#4", test_size=5, seed=0)
    test = {r["answer"] for r in h.build("test")}
    train = [r["answer"] for r in h.build("train")]
    assert len(train) == 4 and not test & set(train)


def test_sample_count_syntax(tmp_path, write_jsonl):
    assert parse_dataset_name("zouxuhong/Countdown-Tasks-3to4#50000") == (
        "zouxuhong/Countdown-Tasks-3to4",
        50000,
    )
    assert task_for_dataset("zouxuhong/Countdown-Tasks-3to4#50000") == "countdown"
    for bad in ("owner/name#", "owner/name#abc", "owner/name#0", "#5"):
        with pytest.raises(TaskDataError, match="after '#' give the number"):
            get_task("gsm8k", dataset_name=bad)
    odd = write_jsonl(tmp_path / "a#3.jsonl", _gsm8k_rows(0, 5))  # an existing path is a path
    assert len(get_task("gsm8k", dataset_name=str(odd)).build("train")) == 5


def test_hub_unreachable_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(TaskDataError) as e:
        load_table("nobody-grpokit/no-such-dataset", "train")
    msg = str(e.value)
    assert "\n" not in msg and "nobody-grpokit/no-such-dataset" in msg
    assert "set dataset_name to its path" in msg


def test_hub_unreachable_fails_at_once(monkeypatch):
    """Without HF_HUB_OFFLINE, an unreachable hub (here: a closed local port) is one line at
    once, before ``datasets`` starts its half minute of retries."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(TaskDataError, match="the hub is unreachable") as e:
        get_task("math", dataset_name="open-r1/OpenR1-Math-220k#100").build("train")
    assert "\n" not in str(e.value) and "'open-r1/OpenR1-Math-220k'" in str(e.value)
