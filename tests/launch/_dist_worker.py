"""Run by tests/test_distributed.py: a short GRPO run with a deterministic fake sampler, so
one process and two gloo ranks see exactly the same completions."""

import sys

import torch

from grpokit.config import build_config
from grpokit.rollout import Rollout, completion_mask_from_eos
from grpokit.rollout.hf import HFRolloutEngine


def fake_generate(self, prompt_ids, prompt_mask, params, num_generations=1):
    ids = prompt_ids.repeat_interleave(num_generations, 0)
    mask = prompt_mask.repeat_interleave(num_generations, 0)
    rows = []
    for i in range(ids.shape[0]):
        real = ids[i][mask[i].bool()].tolist()
        g = torch.Generator().manual_seed(
            hash(tuple(real)) % (2**31) + 7919 * (i % num_generations)
        )
        n = int(torch.randint(2, params.max_new_tokens + 1, (1,), generator=g))
        toks = torch.randint(3, 300, (params.max_new_tokens,), generator=g)
        if n < params.max_new_tokens:
            toks[n] = self.eos_ids[0]
        rows.append(toks)
    comp = torch.stack(rows)
    cmask, truncated = completion_mask_from_eos(comp, self.eos_ids)
    comp = comp.masked_fill(cmask == 0, self.pad_id)
    texts = self.tokenizer.batch_decode(comp, skip_special_tokens=True)
    return Rollout(ids, mask, comp, cmask, truncated, texts)


def main(model_dir: str, out: str, per_device: int) -> None:
    HFRolloutEngine.generate = fake_generate
    from grpokit.trainer import GRPOTrainer

    cfg = build_config(
        dict(
            task="arithmetic",
            task_params={"digits": 1, "train_size": 32, "test_size": 4},
            model_name_or_path=model_dir,
            output_dir=out,
            num_generations=4,
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=1,
            max_completion_length=8,
            learning_rate=1e-2,
            max_steps=3,
            save_steps=0,
            max_eval_samples=0,
            beta=0.04,
            loss_type="dapo",
            reward_funcs=["arithmetic_closeness", {"length_target": {"target_length": 12}}],
            seed=5,
        )
    )
    GRPOTrainer(cfg).train()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
