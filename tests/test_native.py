"""elmolab's C++ kernels: the build and its cache, and the dropout kernel's mask (the other
kernels are tested beside the Python code they replace: tests/models, tests/training)."""

from __future__ import annotations

import pytest
import torch

from elmolab import native


@pytest.fixture(autouse=True)
def _kernels() -> None:
    if not native.native_kernels().available:
        pytest.skip("elmolab's C++ kernels are not built here (no compiler)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_keeps_1_minus_p_scales_and_reuses_its_mask_for_the_gradient(dtype) -> None:
    torch.manual_seed(0)
    x = (torch.rand(1001, 999) + 0.5).to(dtype).requires_grad_()  # an odd count: a lone last
    y = native.dropout(x, 0.1)
    kept = y != 0
    assert y.dtype == dtype and y.shape == x.shape
    assert abs(kept.float().mean().item() - 0.9) < 0.002  # 1M draws: 6 standard deviations
    torch.testing.assert_close(y[kept], (x[kept].float() / 0.9).to(dtype))
    (y.float() * 3.0).sum().backward()
    assert torch.equal(x.grad != 0, kept)  # the same mask
    torch.testing.assert_close(
        x.grad[kept], torch.full_like(x.grad[kept], 3.0).float().div(0.9).to(dtype)
    )


def test_dropout_repeats_under_a_seed_and_differs_between_calls() -> None:
    x = torch.ones(64, 64)
    torch.manual_seed(1)
    first, second = native.dropout(x, 0.5), native.dropout(x, 0.5)
    torch.manual_seed(1)
    assert torch.equal(native.dropout(x, 0.5), first)
    assert not torch.equal(first, second)
    # neighbouring elements are not correlated (two draws come from one 64-bit hash)
    kept = (first != 0).flatten().float()
    assert abs(torch.corrcoef(torch.stack([kept[:-1], kept[1:]]))[0, 1].item()) < 0.05


def test_without_the_kernels_dropout_is_torchs() -> None:
    x = torch.ones(50, 50)
    with native.turned_off():
        torch.manual_seed(2)
        got = native.dropout(x, 0.3)
    torch.manual_seed(2)
    assert torch.equal(got, torch.nn.functional.dropout(x, 0.3, training=True))
