"""The word softmax of the biLM: one module shared by the forward and backward LM.

Three training objectives sit behind one interface; evaluation always uses the full softmax:

- ``full``: ``p(y | h) = softmax(h W^T + b)_y`` over the whole vocabulary.
- ``sampled``: bilm-tf's objective, TensorFlow's ``tf.nn.sampled_softmax_loss`` with its defaults
  (a log-uniform candidate sampler with ``unique=True``, accidental hits removed, ``log Q``
  subtracted). One set of ``n_negative_samples`` candidates is drawn per call and shared by all
  rows, so pass both directions' rows in one call to share it across the batch.
- ``adaptive``: ``torch.nn.AdaptiveLogSoftmaxWithLoss`` (Grave et al. 2017) with cutoffs over the
  frequency-sorted vocabulary; its full distribution is still normalised over every word.

The log-uniform (Zipfian) sampler assumes ids are frequency ranks (``<S>``, ``</S>``, ``<UNK>``,
then words by descending count) and draws class ``k`` of ``V`` with probability

    P(k) = (log(k + 2) - log(k + 1)) / log(V + 1).

Like TF's ``log_uniform_candidate_sampler(unique=True)`` it draws with replacement until
``n_negative_samples`` distinct classes have appeared, after ``num_tries`` draws; the expected
count of a class (the ``Q`` of the correction) is the probability that it appears in those draws,

    Q(k) = 1 - (1 - P(k))^num_tries = -expm1(num_tries * log1p(-P(k))),

or ``n_negative_samples * P(k)`` when no draw repeated (TF's shortcut, the same to first order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from elmolab.native import native_applies

SoftmaxKind = Literal["full", "sampled", "adaptive"]

# Rows of full-softmax logits evaluated at once are bounded so that one chunk of (rows, V) float32
# logits stays near 64 MiB, whatever the batch and vocabulary sizes.
_EVAL_CHUNK_ELEMENTS = 1 << 24


def log_uniform_probability(classes: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``P(k) = (log(k + 2) - log(k + 1)) / log(V + 1)`` of each class id: float64, same shape."""
    k = classes.to(torch.float64)
    return torch.log1p(1.0 / (k + 1.0)) / math.log(vocab_size + 1)


