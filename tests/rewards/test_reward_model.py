"""Reward models as reward_funcs entries: loaded from a directory, scored as TRL scores them.

Every expected score is an independent forward: the text built by hand (the ChatML rendering
written out here, not the tokenizer's template), tokenized alone (no padding), run through the
backbone, and the classifier head applied to the last hidden state by a matrix product.
"""

import math
import socket
from pathlib import Path

import pytest
import torch

from grpokit.rewards import get_reward_funcs
from grpokit.scoring import score
from grpokit.testing import make_tokenizer

SYSTEM = "You are a helpful assistant."
PLAIN_TEMPLATE = (
    "{% for m in messages %}{{ '[' + m['role'] + '] ' + m['content'] + '\n' }}{% endfor %}"
)


def make_reward_model(path: Path, *, pad: bool = True, max_positions: int = 512, seed=0):
    """A tiny random LlamaForSequenceClassification (num_labels=1) + tokenizer, saved."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = make_tokenizer()
    if not pad:
        tok.pad_token = None
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return make_reward_model(tmp_path_factory.mktemp("rm") / "tiny-rm")


def direct_scores(path: Path, texts: list[str], keep: int | None = None) -> list[float]:
    """Each text alone; with ``keep``, only its last ``keep`` tokens."""
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    model = LlamaForSequenceClassification.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    out = []
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        ids = ids[len(ids) - keep :] if keep is not None and len(ids) > keep else ids
        with torch.no_grad():
            h = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
            out.append(float(h @ model.score.weight[0]))
    return out


def chatml(messages) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def chat_prompt(q: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]


COMPLETIONS = ["7", "<think> 3 + 4 </think> <answer> 7 </answer>", "The answer is 46, I think."]
QUESTIONS = ["What is 3 + 4?", "What is 12 + 34? Show your work.", "Add 12 and 34."]


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-5) for x, y in zip(a, b)
    )


def test_chat_prompts_score_the_rendered_conversation(rm_dir):
    (rm,) = get_reward_funcs([str(rm_dir)])
    prompts = [chat_prompt(q) for q in QUESTIONS]
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    got = rm(prompts=prompts, completions=completions, answer=["7", "46", "46"])
    texts = [chatml(p + c) for p, c in zip(prompts, completions)]
    want = direct_scores(rm_dir, texts)
    assert close(got, want), (got, want)
    assert len(set(got)) == 3 and rm.__name__ == "tiny-rm"


def test_plain_prompts_score_prompt_plus_completion(rm_dir):
    (rm,) = get_reward_funcs([str(rm_dir)])
    got = rm(prompts=QUESTIONS, completions=COMPLETIONS)
    want = direct_scores(rm_dir, [q + c for q, c in zip(QUESTIONS, COMPLETIONS)])
    assert close(got, want), (got, want)
    # completions as message lists read their text
    msgs = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    assert close(rm(prompts=QUESTIONS, completions=msgs), want)


def test_padding_does_not_change_a_score(rm_dir):
    (rm,) = get_reward_funcs([str(rm_dir)])
    short, long = "7", "12 + 34 = 46, and then " * 8
    alone = rm(prompts=["Q: "], completions=[short])
    batched = rm(prompts=["Q: ", "Q: ", "Q: "], completions=[long, short, long[:30]])
    assert close(batched[1:2], alone)
    assert close(batched, direct_scores(rm_dir, ["Q: " + long, "Q: " + short, "Q: " + long[:30]]))
    assert rm.last_truncated == 0


def test_long_inputs_are_cut_to_the_maximum_length_and_counted(tmp_path):
    path = make_reward_model(tmp_path / "short-rm", max_positions=24)
    (rm,) = get_reward_funcs([str(path)])
    assert rm.max_length == 24
    texts = ["word " * 40, "7", "the answer is " * 10]
    got = rm(prompts=[""] * 3, completions=texts)
    from transformers import AutoTokenizer

    lengths = [len(AutoTokenizer.from_pretrained(path)(t)["input_ids"]) for t in texts]
    n_long = sum(n > 24 for n in lengths)
    assert n_long == 2 and rm.last_truncated == n_long
    assert close(got, direct_scores(path, texts, keep=24))
    # cut from the left: the completion's end stays, so different endings score differently
    same_start = ["word " * 40 + "seven", "word " * 40 + "eight"]
    a, b = rm(prompts=["", ""], completions=same_start)
    assert a != b
    # through scoring, the count lands in the counters the trainer logs
    counters: dict = {}
    score([rm], [""] * 3, texts, {}, counters=counters)
    score([rm], [""], ["7"], {}, counters=counters)
    assert counters == {"reward_model_truncated": n_long}


def test_missing_pad_token_pads_with_eos(tmp_path):
    path = make_reward_model(tmp_path / "nopad-rm", pad=False)
    (rm,) = get_reward_funcs([str(path)])
    assert rm.tokenizer.pad_token == rm.tokenizer.eos_token == "<|im_end|>"
    assert rm.model.config.pad_token_id == rm.tokenizer.eos_token_id
    prompts, comps = ["Q: "] * 2, ["7", "twelve plus thirty four makes 46"]
    assert close(
        rm(prompts=prompts, completions=comps), direct_scores(path, ["Q: 7", "Q: " + comps[1]])
    )


def test_reward_processing_classes_override_the_tokenizer(rm_dir, tmp_path):
    other = make_tokenizer()
    other.chat_template = PLAIN_TEMPLATE
    other.save_pretrained(tmp_path / "plain-tok")
    fmt, rm = get_reward_funcs(
        ["swift_format", str(rm_dir)], processing_classes=[None, str(tmp_path / "plain-tok")]
    )
    prompts = [chat_prompt(q) for q in QUESTIONS]
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    got = rm(prompts=prompts, completions=completions)
    by_hand = [
        "".join(f"[{m['role']}] {m['content']}\n" for m in p + c)
        for p, c in zip(prompts, completions)
    ]
    assert close(got, direct_scores(rm_dir, by_hand))
    # a single value applies to every reward model
    (rm1,) = get_reward_funcs([str(rm_dir)], processing_classes=str(tmp_path / "plain-tok"))
    assert close(rm1(prompts=prompts, completions=completions), got)


def test_reward_processing_classes_mistakes_are_named(rm_dir):
    with pytest.raises(ValueError, match="2 entries but reward_funcs has 1"):
        get_reward_funcs([str(rm_dir)], processing_classes=[None, None])
    with pytest.raises(ValueError, match="'format', which is not a reward model"):
        get_reward_funcs(["format", str(rm_dir)], processing_classes=[str(rm_dir), None])
    with pytest.raises(ValueError, match="no reward_funcs entry is a reward model"):
        get_reward_funcs(["format"], processing_classes=str(rm_dir))
    from grpokit.models import ModelSourceError

    with pytest.raises(ModelSourceError, match="class 'org/tok' is not a local directory and"):
        get_reward_funcs([str(rm_dir)], processing_classes="org/tok")


def test_what_is_not_a_reward_model_says_so(tmp_path):
    from grpokit.models import ModelSourceError
    from grpokit.testing import make_tiny_model

    lm = make_tiny_model(tmp_path / "lm")
    with pytest.raises(ModelSourceError, match="LlamaForCausalLM model, not a sequence classifier"):
        get_reward_funcs([str(lm)])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelSourceError, match="directory without config.json"):
        get_reward_funcs([str(tmp_path / "empty")])
    with pytest.raises(KeyError, match="unknown reward function 'acuracy'"):
        get_reward_funcs(["acuracy"])  # a plain name is still a name, never a hub id


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the with ends: connects are refused


def test_hub_id_without_a_hub_is_a_one_line_error(monkeypatch, tmp_path):
    from grpokit.models import ModelSourceError

    with pytest.raises(ModelSourceError, match="HF_HUB_OFFLINE is set") as e:
        get_reward_funcs(["OpenAssistant/reward-model-deberta-v3-large-v2"])
    assert "\n" not in str(e.value) and "not a registered reward" in str(e.value)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(ModelSourceError, match="the hub is unreachable"):
        get_reward_funcs(["OpenAssistant/reward-model-deberta-v3-large-v2"])


def test_training_with_a_reward_model_entry(rm_dir, tmp_path):
    """Two GRPO steps of the tiny model with [arithmetic_correct, <reward model dir>]: each
    logged completion's reward-model score is the direct forward of its conversation."""
    import json

    from grpokit.tasks import get_task
    from grpokit.testing import make_tiny_model, tiny_run_config
    from grpokit.trainer import GRPOTrainer

    lm = make_tiny_model(tmp_path / "lm")
    cfg = tiny_run_config(
        lm,
        tmp_path / "out",
        reward_funcs=["arithmetic_correct", str(rm_dir)],
        log_completions=True,
        write_report=False,
    )
    GRPOTrainer(cfg).train()
    metrics = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["reward_model_truncated"] for m in metrics] == [0, 0]
    assert all(math.isfinite(m["rewards/tiny-rm/mean"]) for m in metrics)
    rows = get_task("arithmetic", **cfg.task_params, seed=cfg.seed).build("train")
    by_question = {r["prompt"][-1]["content"]: r["prompt"] for r in rows}
    table = [
        json.loads(x) for x in (tmp_path / "out" / "completions.jsonl").read_text().splitlines()
    ]
    assert len(table) == 8
    texts = [
        chatml(by_question[t["prompt"]] + [{"role": "assistant", "content": t["completion"]}])
        for t in table
    ]
    want = direct_scores(rm_dir, texts)
    assert close([t["rewards"]["tiny-rm"] for t in table], want)


def test_reward_processing_classes_config_key(tmp_path):
    from grpokit.config import ConfigError, build_config

    base = dict(task="arithmetic", output_dir=str(tmp_path / "o"))
    c = build_config({**base, "reward_funcs": ["a", "b"], "reward_processing_classes": [None, "t"]})
    assert c.reward_processing_classes == [None, "t"]
    assert build_config({**base, "reward_processing_classes": "tok"}).reward_processing_classes
    with pytest.raises(ConfigError, match="reward_processing_classes has 1 entries but"):
        build_config({**base, "reward_funcs": ["a", "b"], "reward_processing_classes": ["t"]})
    with pytest.raises(ConfigError, match="tokenizer directory, a hub id or null"):
        build_config({**base, "reward_funcs": ["a"], "reward_processing_classes": [3]})


def test_an_unreadable_config_is_a_one_line_error(tmp_path):
    from grpokit.models import ModelSourceError

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(ModelSourceError, match="reward model .* cannot be loaded") as e:
        get_reward_funcs([str(tmp_path / "bad")])
    assert "\n" not in str(e.value)
