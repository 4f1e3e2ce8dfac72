"""The shared loader: local files and directories, hub ids (faked), hold-out, clear errors."""

import json
import sys
import types

import pytest

from grpokit.tasks import TaskDataError, get_task
from grpokit.tasks.base import holdout
from grpokit.tasks.sources import load_table, read_file


def test_jsonl_json_csv(tmp_path, write_jsonl):
    rows = [{"question": "a", "answer": "#### 1"}, {"question": "b", "answer": "#### 2"}]
    write_jsonl(tmp_path / "x.jsonl", rows)
    (tmp_path / "x.json").write_text(json.dumps(rows))
    (tmp_path / "d.json").write_text(json.dumps({"data": rows}))
    (tmp_path / "c.json").write_text(json.dumps({"question": ["a", "b"], "answer": ["1", "2"]}))
    (tmp_path / "x.csv").write_text("question,answer\na,#### 1\nb,#### 2\n")
    for name in ("x.jsonl", "x.json", "d.json", "x.csv"):
        assert read_file(tmp_path / name) == rows, name
    assert read_file(tmp_path / "c.json") == [
        {"question": "a", "answer": "1"},
        {"question": "b", "answer": "2"},
    ]


def test_bad_json_names_the_line(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(TaskDataError, match=r"x.jsonl:2"):
        read_file(tmp_path / "x.jsonl")


def test_directory_splits_and_shards(tmp_path, write_jsonl):
    write_jsonl(tmp_path / "a" / "train.jsonl", [{"x": 1}])
    write_jsonl(tmp_path / "a" / "test.jsonl", [{"x": 2}])
    assert load_table(str(tmp_path / "a"), "test") == [{"x": 2}]
    write_jsonl(tmp_path / "b" / "data" / "train-00000-of-00002.jsonl", [{"x": 1}])
    write_jsonl(tmp_path / "b" / "data" / "train-00001-of-00002.jsonl", [{"x": 3}])
    assert load_table(str(tmp_path / "b"), "train") == [{"x": 1}, {"x": 3}]
    with pytest.raises(TaskDataError, match="no 'test' split"):
        load_table(str(tmp_path / "b"), "test")


def test_missing_path_names_it_and_the_fix(tmp_path):
    missing = tmp_path / "nope" / "train.jsonl"
    with pytest.raises(TaskDataError, match="does not exist") as e:
        load_table(str(missing), "train")
    assert str(missing) in str(e.value)
    with pytest.raises(TaskDataError, match="does not exist"):
        get_task("gsm8k", dataset_name="./no/such/dir").build("train")


def test_local_files_without_datasets_say_how_to_install(tmp_path, monkeypatch, write_jsonl):
    write_jsonl(tmp_path / "x.jsonl", [{"a": 1}])
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(TaskDataError, match="pip install datasets"):
        read_file(tmp_path / "x.jsonl")


def test_broken_parquet_is_one_clear_error(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(TaskDataError, match=r"cannot read .*x.parquet"):
        read_file(tmp_path / "x.parquet")


def test_parquet_roundtrip(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    pq.write_table(pa.table({"nums": [[1, 2, 3]], "target": [6]}), tmp_path / "train.parquet")
    rows = get_task("countdown", dataset_name=str(tmp_path), test_size=None).load_rows("train")
    assert rows == [{"nums": [1, 2, 3], "target": 6}]


class _FakeDatasets(types.ModuleType):
    def __init__(self, data):
        super().__init__("datasets")
        self.data, self.calls = data, []

    def load_dataset(self, path, name=None, split=None):
        self.calls.append((path, name, split))
        if (path, split) not in self.data:
            raise ValueError(f'Unknown split "{split}". Should be one of ["train"].')
        return self.data[(path, split)]


def test_hub_ids_go_through_datasets_load_dataset(monkeypatch):
    rows = [{"question": f"q{i}", "answer": f"x #### {i},000"} for i in range(4)]
    fake = _FakeDatasets({("openai/gsm8k", "test"): rows})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    built = get_task("gsm8k", dataset_name="openai/gsm8k").build("test")
    assert fake.calls == [("openai/gsm8k", "main", "test")]
    assert [r["answer"] for r in built] == ["0000", "1000", "2000", "3000"]


def test_hub_without_a_test_split_suggests_test_size(monkeypatch):
    rows = [{"nums": [1, 2, 3], "target": t} for t in range(10)]
    fake = _FakeDatasets({("Jiayi-Pan/Countdown-Tasks-3to4", "train"): rows})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    t = get_task("countdown", dataset_name="Jiayi-Pan/Countdown-Tasks-3to4")
    with pytest.raises(TaskDataError, match="test_size"):
        t.build("test")
    t = get_task("countdown", dataset_name="Jiayi-Pan/Countdown-Tasks-3to4", test_size=3)
    test, train = t.build("test"), t.build("train")
    assert len(test) == 3 and len(train) == 7
    assert {r["target"] for r in test}.isdisjoint(r["target"] for r in train)
    hub = "Jiayi-Pan/Countdown-Tasks-3to4"
    assert fake.calls == [(hub, None, "test"), (hub, None, "train")]  # train read once


def test_hub_without_datasets_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(TaskDataError, match="pip install datasets"):
        load_table("openai/gsm8k", "train", "main")


def test_hub_unreachable_message(monkeypatch):
    fake = types.ModuleType("datasets")

    def load_dataset(*a, **k):
        raise ConnectionError("offline")

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(TaskDataError, match="unreachable"):
        load_table("someone/data", "train")


def test_empty_dataset_and_missing_columns(tmp_path, write_jsonl):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "train.jsonl").write_text("\n")
    with pytest.raises(TaskDataError, match="empty"):
        get_task("gsm8k", dataset_name=str(tmp_path / "empty")).build("train")
    write_jsonl(tmp_path / "bad" / "train.jsonl", [{"q": "x", "answer": "#### 1"}])
    with pytest.raises(TaskDataError, match="question"):
        get_task("gsm8k", dataset_name=str(tmp_path / "bad")).build("train")
    write_jsonl(tmp_path / "cd.jsonl", [{"numbers": [1, 2], "target": 3}])
    with pytest.raises(TaskDataError, match="nums"):
        get_task("countdown", dataset_name=str(tmp_path / "cd.jsonl")).build("train")


def test_one_file_has_no_test_split_unless_held_out(tmp_path, write_jsonl):
    f = write_jsonl(tmp_path / "all.jsonl", [{"prompt": f"p{i}"} for i in range(10)])
    t = get_task("tldr", dataset_name=str(f))
    assert len(t.build("train")) == 10
    with pytest.raises(TaskDataError, match="test_size"):
        t.build("test")
    t = get_task("tldr", dataset_name=str(f), test_size=0.3)
    test, train = t.build("test"), t.build("train")
    assert len(test) == 3 and len(train) == 7
    assert {r["text"] for r in test}.isdisjoint(r["text"] for r in train)


def test_holdout_is_seeded_disjoint_and_complete():
    rows = [{"i": i} for i in range(100)]
    a = holdout(rows, "test", 10, seed=1)
    assert a == holdout(rows, "test", 10, seed=1)
    assert a != holdout(rows, "test", 10, seed=2)
    train = holdout(rows, "train", 10, seed=1)
    assert sorted(r["i"] for r in a + train) == list(range(100))
    assert [r["i"] for r in train] == sorted(r["i"] for r in train)  # source order kept
    assert len(holdout(rows, "test", 0.25, seed=0)) == 25
    for bad in (0, 100, -1, True, "5"):
        with pytest.raises(TaskDataError):
            holdout(rows, "test", bad, seed=0)
