"""Run by test_frontier_variants.py under torchrun: dynamic sampling on two gloo ranks.
Each rank records the size of every round's batch and the groups' prompts it trained on."""

import json
import sys
from pathlib import Path

from grpokit import distributed as dist
from grpokit.config import build_config


def main(model_dir: str, out: str) -> None:
    from grpokit.trainer import GRPOTrainer

    cfg = build_config(
        dict(
            task="arithmetic",
            task_params={"digits": 1, "train_size": 32, "test_size": 4},
            model_name_or_path=model_dir,
            output_dir=out,
            num_generations=4,
            per_device_train_batch_size=8,
            gradient_accumulation_steps=1,
            max_completion_length=8,
            learning_rate=1e-2,
            max_steps=2,
            save_steps=0,
            max_eval_samples=0,
            dynamic_sampling=True,
            max_num_gen_batches=3,
            reward_funcs=["arithmetic_closeness", {"length_target": {"target_length": 4}}],
            seed=5,
        )
    )
    tr = GRPOTrainer(cfg)
    real, sizes = tr.collect_round, []

    def recording():
        batch, m, table = real()
        sizes.append([batch.advantages.shape[0], m["dynamic_sampling/num_gen_batches"]])
        return batch, m, table

    tr.collect_round = recording
    tr.train()
    Path(out, f"sizes-{dist.rank()}.json").write_text(json.dumps(sizes))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
