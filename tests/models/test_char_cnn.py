"""The char CNN's distinct-row search against ``torch.unique`` (on a real training batch too),
and its convolutions with their max over positions (the chunked matmuls and the C++ table
kernel) against a plain convolution over every window."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from elmolab import native
from elmolab.models import char_cnn
from elmolab.models.char_cnn import CharCNN, distinct_rows
from elmolab.text.chars import char_ids_for_token
from elmolab.training.data import LMDataModule
from tests.training.test_pretrain import make_corpus


@pytest.mark.parametrize(
    ("high", "shape"),
    [(3, (1000, 11)), (512, (300, 50)), (1, (5, 50)), (600, (50, 9)), (263, (0, 50))],
    ids=["few-values", "full-id-range", "all-equal", "ids-beyond-9-bits", "empty"],
)
def test_distinct_rows_are_torch_unique(high: int, shape: tuple[int, int]) -> None:
    rows = torch.randint(0, high, shape, generator=torch.Generator().manual_seed(0))
    expected, expected_inverse = torch.unique(rows, dim=0, return_inverse=True)
    distinct, inverse = distinct_rows(rows)
    assert torch.equal(distinct, expected)
    assert torch.equal(inverse, expected_inverse)


def test_distinct_rows_of_a_training_batch(tmp_path: Path) -> None:
    """Both streams' character ids, as ``CharCNN.forward`` sees them in training."""
    data = LMDataModule(make_corpus(tmp_path), 4, 5, seed=1)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    both = torch.cat([batch["forward_char_ids"], batch["backward_char_ids"]])
    rows = both.reshape(-1, both.shape[-1])  # (tokens, chars)
    expected, expected_inverse = torch.unique(rows, dim=0, return_inverse=True)
    distinct, inverse = distinct_rows(rows)
    assert len(expected) < len(rows)  # repeated tokens, so the grouping is tested
    assert torch.equal(distinct, expected)
    assert torch.equal(inverse, expected_inverse)


def _reference_filters(cnn: CharCNN, ids: torch.Tensor) -> torch.Tensor:
    """bilm-tf's convolutions written plainly: every window of every width over all slots."""
    x = F.embedding(ids, cnn.char_embed, padding_idx=0)  # (tokens, chars, char_dim)
    chars = ids.shape[1]
    maxima = []
    for (width, _), kernel, bias in zip(
        cnn.filters, cnn.conv_weights, cnn.conv_biases, strict=True
    ):
        windows = [
            sum(x[:, p + k] @ kernel[k] for k in range(width)) for p in range(chars - width + 1)
        ]
        maxima.append(torch.stack(windows, dim=1).amax(dim=1) + bias)  # (tokens, n)
    return torch.relu(torch.cat(maxima, dim=1))


@pytest.mark.parametrize("path", ["chunked", "tables"])
def test_filters_equal_a_plain_convolution(path: str) -> None:
    """Outputs and the gradients of the embedding, kernels and biases (float32): short and long
    tokens, one that fills all 50 slots, repeated characters (tied windows), a padding row."""
    if path == "tables" and not native.native_kernels().available:
        pytest.skip("elmolab's C++ kernels are not built here (no compiler)")
    torch.manual_seed(6)
    cnn = CharCNN([[1, 3], [2, 5], [3, 8], [5, 17]], 6, 1, 8)  # 33 filters: a scalar tail
    for bias in cnn.conv_biases:
        torch.nn.init.normal_(bias)
    words = ["a", "the", "aaaa", "Zürich", "x" * 80, "ab" * 30, "elmo-lab", "q"]
    ids = torch.tensor([char_ids_for_token(w) for w in words] + [[0] * 50])  # (9, 50)
    assert (ids[4] != char_cnn.PAD_ID).all()  # the long token fills every slot
    found = []
    for compute in (lambda: cnn._filters(ids), lambda: _reference_filters(cnn, ids)):
        cnn.zero_grad()
        with native.turned_off() if path == "chunked" else contextlib.nullcontext():
            out = compute()
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads = [cnn.char_embed.grad, *(w.grad for w in cnn.conv_weights)]
        found.append([out, *grads, *(b.grad for b in cnn.conv_biases)])
    for got, want in zip(*found, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(found[0][1][0], torch.zeros(6))  # the padding id gets no gradient
