"""The char CNN's distinct-row search against ``torch.unique``, on a real training batch too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from elmolab.models.char_cnn import distinct_rows
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
