"""The shared LM softmax (full, sampled with TF semantics, adaptive) against direct computations."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from elmolab import native
from elmolab.training import softmax as softmax_module
from elmolab.training.softmax import (
    LMSoftmax,
    draw_log_uniform,
    expected_counts,
    expected_draws_for_distinct,
    log_uniform_probability,
    sample_log_uniform_unique,
    sampled_softmax_nll,
)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _reference_sampled_nll(
    hidden, targets, weight, bias, candidates, candidate_log_q, target_log_q
):
    """Row by row in numpy: the softmax over the target and the candidates other than it."""
    hidden, weight, bias = (t.detach().double().numpy() for t in (hidden, weight, bias))
    nll = []
    for row, target in enumerate(targets.tolist()):
        logits = [hidden[row] @ weight[target] + bias[target] - float(target_log_q[row])]
        for column, candidate in enumerate(candidates.tolist()):
            if candidate != target:
                score = hidden[row] @ weight[candidate] + bias[candidate]
                logits.append(score - float(candidate_log_q[column]))
        logits = np.array(logits)
        top = logits.max()
        nll.append(top + np.log(np.exp(logits - top).sum()) - logits[0])
    return torch.tensor(nll)


def test_full_loss_is_cross_entropy() -> None:
    torch.manual_seed(0)
    softmax = LMSoftmax(50, 8, kind="full")
    hidden, targets = torch.randn(30, 8), torch.randint(0, 50, (30,))
    expected = F.cross_entropy(hidden @ softmax.weight.T + softmax.bias, targets)
    torch.testing.assert_close(softmax.loss(hidden, targets), expected)
    torch.testing.assert_close(softmax.full_nll(hidden, targets).mean(), expected)
    assert softmax.weight.shape == (50, 8) and softmax.bias.shape == (50,)


def test_sampled_nll_with_every_class_as_candidate_is_the_full_nll() -> None:
    torch.manual_seed(1)
    vocab, n = 40, 25
    hidden, weight, bias = torch.randn(n, 6), torch.randn(vocab, 6), torch.randn(vocab)
    targets = torch.randint(0, vocab, (n,))
    every_class = torch.arange(vocab)
    nll = sampled_softmax_nll(
        hidden, targets, weight, bias, every_class, torch.zeros(vocab), torch.zeros(n)
    )
    expected = F.cross_entropy(hidden @ weight.T + bias, targets, reduction="none")
    torch.testing.assert_close(nll, expected)


def test_accidental_hits_are_removed_and_log_q_subtracted() -> None:
    torch.manual_seed(2)
    vocab, n = 30, 12
    hidden, weight, bias = torch.randn(n, 5), torch.randn(vocab, 5), torch.randn(vocab)
    targets = torch.tensor([3, 7, 3, 11, 0, 29, 5, 7, 2, 3, 18, 1])
    candidates = torch.tensor([0, 3, 5, 7, 20, 25])  # hits in rows 0, 1, 2, 4, 6, 7, 9
    candidate_log_q, target_log_q = torch.randn(6), torch.randn(n)
    nll = sampled_softmax_nll(
        hidden, targets, weight, bias, candidates, candidate_log_q, target_log_q
    )
    expected = _reference_sampled_nll(
        hidden, targets, weight, bias, candidates, candidate_log_q, target_log_q
    )
    torch.testing.assert_close(nll.double(), expected, rtol=1e-5, atol=1e-5)


def test_sampled_nll_gradients_are_exact() -> None:
    torch.manual_seed(3)
    vocab, n = 15, 9
    hidden = torch.randn(n, 4, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, 4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(vocab, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([1, 4, 4, 9, 0, 14, 6, 2, 4])
    candidates = torch.tensor([0, 2, 4, 5, 11])
    candidate_log_q = torch.randn(5, dtype=torch.float64)
    target_log_q = torch.randn(n, dtype=torch.float64)

    def nll(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return sampled_softmax_nll(
            hidden, targets, weight, bias, candidates, candidate_log_q, target_log_q
        )

    assert torch.autograd.gradcheck(nll, (hidden, weight, bias))


def test_sampled_loss_under_bf16_autocast_keeps_float32_loss_and_gradients() -> None:
    torch.manual_seed(4)
    softmax = LMSoftmax(300, 16, kind="sampled", n_negative_samples=50)
    hidden = torch.randn(20, 16, requires_grad=True)
    targets = torch.randint(0, 300, (20,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = softmax.loss(hidden, targets)
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert softmax.weight.grad.dtype == torch.float32 and hidden.grad.dtype == torch.float32
    assert softmax.weight.grad.abs().sum() > 0


def test_log_uniform_draws_follow_the_zipfian_distribution() -> None:
    vocab, n = 20, 200_000
    probabilities = log_uniform_probability(torch.arange(vocab), vocab)
    torch.testing.assert_close(probabilities.sum(), torch.tensor(1.0, dtype=torch.float64))
    manual = [(math.log(k + 2) - math.log(k + 1)) / math.log(vocab + 1) for k in range(vocab)]
    torch.testing.assert_close(probabilities, torch.tensor(manual, dtype=torch.float64))

    draws = draw_log_uniform(n, vocab, generator=_generator(5))
    observed = torch.bincount(draws, minlength=vocab).double()
    expected = probabilities * n
    chi_square = float(((observed - expected) ** 2 / expected).sum())
    assert chi_square < 43.82  # the 0.999 quantile of chi-square with 19 degrees of freedom


def test_unique_sampler_keeps_the_classes_of_the_first_num_tries_draws() -> None:
    n, vocab = 10, 50
    classes, num_tries = sample_log_uniform_unique(n, vocab, 1000, generator=_generator(6))
    draws = draw_log_uniform(1000, vocab, generator=_generator(6)).tolist()  # the same draws
    assert len(set(classes.tolist())) == n
    assert set(draws[:num_tries]) == set(classes.tolist())
    assert len(set(draws[: num_tries - 1])) == n - 1  # draw num_tries brought the n-th class


def test_unique_sampler_draws_more_when_the_first_round_falls_short() -> None:
    classes, num_tries = sample_log_uniform_unique(30, 40, initial_draws=5, generator=_generator(7))
    assert len(set(classes.tolist())) == 30 and num_tries >= 30


def test_expected_counts_match_a_monte_carlo_estimate() -> None:
    vocab, num_tries, trials = 30, 15, 20_000
    draws = draw_log_uniform(trials * num_tries, vocab, generator=_generator(8))
    draws = draws.view(trials, num_tries)  # (trials, tries)
    appeared = torch.zeros(trials, vocab).scatter_(1, draws, 1.0).mean(0)  # (vocab,)
    probabilities = log_uniform_probability(torch.arange(vocab), vocab)
    expected = expected_counts(probabilities, num_tries, n_sampled=10)
    torch.testing.assert_close(appeared.double(), expected, rtol=0, atol=0.015)
    # TF's shortcut when no draw repeated: the with-replacement count
    torch.testing.assert_close(expected_counts(probabilities, 5, 5), 5 * probabilities)


def test_expected_draws_for_distinct_matches_the_sampler_on_average() -> None:
    n, vocab = 100, 1000
    probabilities = log_uniform_probability(torch.arange(vocab), vocab)
    expected = expected_draws_for_distinct(n, probabilities)
    generator = _generator(9)
    tries = [sample_log_uniform_unique(n, vocab, generator=generator)[1] for _ in range(40)]
    assert abs(np.mean(tries) / expected - 1) < 0.05


def test_sampled_softmax_trains_on_a_sample_and_evaluates_with_the_full_softmax() -> None:
    torch.manual_seed(10)
    softmax = LMSoftmax(200, 16, kind="sampled", n_negative_samples=20)
    hidden, targets = torch.randn(40, 16), torch.randint(0, 200, (40,))
    loss = softmax.loss(hidden, targets)
    loss.backward()
    touched_rows = (softmax.weight.grad.abs().sum(1) > 0).sum()
    assert torch.isfinite(loss) and 20 <= touched_rows < 200  # candidates and targets only

    full = F.cross_entropy(hidden @ softmax.weight.T + softmax.bias, targets, reduction="none")
    torch.testing.assert_close(softmax.full_nll(hidden, targets), full.detach())
    torch.testing.assert_close(softmax.log_probs(hidden).exp().sum(-1), torch.ones(40))


def test_sampled_softmax_with_more_negatives_than_classes_is_the_full_softmax() -> None:
    torch.manual_seed(11)
    softmax = LMSoftmax(30, 8, kind="sampled", n_negative_samples=8192)
    hidden, targets = torch.randn(10, 8), torch.randint(0, 30, (10,))
    expected = F.cross_entropy(hidden @ softmax.weight.T + softmax.bias, targets)
    torch.testing.assert_close(softmax.loss(hidden, targets), expected)


def test_full_nll_in_chunks_equals_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(12)
    softmax = LMSoftmax(50, 8, kind="full")
    hidden, targets = torch.randn(23, 8), torch.randint(0, 50, (23,))
    one_pass = softmax.full_nll(hidden, targets)
    monkeypatch.setattr(softmax_module, "_EVAL_CHUNK_ELEMENTS", 50 * 4)  # 4 rows at a time
    torch.testing.assert_close(softmax.full_nll(hidden, targets), one_pass)


def test_bf16_logits_nll_stays_within_bf16_rounding_of_the_float32_nll() -> None:
    """With ``logits_dtype=torch.bfloat16`` each logit is off by at most bf16's rounding of its
    inputs and output (a few 2**-9 of ``sum_k |h_k w_ck|``; the bias is added in float32), so a
    token's NLL by at most twice the largest logit error; the float32 default is the plain
    cross-entropy, bit for bit."""
    torch.manual_seed(14)
    softmax = LMSoftmax(300, 64, kind="full")
    with torch.no_grad():
        softmax.bias.normal_(std=10.0)  # a bias rounded to bf16 would be off by up to 0.03
    hidden, targets = torch.randn(40, 64), torch.randint(0, 300, (40,))
    logits = F.linear(hidden, softmax.weight, softmax.bias)
    exact = F.cross_entropy(logits, targets, reduction="none").detach()
    assert torch.equal(softmax.full_nll(hidden, targets).detach(), exact)
    bf16 = softmax.full_nll(hidden, targets, torch.bfloat16).detach()
    assert bf16.dtype == torch.float32
    magnitude = (hidden.abs() @ softmax.weight.abs().t()).detach()  # (40, 300)
    bound = 2 * 3 * 2**-9 * magnitude.max(dim=1).values  # (40,)
    assert bool(((bf16 - exact).abs() <= bound).all())
    assert float((bf16 - exact).abs().max()) > 0  # it does compute in bf16


def test_adaptive_softmax_trains_and_evaluates_with_a_normalised_distribution() -> None:
    torch.manual_seed(13)
    softmax = LMSoftmax(100, 16, kind="adaptive", adaptive_cutoffs=[10, 40])
    hidden, targets = torch.randn(25, 16), torch.randint(0, 100, (25,))
    loss = softmax.loss(hidden, targets)
    loss.backward()
    assert torch.isfinite(loss) and softmax.weight is None

    log_probs = softmax.log_probs(hidden)  # (25, 100)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(25))
    nll = softmax.full_nll(hidden, targets)
    torch.testing.assert_close(nll, -log_probs.gather(1, targets[:, None]).squeeze(1))
    torch.testing.assert_close(nll.mean(), loss.detach())


def test_adaptive_softmax_needs_cutoffs_and_kind_must_be_known() -> None:
    with pytest.raises(ValueError, match="adaptive_cutoffs"):
        LMSoftmax(100, 16, kind="adaptive")
    with pytest.raises(ValueError, match="kind"):
        LMSoftmax(100, 16, kind="hierarchical")


@pytest.mark.parametrize("mixed", [False, True], ids=["float32", "bf16-autocast"])
def test_the_cpp_kernels_compute_what_the_tensor_ops_compute(mixed: bool) -> None:
    """The log-normaliser's C++ kernels (one pass per row) against its tensor ops: the loss and
    every gradient, with accidental hits, and a candidate count that leaves a scalar tail after
    the vector lanes."""
    if not native.native_kernels().available:
        pytest.skip("elmolab's C++ kernels are not built here (no compiler)")
    torch.manual_seed(5)
    vocab, n, dim = 500, 70, 32
    weight, bias, hidden = torch.randn(vocab, dim), torch.randn(vocab), torch.randn(n, dim)
    targets = torch.randint(0, 60, (n,))
    candidates = torch.randperm(vocab)[:203]  # 203 = 12 x 16 + 11
    assert torch.isin(targets, candidates).any()  # accidental hits
    candidate_log_q, target_log_q = torch.randn(203), torch.randn(n)
    found = []
    for kernels in (True, False):
        leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
        with contextlib.nullcontext() if kernels else native.turned_off():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
                nll = sampled_softmax_nll(
                    leaves[0],
                    targets,
                    leaves[1],
                    leaves[2],
                    candidates,
                    candidate_log_q,
                    target_log_q,
                )
            grads = torch.autograd.grad((nll * torch.linspace(0.5, 1.5, n)).sum(), leaves)
        found.append((nll, *grads))
    for a, b in zip(*found, strict=True):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
