import pytest


@pytest.fixture(scope="session")
def ending_model_dir(tmp_path_factory, tiny_model_dir):
    """The tiny model with its end-of-sequence token made likely (~15% a token): its
    completions end on their own, so a run of it is not all truncated. Every embedding gets
    the same constant in dimension 0 (it dominates the normalised last hidden state, and adds
    the same logit to every token), the EOS embedding a larger one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        E = m.model.embed_tokens.weight
        E[:, 0] = 0.2
        E[tok.eos_token_id, 0] = 1.07
    out = tmp_path_factory.mktemp("ending") / "model"
    m.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)
