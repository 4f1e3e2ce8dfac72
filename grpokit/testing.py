"""A tiny random Llama-shaped model with a real tokenizer, built offline in about a second.

Used by the tests, the recipe smoke runs and benchmarks that must not download anything.
"""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = """
The quick brown fox jumps over the lazy dog. What is 12 + 34? The answer is 46.
Respond in the following format: <reasoning> ... </reasoning> <answer> ... </answer>
<think> Let me add the numbers step by step. </think> <answer> 7 </answer>
Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.
How many clips did Natalia sell altogether? Using the numbers 3, 5, 7 create an equation that equals 22.
You are a helpful assistant. First think, then answer. 0 1 2 3 4 5 6 7 8 9 10 100 1000 + - * / = ( )
"""

SPECIAL = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
TAGS = ["<think>", "</think>", "<answer>", "</answer>", "<reasoning>", "</reasoning>"]


def make_tokenizer(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    tok.add_tokens(TAGS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    fast.chat_template = CHATML
    return fast


def make_tiny_model(
    path: str | Path,
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
) -> Path:
    """Save a random LlamaForCausalLM + tokenizer to ``path`` and return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    tok = make_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def tiny_run_config(model_dir: str | Path, output_dir: str | Path, **overrides):
    """A validated GRPOConfig for a seconds-long run of the tiny model: the arithmetic task
    (1-digit, 32 train / 4 test prompts), G=2, 4 completions a step of 4 tokens, 2 steps, no
    checkpoints and no evaluation unless ``overrides`` say otherwise."""
    from grpokit.config import build_config

    values = dict(
        task="arithmetic",
        task_params={"digits": 1, "train_size": 32, "test_size": 4},
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=4,
        learning_rate=1e-3,
        max_steps=2,
        save_steps=0,
        max_eval_samples=0,
        seed=0,
        model_name_or_path=str(model_dir),
        output_dir=str(output_dir),
    )
    values.update(overrides)
    return build_config(values)


def wait_for(cond, timeout: float, what: str) -> None:
    """Poll ``cond()`` every 50 ms until it is true; AssertionError after ``timeout`` s."""
    import time

    t0 = time.time()
    while not cond():
        if time.time() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def finish_processes(procs) -> list[tuple[int, str]]:
    """Kill what still runs of ``procs`` (Popen with text stderr); (returncode, stderr) each."""
    out = []
    for p in procs:
        if p.poll() is None:
            p.kill()
        _, err = p.communicate(timeout=60)
        out.append((p.returncode, err))
    return out
