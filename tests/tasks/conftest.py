import json

import pytest

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def chat_tokenizer():
    """A real fast tokenizer with a ChatML chat template, built offline (word-level vocab)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant"]
    words += [str(i) for i in range(10)] + list("+-*/()=?.,:<>")
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>"
    )
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    fast.chat_template = CHATML
    return fast


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def write_jsonl():
    """write_jsonl(path, rows) -> path: rows as one JSON object a line."""
    return _write_jsonl
