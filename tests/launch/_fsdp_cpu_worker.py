"""Run by tests/test_accelerate.py under torchrun with 2 gloo ranks: the trainer's sharded
path (grpokit.launch.ShardedTraining) with real FSDP2 (torch fully_shard) on CPU.

accelerate 1.15 enables FSDP only on GPU-like devices (on CPU its distributed_type stays NO),
so the three calls accelerate makes for FSDP2 are made here directly: ``prepare`` shards each
decoder layer and the root with ``fully_shard`` and builds the optimizer on the sharded
parameters; ``backward`` is ``loss.backward()`` (FSDP2 averages gradients over ranks, so the
loss is scaled by the world size exactly as ShardedTraining.backward does when accumulation
is 1); ``reduce_and_clip`` is torch's clip on DTensor gradients. Everything else (launch
handling, sampling from a copy refreshed with gathered parameters, gathered full-weight
saving, the per-rank bookkeeping) is grpokit's own sharded path. After training every rank
checks that its sampling copy equals the saved full weights.
"""

import os
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(__file__))
import _dist_worker  # noqa: E402

from grpokit import distributed as dist  # noqa: E402
from grpokit import launch as engines  # noqa: E402
from grpokit import setup  # noqa: E402
from grpokit import trainer as T  # noqa: E402
from grpokit.optim import build_optimizer  # noqa: E402


class TorchFSDP2(engines.ShardedTraining):
    def __init__(self, cfg, launch):
        self.cfg, self.launch = cfg, launch
        assert cfg.gradient_accumulation_steps == 1

    @property
    def device(self):
        return torch.device("cpu")

    def prepare(self, model, optimizer, ref_model):
        from torch.distributed.fsdp import fully_shard

        for m in model.modules():
            if type(m).__name__ in model._no_split_modules:
                fully_shard(m)
        fully_shard(model)
        opt = build_optimizer([p for p in model.parameters() if p.requires_grad], self.cfg)
        return model, opt, (None if ref_model is None else self.prepare_reference(ref_model))

    def begin_step(self):
        pass

    def backward(self, model, loss):
        (loss * dist.world_size()).backward()

    def reduce_and_clip(self, model, params, max_norm):
        n = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return n.full_tensor() if hasattr(n, "full_tensor") else n

    def unwrap(self, model):
        return model

    def full_state_dict(self, model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=opts)


def main():
    T.training_strategy = TorchFSDP2
    T.launch_from_env = lambda: engines.Launch("fsdp", fsdp_version=2)
    # setup.preflight's launch check refuses FSDP on CPU, rightly for accelerate
    setup.check_launch = lambda *a, **k: None
    train = T.GRPOTrainer.train

    def train_then_check_copy(self):
        out = train(self)
        assert self.strategy.sharded and not self.cfg.fused_logprobs
        assert all(hasattr(p, "full_tensor") for p in self.model.parameters())  # sharded
        self.engine.weights_updated()
        copy = dict(self.engine.sampling_model()[0].named_parameters())
        dist.barrier()
        saved = load_file(os.path.join(self.cfg.output_dir, "final", "model.safetensors"))
        for k, v in saved.items():
            torch.testing.assert_close(copy[k], v, rtol=0, atol=0, msg=k)
        return out

    T.GRPOTrainer.train = train_then_check_copy
    _dist_worker.main(sys.argv[1], sys.argv[2], int(sys.argv[3]))


if __name__ == "__main__":
    main()
