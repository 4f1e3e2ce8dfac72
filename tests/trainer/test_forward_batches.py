"""The trainer's fused head + trimmed micro-batches compute the same log-probs, entropies and
gradients as the model's own forward over the whole padded batch (the unfused path)."""

import pytest
import torch

from grpokit.forward import fused_head, shared_prompts
from grpokit.rollout.base import Rollout, completion_mask_from_eos
from grpokit.testing import tiny_run_config
from grpokit.trainer import GRPOTrainer


def _rollout(tr, n=6, P=9, C=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    V = tr.model.config.vocab_size
    # the compared rows 4, 0, 5, 2 differ in prompt and completion length
    p_len = torch.tensor([3, 9, 4, 2, 5, 2])[:n]
    p_mask = (torch.arange(P)[None, :] >= P - p_len[:, None]).long()  # left padding
    p_ids = torch.randint(3, V, (n, P), generator=g) * p_mask
    c_ids = torch.randint(3, V, (n, C), generator=g)
    eos = tr.tokenizer.eos_token_id
    lens = torch.tensor([9, 2, 3, 8, 2, 1])[:n]  # every row ends before C: trimmed columns
    for i, k in enumerate(lens.tolist()):
        c_ids[i, k - 1] = eos
        c_ids[i, k:] = tr.tokenizer.pad_token_id
    c_mask, truncated = completion_mask_from_eos(c_ids, [eos])
    return Rollout(p_ids, p_mask, c_ids, c_mask, truncated, [""] * n)


def _compare(tr, ro, atol, grad_rtol):
    assert fused_head(tr.model) is not None
    rows = torch.tensor([4, 0, 5, 2])
    out = {}
    for fused in (True, False):
        tr.logprobs.fused = fused
        tr.model.zero_grad(set_to_none=True)
        logp, ent = tr.logprobs(tr.model, ro, rows, with_entropy=True)
        mask = ro.completion_mask[rows].float()
        (logp * mask * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        grads = {n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None}
        out[fused] = (logp * mask, ent * mask, grads)
    (lf, ef, gf), (lu, eu, gu) = out[True], out[False]
    assert lf.shape == lu.shape == ro.completion_ids[rows].shape
    torch.testing.assert_close(lf, lu, atol=atol, rtol=0)
    torch.testing.assert_close(ef, eu, atol=atol * 10, rtol=0)
    assert gf.keys() == gu.keys() and gf
    worst = 0.0
    for k in gf:
        scale = gu[k].abs().max().clamp(min=1e-6)
        worst = max(worst, ((gf[k] - gu[k]).abs().max() / scale).item())
    assert worst < grad_rtol


@pytest.mark.parametrize(
    "overrides,atol,grad_rtol",
    [
        ({}, 2e-5, 1e-4),
        ({"use_peft": True, "lora_r": 4, "lora_dropout": 0.0}, 2e-5, 1e-4),
        ({"bf16": True}, 2e-2, 3e-2),
    ],
    ids=["full", "lora", "bf16"],
)
def test_fused_head_matches_model_forward(tmp_path, tiny_model_dir, overrides, atol, grad_rtol):
    tr = GRPOTrainer(
        tiny_run_config(tiny_model_dir, tmp_path / "run", temperature=0.7, **overrides)
    )
    _compare(tr, _rollout(tr), atol, grad_rtol)


def test_micro_batches_group_by_length_except_bnpo(tmp_path, tiny_model_dir):
    tr = GRPOTrainer(
        tiny_run_config(
            tiny_model_dir,
            tmp_path / "run",
            per_device_train_batch_size=4,
            share_prompt_forward=False,
        )
    )
    ro = _rollout(tr, n=6)
    parts = tr.opt.plan(ro)
    assert sorted(torch.cat(parts).tolist()) == list(range(6)) and max(map(len, parts)) <= 4
    # the longest row pads only its own micro-batch
    total = ro.prompt_mask.sum(-1) + ro.completion_mask.sum(-1)
    longest = int(total.argmax())
    assert [longest in p.tolist() for p in parts].count(True) == 1
    assert torch.cat(tr.opt.plan(ro, keep_order=True)).tolist() == list(range(6))
    assert [len(p) for p in tr.opt.plan(ro, keep_order=True)] == [4, 2]
    # no-grad log-probs are per row: the grouping cannot change them
    with torch.no_grad():
        whole = tr.logprobs(tr.model, ro, slice(None))[0]
    torch.testing.assert_close(
        tr.logprobs.no_grad(tr.model, ro, tr.opt.plan(ro)), whole, atol=1e-5, rtol=0
    )


def _grouped_rollout(tr, G=4, seed=1, prefix=0):
    """3 prompts x G completions (groups contiguous, as engines return them); prompts of
    different lengths (left padding), completions of different lengths, one truncated.
    ``prefix``: every prompt starts with the same ``prefix`` tokens (a system prompt)."""
    g = torch.Generator().manual_seed(seed)
    V, P, C = tr.model.config.vocab_size, 9 + prefix, 10
    p_len = (torch.tensor([5, 9, 3]) + prefix).repeat_interleave(G)
    p_mask = (torch.arange(P)[None, :] >= P - p_len[:, None]).long()
    own = torch.randint(3, V, (3, P), generator=g)
    common = torch.randint(3, V, (prefix,), generator=g)
    for i in range(3):  # the first `prefix` real tokens of every prompt
        own[i, P - p_len[i * G] : P - p_len[i * G] + prefix] = common
    p_ids = own.repeat_interleave(G, dim=0) * p_mask
    c_ids = torch.randint(3, V, (3 * G, C), generator=g)
    eos = tr.tokenizer.eos_token_id
    lens = torch.randint(1, C + 1, (3 * G,), generator=g)
    lens[1] = C + 1  # no EOS: truncated
    for i, k in enumerate(lens.tolist()):
        if k <= C:
            c_ids[i, k - 1] = eos
            c_ids[i, k:] = tr.tokenizer.pad_token_id
    c_mask, truncated = completion_mask_from_eos(c_ids, [eos])
    return Rollout(p_ids, p_mask, c_ids, c_mask, truncated, [""] * (3 * G))


@pytest.mark.parametrize(
    "prefix", [0, 20, 100], ids=["distinct", "short-common-prefix", "common-prefix"]
)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize(
    "overrides,atol,grad_rtol",
    [
        ({}, 2e-5, 1e-4),
        ({"use_peft": True, "lora_r": 4, "lora_dropout": 0.0}, 2e-5, 1e-4),
        ({"bf16": True}, 2e-2, 3e-2),
    ],
    ids=["full", "lora", "bf16"],
)
def test_shared_prompt_forward_matches_one_forward_per_row(
    tmp_path, tiny_model_dir, fused, overrides, atol, grad_rtol, prefix
):
    """Each distinct prompt computed once, its KV cache indexed out to the G rows, gives the
    log-probs, entropies and gradients of one full forward per row; so does a prefix common
    to all prompts computed once for all of them where that saves enough positions
    (``common-prefix``: 2 x 100 = 200 positions; 2 x 20 does not, and the prompts run whole)."""
    from grpokit.speed.prefix import prefix_pays

    tr = GRPOTrainer(
        tiny_run_config(
            tiny_model_dir, tmp_path / "run", temperature=0.7, fused_logprobs=fused, **overrides
        )
    )
    ro = _grouped_rollout(tr, prefix=prefix)
    rows = torch.tensor([0, 5, 1, 9, 2, 4, 11])  # 3 distinct prompts, repeated
    p = ro.prompt_ids[rows][:, -3:]
    assert shared_prompts(p, ro.prompt_mask[rows][:, -3:]) is not None
    out = {}
    for share in (True, False):
        tr.logprobs.share_prompts = share
        tr.model.zero_grad(set_to_none=True)
        before = tr.logprobs.train_positions
        logp, ent = tr.logprobs(tr.model, ro, rows, with_entropy=True)
        # positions computed: each distinct prompt but its last token once (the common
        # prefix once for all three), then [last prompt token | completion] per row
        ck = int(ro.completion_mask[rows].sum(-1).max())
        once = prefix if prefix_pays(3, prefix) else 0
        assert bool(once) == (prefix == 100)
        want = 3 * (prefix + 8) - 2 * once + 7 * (ck + 1) if share else 7 * (prefix + 9 + ck)
        assert tr.logprobs.train_positions - before == want
        mask = ro.completion_mask[rows].float()
        (logp * mask * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        grads = {n: q.grad.clone() for n, q in tr.model.named_parameters() if q.grad is not None}
        out[share] = (logp * mask, ent * mask, grads)
        with torch.no_grad():  # the no-grad passes (reference, old log-probs) too
            out[share] += (tr.logprobs.no_grad(tr.model, ro, tr.opt.plan(ro)),)
    _assert_same_numbers(out[True], out[False], atol, grad_rtol)


def _assert_same_numbers(got, want, atol: float, grad_rtol: float) -> None:
    """(log-probs, entropies, gradients by name, no-grad log-probs) of two routes: within
    ``atol`` (entropies 10x), each gradient within ``grad_rtol`` of the other's largest entry."""
    (lg, eg, gg, ng), (lw, ew, gw, nw) = got, want
    torch.testing.assert_close(lg, lw, atol=atol, rtol=0)
    torch.testing.assert_close(eg, ew, atol=atol * 10, rtol=0)
    torch.testing.assert_close(ng, nw, atol=atol, rtol=0)
    assert gg.keys() == gw.keys() and gg
    for k in gg:
        scale = gw[k].abs().max().clamp(min=1e-6)
        assert ((gg[k] - gw[k]).abs().max() / scale).item() < grad_rtol, k


def test_micro_batch_split_minimises_token_positions(tmp_path, tiny_model_dir):
    from grpokit.batch import FORWARD_COST_TOKENS

    tr = GRPOTrainer(
        tiny_run_config(
            tiny_model_dir, tmp_path / "run", per_device_train_batch_size=4, num_generations=4
        )
    )
    ro = _grouped_rollout(tr)  # 3 prompts x 4
    parts = tr.opt.plan(ro)
    assert sorted(torch.cat(parts).tolist()) == list(range(12)) and max(map(len, parts)) <= 4
    plen, clen = ro.prompt_mask.sum(-1), ro.completion_mask.sum(-1)

    def cost(ps):  # token positions with the shared-prompt forward, plus the per-pass cost
        return sum(
            len(torch.unique(i // 4)) * (int(plen[i].max()) - 1)
            + len(i) * (int(clen[i].max()) + 1)
            + FORWARD_COST_TOKENS
            for i in ps
        )

    orders = [
        torch.arange(12),
        torch.argsort(clen, descending=True),
        torch.argsort(plen + clen, descending=True),
        torch.randperm(12, generator=torch.Generator().manual_seed(0)),
    ]
    for o in orders:  # no fixed split of 4 rows does better
        assert cost(parts) <= cost([o[s : s + 4] for s in range(0, 12, 4)])


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_merged_micro_batches_give_the_same_step(tmp_path, tiny_model_dir, loss_type):
    """``merge_micro_batches``: the 12 rows of 3 micro-batches of 4 run in fewer forwards
    (here two), within the positions of one micro-batch padded to the step's longest prompt
    and completion; loss, entropy bonus (TRL's mean of micro-batch means) and every gradient are
    those of one forward per micro-batch, and of the unmerged length-sorted plan."""
    from grpokit.batch import Batch, MicroBatchPlan, loss_mask
    from grpokit.speed.prefix import shared_prefix_length

    tr = GRPOTrainer(
        tiny_run_config(
            tiny_model_dir,
            tmp_path / "run",
            per_device_train_batch_size=4,
            gradient_accumulation_steps=3,
            num_generations=4,
            max_prompt_length=40,
            max_completion_length=10,
            loss_type=loss_type,
            entropy_coef=0.5,
        )
    )
    ro = _grouped_rollout(tr, prefix=20)  # 3 prompts x 4, prompts of 23..29 tokens
    merged = tr.opt.plan(ro)
    unmerged = MicroBatchPlan(4, 4, share=True)(ro)
    assert len(unmerged) >= 3 and max(map(len, unmerged)) <= 4
    assert len(merged) < len(unmerged) and max(map(len, merged)) > 4
    padded = 4 * int(ro.prompt_mask.sum(-1).max() + ro.completion_mask.sum(-1).max())
    common = shared_prefix_length(ro.prompt_ids[:, :-1], ro.prompt_mask[:, :-1])
    for rows in merged:  # what the plan counts: the common prefix once, each prompt's rest
        p, c = ro.prompt_mask[rows].sum(-1).max(), ro.completion_mask[rows].sum(-1).max()
        distinct = len({tuple(ro.prompt_ids[i].tolist()) for i in rows.tolist()})
        assert common + distinct * (p - 1 - common) + len(rows) * (c + 1) <= padded
    in_order = [torch.arange(s, s + 4) for s in range(0, 12, 4)]  # TRL's micro-batches
    adv = torch.linspace(-1.5, 1.5, 12)
    out = []
    for pieces in (in_order, unmerged, merged):
        tr.model.zero_grad(set_to_none=True)
        b = Batch(ro, loss_mask(ro, False), adv, None, None)
        res = tr.opt.gradients.run(b, pieces, 1)
        grads = {n: q.grad.clone() for n, q in tr.model.named_parameters() if q.grad is not None}
        out.append((res.loss_sum, grads))
    (l0, g0) = out[0]
    assert g0
    for loss, grads in out[1:]:
        assert loss == pytest.approx(l0, rel=1e-5, abs=1e-7)
        for k in g0:
            scale = g0[k].abs().max().clamp(min=1e-6)
            assert ((grads[k] - g0[k]).abs().max() / scale).item() < 1e-4, k


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_bf16_reference_with_lowered_linears_is_bit_identical(tmp_path, tiny_model_dir, fused):
    """Under bf16 autocast the frozen reference keeps its products' weights in bf16 (cast
    once, not every forward); its log-probs equal those of the float32 copy under autocast
    exactly, and the input embedding and norms stay float32."""
    import copy

    tr = GRPOTrainer(
        tiny_run_config(
            tiny_model_dir, tmp_path / "run", bf16=True, beta=0.04, fused_logprobs=fused
        )
    )
    ref = tr.ref_model
    assert ref.get_output_embeddings().weight.dtype == torch.bfloat16
    assert ref.get_input_embeddings().weight.dtype == torch.float32
    linears = [m for m in ref.modules() if type(m) is torch.nn.Linear]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert all(p.dtype == torch.float32 for n, p in ref.named_parameters() if "norm" in n)
    ref32 = copy.deepcopy(tr.model).eval()  # the policy before any step is the reference
    ro = _rollout(tr)
    rows = torch.tensor([4, 0, 5, 2])
    with torch.no_grad():
        low, _ = tr.logprobs(ref, ro, rows)
        full, _ = tr.logprobs(ref32, ro, rows)
    assert torch.equal(low, full)
    # mixed with the policy every few steps (sync_ref_model): it stays float32
    tr2 = GRPOTrainer(
        tiny_run_config(
            tiny_model_dir, tmp_path / "run2", bf16=True, beta=0.04, sync_ref_model=True
        )
    )
    assert all(p.dtype == torch.float32 for p in tr2.ref_model.parameters())


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_tied_embedding_sparse_lookup_gradient(tmp_path, tiny_model_dir, fused):
    """The tied embedding's lookup gradient is sparse; autograd adds it into the head's
    dense gradient, so the parameter's .grad is dense and equals the all-dense one, over two
    accumulated micro-batches."""
    tr = GRPOTrainer(tiny_run_config(tiny_model_dir, tmp_path / "run", fused_logprobs=fused))
    emb = tr.model.get_input_embeddings()
    assert emb.weight is tr.model.get_output_embeddings().weight and emb.sparse
    ro = _rollout(tr)
    grads = {}
    for sparse in (True, False):
        emb.sparse = sparse
        tr.model.zero_grad(set_to_none=True)
        for rows in (torch.tensor([4, 0]), torch.tensor([5, 2])):
            logp, _ = tr.logprobs(tr.model, ro, rows)
            (logp * ro.completion_mask[rows]).sum().backward()
        grads[sparse] = emb.weight.grad
    assert grads[True].layout == torch.strided
    torch.testing.assert_close(grads[True], grads[False], atol=1e-6, rtol=1e-6)
    lora = GRPOTrainer(tiny_run_config(tiny_model_dir, tmp_path / "lora", use_peft=True, lora_r=4))
    assert not lora.model.get_input_embeddings().sparse  # frozen: left alone


def test_tied_head_gradient_takes_the_lookups_sparse_gradients_in_place(
    tmp_path, tiny_model_dir, monkeypatch
):
    """With the fused head the head's dense gradient reaches the tied weight after the
    lookups' sparse ones (``head_weight_arriving_last``), and autograd adds those into it in
    place: no out-of-place dense + sparse (V, H) sum, each a copy of the whole gradient. Two
    prompts each shared by three rows: the shared-prompt forward looks up twice."""
    import grpokit.forward as forward

    tr = GRPOTrainer(tiny_run_config(tiny_model_dir, tmp_path / "run"))
    w = tr.model.get_input_embeddings().weight
    ro = _rollout(tr)
    pick = torch.tensor([0, 0, 0, 2, 2, 2])  # rows 0 and 2's prompts, three rows each
    ro = Rollout(ro.prompt_ids[pick], ro.prompt_mask[pick], ro.completion_ids,
                 ro.completion_mask, ro.truncated, ro.texts)  # fmt: skip

    def backward():
        """The tied weight's gradient, and how many (V, H) copies additions made in the
        backward (an out-of-place dense + sparse sum copies the dense operand first)."""
        tr.model.zero_grad(set_to_none=True)
        logp, _ = tr.logprobs(tr.model, ro, torch.arange(6))
        cpu = [torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=cpu, record_shapes=True) as prof:
            (logp * ro.completion_mask).sum().backward()
        copies = sum(
            e.name == "aten::copy_"
            and e.cpu_parent is not None
            and e.cpu_parent.name == "aten::add"
            and list(e.input_shapes[0]) == list(w.shape)
            for e in prof.events()
        )
        return w.grad.clone(), copies

    assert shared_prompts(ro.prompt_ids, ro.prompt_mask) is not None
    g_new, copies_new = backward()
    monkeypatch.setattr(forward, "head_weight_arriving_last", lambda model, weight: weight)
    g_old, copies_old = backward()
    assert copies_old >= 1 and copies_new == 0  # the old order copied; the new one does not
    torch.testing.assert_close(g_new, g_old, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("overrides", [{}, {"bf16": True}, {"use_peft": True, "lora_r": 4}])
def test_no_grad_forward_runs_the_c_rms_norm(tmp_path, tiny_model_dir, monkeypatch, overrides):
    """Reference and old log-prob forwards (no grad) take RMSNorm's one-pass C forward
    (forward.LEAN_NO_GRAD); the log-probs equal transformers' norms' to float rounding."""
    import grpokit.forward as fwd
    from grpokit.speed import kernels

    if not kernels.rms_norm_applies(torch.ones(2, 8), torch.ones(8)):
        pytest.skip("no C kernels here")
    tr = GRPOTrainer(tiny_run_config(tiny_model_dir, tmp_path / "run", beta=0.04, **overrides))
    calls = []
    real = kernels.rms_norm_forward
    monkeypatch.setattr(kernels, "rms_norm_forward", lambda *a: calls.append(1) or real(*a))
    ro, rows = _rollout(tr), torch.tensor([4, 0, 5, 2])
    mask = ro.completion_mask[rows].float()
    out = {}
    for flag in (False, True):
        monkeypatch.setattr(fwd, "LEAN_NO_GRAD", flag)
        calls.clear()
        with torch.no_grad():
            out[flag] = tr.logprobs(tr.ref_model or tr.model, ro, rows)[0] * mask
        assert bool(calls) == flag
    atol = 2e-2 if overrides.get("bf16") else 2e-5
    torch.testing.assert_close(out[True], out[False], atol=atol, rtol=0)


@pytest.mark.parametrize("overrides", [{}, {"bf16": True}], ids=["float32", "bf16"])
def test_packed_forward_matches_the_prompt_then_completion_forwards(
    tmp_path, tiny_model_dir, monkeypatch, overrides
):
    """Rows sharing prompts as ONE packed sequence (speed/packed.py: prompts and rows' tokens
    through every layer once, only the attention split by rows) against the prompts' forward
    then the completions' against their cache: the same log-probs, entropies and gradients,
    in the training forward and the no-grad passes, up to the order of float sums (float32
    through the training attention route for the comparison). With a common prefix that
    pays (``common-prefix``: 2 x 100 positions saved) the prefix is the packing's first
    block, run once, against the three forwards of the prefix, the suffixes and the rows."""
    from grpokit import forward as fw
    from grpokit.speed import attention, packed

    monkeypatch.setattr(attention, "FLOAT32_TOO", True)
    tr = GRPOTrainer(
        tiny_run_config(tiny_model_dir, tmp_path / "run", temperature=0.7, **overrides)
    )
    ran = []
    real_packed, real_cache = packed.packed_attention, fw.LogProbs._prompt_cache
    monkeypatch.setattr(
        packed, "packed_attention", lambda pk: ran.append("packed") or real_packed(pk)
    )
    monkeypatch.setattr(fw.LogProbs, "_prompt_cache",
                        lambda *a: ran.append("cache") or real_cache(*a))  # fmt: skip
    rows = torch.tensor([0, 5, 1, 9, 2, 4, 11])
    for prefix, want in ((0, "packed"), (20, "packed"), (100, "packed")):
        ro = _grouped_rollout(tr, prefix=prefix)
        out = {}
        for flag in (True, False):
            monkeypatch.setattr(fw, "PACKED", flag)
            tr.model.zero_grad(set_to_none=True)
            ran.clear()
            logp, ent = tr.logprobs(tr.model, ro, rows, with_entropy=True)
            assert ran == [want if flag else "cache"], (prefix, flag, ran)
            mask = ro.completion_mask[rows].float()
            (logp * mask * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
            grads = {
                n: q.grad.clone() for n, q in tr.model.named_parameters() if q.grad is not None
            }
            with torch.no_grad():
                ng = tr.logprobs.no_grad(tr.model, ro, [rows])
            out[flag] = (logp * mask, ent * mask, grads, ng)
        atol, grad_rtol = (2e-2, 3e-2) if overrides else (2e-5, 1e-4)
        _assert_same_numbers(out[True], out[False], atol, grad_rtol)


def test_packing_applies_only_where_it_computes_the_model_s_attention(tmp_path, tiny_model_dir):
    """speed/packed.applies: not past the training route's lengths, not in float32 outside
    that route, not with a sliding window or attention dropout in training."""
    from grpokit.speed import attention, packed

    tr = GRPOTrainer(tiny_run_config(tiny_model_dir, tmp_path / "run", bf16=True))
    m, cfg = tr.model, tr.model.config
    with torch.autocast("cpu", torch.bfloat16):
        assert packed.applies(m, 8, 12)
        assert not packed.applies(m, 8, attention.MAX_QUERIES + 1)
        cfg.sliding_window = 4
        assert not packed.applies(m, 8, 12)
        cfg.sliding_window = None
        cfg.attention_dropout, training = 0.1, m.training
        m.train()
        assert not packed.applies(m, 8, 12)
        m.train(training)
        cfg.attention_dropout = 0.0
    assert not packed.applies(m, 8, 12)  # float32, no autocast