def draw_log_uniform(
    n: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """``n`` independent log-uniform draws (with replacement): long ``(n,)``.

    TF's ``LogUniformSampler``: ``k = floor(exp(u * log(V + 1))) - 1`` with ``u ~ U[0, 1)``, so
    ``k + 1`` falls in ``[k + 1, k + 2)`` with the probability ``P(k)`` above.
    """
    u = torch.rand(n, dtype=torch.float64, generator=generator, device=device)  # (n,)
    draws = torch.exp(u * math.log(vocab_size + 1)).floor().long() - 1  # (n,)
    return draws.clamp_(max=vocab_size - 1)  # exp may round up to V + 1 as u nears 1


def expected_draws_for_distinct(n_distinct: int, probabilities: torch.Tensor) -> int:
    """The number of draws ``T`` after which ``n_distinct`` classes are expected to have appeared.

    Solves ``sum_k 1 - (1 - P(k))^T = n_distinct`` for the smallest integer ``T`` by bisection.
    """
    log_miss = torch.log1p(-probabilities)  # (vocab,) log(1 - P(k))

    def expected_distinct(draws: int) -> float:
        return float(-torch.expm1(draws * log_miss).sum())

    low, high = n_distinct - 1, n_distinct
    while expected_distinct(high) < n_distinct:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        if expected_distinct(middle) < n_distinct:
            low = middle
        else:
            high = middle
    return high


def sample_log_uniform_unique(
    n: int,
    vocab_size: int,
    initial_draws: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, int]:
    """``n`` distinct log-uniform classes and the number of draws it took, as TF's sampler.

    Draws with replacement (``initial_draws`` at a time, more while too few distinct classes
    have appeared) and keeps the classes that appeared within the first ``num_tries`` draws,
    where draw number ``num_tries`` brought the ``n``-th distinct class. Returns the classes as a
    sorted long tensor ``(n,)`` and ``num_tries``.
    """
    if not 0 < n < vocab_size:
        raise ValueError(
            f"need 0 < n < vocab_size to sample distinct classes, got {n}, {vocab_size}"
        )
    draws = draw_log_uniform(initial_draws or 2 * n, vocab_size, generator, device)  # (draws,)
    while True:
        never = len(draws)
        first_draw = torch.full((vocab_size,), never, dtype=torch.long, device=draws.device)
        first_draw.scatter_reduce_(  # (vocab,) index of the first draw of each class
            0, draws, torch.arange(never, device=draws.device), reduce="amin"
        )
        if int((first_draw < never).sum()) >= n:
            break
        more = draw_log_uniform(len(draws), vocab_size, generator, device)  # (draws,)
        draws = torch.cat([draws, more])  # (2 * draws,)
    last_draw = first_draw.kthvalue(n).values  # () the draw that brought the n-th new class
    classes = (first_draw <= last_draw).nonzero().squeeze(1)  # (n,)
    return classes, int(last_draw) + 1


def expected_counts(probabilities: torch.Tensor, num_tries: int, n_sampled: int) -> torch.Tensor:
    """TF's ``ExpectedCountHelper``: ``Q = -expm1(num_tries * log1p(-P))``, same shape as ``P``.

    When the ``n_sampled`` classes took exactly ``n_sampled`` draws, TF returns
    ``P * n_sampled`` instead (what sampling with replacement would give).
    """
    if num_tries == n_sampled:
        return probabilities * n_sampled
    return -torch.expm1(num_tries * torch.log1p(-probabilities))


class _SampledLogNormaliser(torch.autograd.Function):
    """Per row ``log(exp(l_y) + sum_c exp(s_c))`` with ``s = h W_C^T + b_C``, hits excluded.

    Autograd would keep several ``(N, S)`` temporaries per step (logits, shifted logits, their
    exp, its gradient). Here the candidate logits are computed into one buffer that becomes
    ``exp(s - m)`` in place (``m`` the row max), and backward scales it into ``dL/ds``: on CPU
    (4096 rows, 4096 candidates) the loss with its backward went from about 1.9x to about 1.3x
    the time of its three matmuls.

    An accidental hit (row ``r`` whose target is candidate ``c``) gets ``exp(s_c - m) = 0``,
    the logit ``-inf`` of TF's ``remove_accidental_hits``. Matmuls run in the dtype autocast
    chose for the forward one, in backward too, like autograd's own ``addmm``.

    On the CPU, with elmolab's C++ kernels loaded (``elmolab.native``), the elementwise part runs
    in one pass per row each way (``sampled_softmax.cpp``): the same arithmetic without the
    ``(N, S)`` dtype copies and temporaries, the column sums of the bias gradient included.
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        hidden: torch.Tensor,
        candidate_weight: torch.Tensor,
        candidate_bias: torch.Tensor,
        target_logits: torch.Tensor,
        hit_column: torch.Tensor,
    ) -> torch.Tensor:
        logits = torch.addmm(candidate_bias, hidden, candidate_weight.t())  # (N, S) s_c
        ctx.matmul_dtype = logits.dtype
        ctx.native = native_applies(logits) and native_applies(
            target_logits, dtypes=(torch.float32,)
        )
        if ctx.native:
            exp_logits, row_max, exp_sum = torch.ops.elmolab.sampled_lognorm_forward(
                logits, target_logits, hit_column
            )  # (N, S) exp(s_c - m), (N,) m, (N,)
        else:
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (N, S)
            row_max = torch.maximum(logits.amax(-1), target_logits)  # (N,) m
            exp_logits = logits.sub_(row_max[:, None]).exp_()  # (N, S) exp(s_c - m)
            hit_rows = (hit_column >= 0).nonzero().squeeze(1)  # (hits,)
            exp_logits[hit_rows, hit_column[hit_rows]] = 0.0
            exp_sum = exp_logits.sum(-1)  # (N,)
        exp_target = (target_logits - row_max).exp()  # (N,) exp(l_y - m)
        total = exp_sum + exp_target  # (N,)
        ctx.save_for_backward(hidden, candidate_weight, exp_logits, exp_target, total)
        ctx.input_dtypes = (hidden.dtype, candidate_weight.dtype, candidate_bias.dtype)
        return row_max + total.log()  # (N,)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, candidate_weight, exp_logits, exp_target, total = ctx.saved_tensors
        hidden_dtype, weight_dtype, bias_dtype = ctx.input_dtypes
        scale = grad / total  # (N,) the softmax is exp(s - m) / total
        dtype = ctx.matmul_dtype
        if ctx.native:
            grad_logits, grad_bias = torch.ops.elmolab.sampled_lognorm_backward(
                exp_logits, scale, dtype
            )  # (N, S) in dtype, (S,) float32
        else:
            grad_logits = exp_logits * scale[:, None]  # (N, S)
            grad_bias = grad_logits.sum(0)  # (S,)
            grad_logits = grad_logits.to(dtype)  # (N, S)
        grad_bias = grad_bias.to(bias_dtype)
        grad_hidden = grad_logits @ candidate_weight.to(dtype)  # (N, dim)
        grad_weight = grad_logits.t() @ hidden.to(dtype)  # (S, dim)
        return (
            grad_hidden.to(hidden_dtype),
            grad_weight.to(weight_dtype),
            grad_bias,
            exp_target * scale,
            None,
        )


def sampled_softmax_nll(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    candidates: torch.Tensor,
    candidate_log_q: torch.Tensor,
    target_log_q: torch.Tensor,
) -> torch.Tensor:
    """Per-row negative log-likelihood of the sampled softmax (TF's ``sampled_softmax_loss``).

    With ``s(c) = h . w_c + b_c`` the logits, the true class ``y`` and distinct candidates ``C``:

        l_y = s(y) - log Q(y),    l_c = s(c) - log Q(c),  except l_c = -inf if c == y
        nll = log(exp(l_y) + sum_{c in C} exp(l_c)) - l_y

    A candidate equal to a row's target (an accidental hit) is removed from that row. Pass
    zeros as the log Q terms for the uncorrected softmax over ``{y} + C``.

    Shapes: ``hidden (N, dim)``, ``targets (N,)``, ``weight (V, dim)``, ``bias (V,)``,
    ``candidates (S,)`` distinct, ``candidate_log_q (S,)``, ``target_log_q (N,)``.
    Returns ``(N,)`` in float32 (float64 for float64 inputs).
    """
    # Subtracting the float32 log Q also promotes bf16 logits (under autocast) to float32.
    target_logits = (hidden * weight[targets]).sum(-1) + bias[targets] - target_log_q  # (N,)

    column_of_class = torch.full(  # (V,) column of each class among the candidates, -1 if none
        (weight.shape[0],), -1, dtype=torch.long, device=candidates.device
    )
    column_of_class[candidates] = torch.arange(len(candidates), device=candidates.device)
    hit_column = column_of_class[targets]  # (N,) the target's column, -1 if not a candidate

    log_normaliser = _SampledLogNormaliser.apply(  # (N,)
        hidden,
        weight[candidates],
        bias[candidates] - candidate_log_q,
        target_logits,
        hit_column,
    )
    return log_normaliser - target_logits  # (N,)


class LMSoftmax(nn.Module):
    """The word softmax shared by both LM directions; ``kind`` picks the training objective.

    ``loss(h, y)`` is the mean training NLL of the chosen kind; ``full_nll(h, y)`` and
    ``log_probs(h)`` always normalise over the whole vocabulary and are what evaluation uses.
    ``full`` and ``sampled`` own ``weight (V, dim)`` and ``bias (V,)`` (bilm-tf's ``softmax/W``
    and ``softmax/b``, initialised N(0, 1/sqrt(dim)) and 0 as bilm-tf does); ``adaptive`` owns
    an ``nn.AdaptiveLogSoftmaxWithLoss`` instead and ``weight``/``bias`` are None.

    Args:
        vocab_size: V, the number of classes; ids are frequency ranks.
        dim: size of the hidden states fed to the softmax (the LSTM projection).
        kind: ``"full"``, ``"sampled"`` (default, bilm-tf) or ``"adaptive"``.
        n_negative_samples: candidates per call for ``sampled`` (bilm-tf: 8192). With
            ``n_negative_samples >= V`` every class is a candidate and ``sampled`` is ``full``.
        adaptive_cutoffs: increasing class ids where the adaptive clusters start (``adaptive``).
        adaptive_div_value: each cluster's projection is this much smaller than the previous.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int,
        kind: SoftmaxKind = "sampled",
        n_negative_samples: int = 8192,
        adaptive_cutoffs: Sequence[int] | None = None,
        adaptive_div_value: float = 4.0,
    ) -> None:
        super().__init__()
        if kind not in ("full", "sampled", "adaptive"):
            raise ValueError(f"kind must be 'full', 'sampled' or 'adaptive', got {kind!r}")
        self.kind = kind
        self.vocab_size = vocab_size
        self.n_negative_samples = n_negative_samples
        self.weight: nn.Parameter | None = None
        self.bias: nn.Parameter | None = None
        self.adaptive: nn.AdaptiveLogSoftmaxWithLoss | None = None
        self._initial_draws: int | None = None  # None: no sampling
        if kind == "adaptive":
            if not adaptive_cutoffs:
                raise ValueError("the adaptive softmax needs adaptive_cutoffs, e.g. [2000, 10000]")
            self.adaptive = nn.AdaptiveLogSoftmaxWithLoss(
                dim, vocab_size, list(adaptive_cutoffs), div_value=adaptive_div_value
            )
            return
        self.weight = nn.Parameter(torch.randn(vocab_size, dim) / math.sqrt(dim))  # (V, dim)
        self.bias = nn.Parameter(torch.zeros(vocab_size))  # (V,)
        if kind == "sampled" and n_negative_samples < vocab_size:
            probabilities = log_uniform_probability(torch.arange(vocab_size), vocab_size)  # (V,)
            # Enough draws for one round in the usual case; the sampler draws more if needed.
            expected = expected_draws_for_distinct(n_negative_samples, probabilities)
            self._initial_draws = int(1.1 * expected) + 64

    def loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean training NLL of ``kind``: ``hidden (N, dim)``, ``targets (N,)`` -> scalar."""
        return self.nll(hidden, targets).mean()

    def nll(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-row training NLL of ``kind``: ``(N, dim), (N,)`` -> ``(N,)``; ``sampled`` draws
        one set of candidates for all ``N`` rows."""
        if self.adaptive is not None:
            return -self.adaptive(hidden, targets).output
        if self._initial_draws is not None:
            return self._sampled_nll(hidden, targets)
        return F.cross_entropy(self._full_logits(hidden).float(), targets, reduction="none")

    def full_nll(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        logits_dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """Per-token NLL under the full softmax: ``(N, dim), (N,)`` -> float32 ``(N,)``.

        Sum it and count the tokens for perplexity ``exp(sum NLL / tokens)``. ``logits_dtype``
        ``torch.bfloat16``: the logits' product in bf16 (its inputs and its output rounded to
        bf16), the bias, the log-sum-exp and the NLL in float32; the default computes everything
        in float32 (``adaptive``: always).
        """
        if self.adaptive is not None:
            return -self.adaptive(hidden, targets).output.float()
        assert self.weight is not None and self.bias is not None
        rows = max(1, _EVAL_CHUNK_ELEMENTS // self.vocab_size)
        weight = self.weight if logits_dtype == torch.float32 else self.weight.to(logits_dtype)
        losses = []
        for h, y in zip(hidden.split(rows), targets.split(rows), strict=True):
            if logits_dtype == torch.float32:
                logits = self._full_logits(h).float()  # (rows, V)
            else:
                logits = (h.to(logits_dtype) @ weight.t()).float() + self.bias
            losses.append(F.cross_entropy(logits, y, reduction="none"))  # (rows,)
        return torch.cat(losses)

    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full log-distribution over the vocabulary: ``(N, dim)`` -> float32 ``(N, V)``."""
        if self.adaptive is not None:
            return self.adaptive.log_prob(hidden).float()
        return F.log_softmax(self._full_logits(hidden).float(), dim=-1)

    def _full_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight, self.bias)  # (N, V)

    def _sampled_nll(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        n = self.n_negative_samples
        candidates, num_tries = sample_log_uniform_unique(  # (S,)
            n, self.vocab_size, self._initial_draws, device=hidden.device
        )
        probability = log_uniform_probability(candidates, self.vocab_size)  # (S,)
        candidate_q = expected_counts(probability, num_tries, n)  # (S,)
        target_q = expected_counts(log_uniform_probability(targets, self.vocab_size), num_tries, n)
        return sampled_softmax_nll(
            hidden,
            targets,
            self.weight,
            self.bias,
            candidates,
            candidate_q.log().float(),
            target_q.log().float(),
        )
