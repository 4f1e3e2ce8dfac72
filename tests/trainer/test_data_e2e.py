"""Data the way the documents give it, end to end on the tiny model: a directory of parquet
shards with no held-out split and plain-string prompts (TRL's standard format) trains with
evaluation skipped, the prompts going to the model without a chat template; ``do_eval: true``
on the same data is a one-line error naming the split and the fix."""

import json
import logging

import pytest

from grpokit.config import build_config
from grpokit.evaluation import held_out_rows
from grpokit.setup import build_task
from grpokit.tasks import TaskDataError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _shards(root, n_rows=24):
    (root / "data").mkdir(parents=True)
    rows = [{"prompt": f"Count to {i}:", "completion": "x"} for i in range(n_rows)]
    for s in range(2):
        part = rows[s * n_rows // 2 : (s + 1) * n_rows // 2]
        pq.write_table(
            pa.Table.from_pylist(part), root / "data" / f"train-{s:05d}-of-00002.parquet"
        )
    return {r["prompt"] for r in rows}


def _values(tmp_path, data, **kw):
    return dict(
        task="custom",
        dataset_name=str(data),
        reward_funcs=[{"length_target": {"target_length": 4}}],
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=4,
        learning_rate=1e-3,
        max_steps=2,
        save_steps=0,
        max_eval_samples=4,
        log_completions=True,
        seed=0,
        output_dir=str(tmp_path / "run"),
        **kw,
    )


def test_no_held_out_split_trains_with_evaluation_skipped(tmp_path, tiny_model_dir, caplog):
    from grpokit.trainer import GRPOTrainer

    prompts = _shards(tmp_path / "data")
    cfg = build_config(_values(tmp_path, tmp_path / "data", model_name_or_path=tiny_model_dir))
    assert cfg.do_eval is None
    with caplog.at_level(logging.INFO, logger="grpokit"):
        tr = GRPOTrainer(cfg)
        res = tr.train()
    assert res["step"] == 2
    skipped = [r.getMessage() for r in caplog.records if "evaluation is skipped" in r.getMessage()]
    assert len(skipped) == 1 and "'test'" in skipped[0] and "test_size" in skipped[0]
    assert not list((tmp_path / "run").glob("eval_*.json"))
    table = [
        json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()
    ]
    assert table and {r["prompt"] for r in table} <= prompts  # the plain strings themselves
    # the model input is the string itself: its token ids, no chat template around them
    tok = tr.tokenizer
    text = tr.train_rows[0]["prompt"]
    assert isinstance(text, str) and text in prompts
    assert (
        "<|im_start|>" not in text
        and tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        != text
    )


def test_do_eval_true_without_the_split_is_an_error(tmp_path):
    _shards(tmp_path / "data")
    cfg = build_config(_values(tmp_path, tmp_path / "data", do_eval=True))
    with pytest.raises(TaskDataError) as e:
        held_out_rows(cfg, build_task(cfg))
    msg = str(e.value)
    assert "do_eval is true" in msg and "no 'test' split" in msg
    assert "test_size" in msg and "do_eval: false" in msg and "\n" not in msg


def test_held_out_split_present_or_held_out_is_used(tmp_path):
    _shards(tmp_path / "data")
    cfg = build_config(_values(tmp_path, tmp_path / "data", task_params={"test_size": 6}))
    task = build_task(cfg)
    rows = held_out_rows(cfg, task)
    assert len(rows) == 4  # max_eval_samples of the 6 held out
    assert not {r["prompt"] for r in rows} & {r["prompt"] for r in task.build("train")}
    off = build_config(_values(tmp_path, tmp_path / "missing-dir", do_eval=False))
    assert held_out_rows(off, build_task(off)) == []  # nothing is even read
