import torch

from grpokit.algo import entropy_from_logits, selective_log_softmax


def test_matches_naive_fp32():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=g) * 4
    ids = torch.randint(0, 50, (3, 7), generator=g)
    naive = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    for chunk in (1, 2, 5):
        torch.testing.assert_close(
            selective_log_softmax(logits, ids, chunk), naive, atol=1e-5, rtol=0
        )


def test_bf16_input_upcast():
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 5, 40, generator=g) * 3).bfloat16()
    ids = torch.randint(0, 40, (2, 5), generator=g)
    out = selective_log_softmax(logits, ids)
    assert out.dtype == torch.float32
    naive = torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out, naive, atol=1e-5, rtol=0)


def test_gradient_matches_naive():
    logits = torch.randn(2, 4, 11, requires_grad=True)
    ids = torch.randint(0, 11, (2, 4))
    selective_log_softmax(logits, ids).sum().backward()
    g1 = logits.grad.clone()
    logits.grad = None
    torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).sum().backward()
    torch.testing.assert_close(g1, logits.grad)


def test_entropy():
    logits = torch.zeros(2, 3, 8)
    torch.testing.assert_close(
        entropy_from_logits(logits), torch.full((2, 3), torch.log(torch.tensor(8.0)).item())
    )
    peaked = torch.full((1, 1, 4), -1e4)
    peaked[..., 0] = 0
    assert entropy_from_logits(peaked).abs().max() < 1e-5
