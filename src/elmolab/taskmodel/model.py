"""The task model: a BiLSTM-CRF tagger whose input may include ELMo's mix of the biLM's layers.

For token ``k`` of a sentence the input is

    x_k = [t_k ; E w_k ; gamma * sum_j softmax(s)_j h_{k,j}]

``t_k`` the context-free vector (the token encoder's layer 0), ``E w_k`` the task model's own word
embedding, and, with an ELMo input, the learned scalar mix of the mix encoder's layers ``h_j``
(ELMo, Peters et al. 2018, eq. 1), as ``elmolab.Elmo`` mixes them (``Elmo.mix``; its L2 penalty
``lambda |s|^2`` joins the loss). Frozen, the layers come from the extract stage's cache (an
``Elmo.of_layers``, no biLM); fine-tuned, :class:`FineTunedLayers` runs the biLM of an
``Elmo.from_bilm`` inside the tagger and its parameters train with the rest.
After dropout, a bidirectional LSTM reads the sentence, a linear map gives each tag's emission
score, and a linear-chain CRF (``torchcrf.CRF``, the pytorch-crf package) scores whole tag
sequences: training minimizes the negative log-likelihood of the gold sequence per token, and
prediction is the Viterbi sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torchcrf import CRF

from elmolab import native
from elmolab.data.labels import LabelVocabulary, TaskMetric
from elmolab.elmo import Elmo
from elmolab.models.bilm import BiLM
from elmolab.probing.metrics import task_score


@dataclass(frozen=True, eq=False)
class FineTunedLayers:
    """A biLM inside the tagger, trained with it: ``elmo`` (``elmolab.Elmo.from_bilm``, one
    representation, no dropout: the tagger's own follows) runs it on a batch's character ids, and
    its layers are standardized by fixed per-layer, per-dimension ``mean`` and ``std``
    ``(L, dim)`` (the train split's, as the frozen input's cached layers are), so that before its
    first step it gives the frozen input's features. As ``Elmo(requires_grad=True)`` does, every
    sentence starts from zero states and the biLM's own training dropout is off."""

    elmo: Elmo
    mean: torch.Tensor  # (L, 1, 1, dim)
    std: torch.Tensor  # (L, 1, 1, dim)

    @classmethod
    def of(cls, bilm: BiLM, mean: torch.Tensor, std: torch.Tensor) -> FineTunedLayers:
        """A trainable copy of ``bilm``, standardized as given."""
        elmo = Elmo.from_bilm(bilm, 1, requires_grad=True, dropout=0.0)
        return cls(elmo, mean.float()[:, None, None], std.float()[:, None, None])

    @property
    def num_layers(self) -> int:
        return int(self.mean.shape[0])

    @property
    def dim(self) -> int:
        return int(self.mean.shape[-1])

    def layers(self, chars: torch.Tensor) -> torch.Tensor:
        """``chars`` ``(B, T, 50)``, 0 at padding -> ``(L, B, T, dim)``, token t at t."""
        layers, _ = self.elmo.layers(chars)  # (L, B, T, dim)
        return (layers - self.mean) / self.std


@dataclass(frozen=True)
class TaggerShape:
    """The tagger's sizes (``taskmodel`` config, and the data)."""

    num_tags: int
    token_dim: int  # the context-free vector's width
    num_words: int  # word embedding rows (WordVocabulary, UNKNOWN included)
    word_dim: int  # 0: no word embedding
    mix_layers: int  # layers of the ELMo mix; 0: no mix
    mix_dim: int  # their width
    hidden_dim: int  # LSTM cells per direction
    lstm_layers: int
    dropout: float
    l2_lambda: float  # the mix weights' L2 penalty


class BiLstmCrfTagger(nn.Module):
    """Emission scores from a BiLSTM over the tokens' inputs, a CRF over the tag sequence (see
    the module docstring)."""

    def __init__(self, shape: TaggerShape, encoder: FineTunedLayers | None = None) -> None:
        super().__init__()
        self.shape = shape
        self.encoder = encoder  # None: the mix reads the batch's cached layers
        self.words = nn.Embedding(shape.num_words, shape.word_dim) if shape.word_dim else None
        # ELMo's input: its one learned mix, no dropout of its own (the tagger's follows).
        self.elmo: Elmo | None = None
        if encoder is not None:
            self.elmo = encoder.elmo
        elif shape.mix_layers:
            self.elmo = Elmo.of_layers(shape.mix_layers, 1, dropout=0.0)
        width = shape.token_dim + shape.word_dim + (shape.mix_dim if shape.mix_layers else 0)
        self.lstm = nn.LSTM(
            width,
            shape.hidden_dim,
            num_layers=shape.lstm_layers,
            bidirectional=True,
            batch_first=True,
            dropout=shape.dropout if shape.lstm_layers > 1 else 0.0,
        )
        self.emit = nn.Linear(2 * shape.hidden_dim, shape.num_tags)
        self.crf = CRF(shape.num_tags, batch_first=True)

    def inputs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``x`` ``(B, T, width)``: the context-free vector, word embedding and mix side by side."""
        parts = [batch["token"]]  # (B, T, token_dim)
        if self.words is not None:
            parts.append(self.words(batch["words"]))  # (B, T, word_dim)
        if self.elmo is not None:
            layers = (
                batch["layers"] if self.encoder is None else self.encoder.layers(batch["chars"])
            )
            parts.append(self.elmo.mix(layers)[0])  # (B, T, dim)
        return torch.cat(parts, dim=-1)

    def emissions(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``(B, T, num_tags)`` the emission score of every tag at every position."""
        x = self.dropout(self.inputs(batch))  # (B, T, width)
        packed = pack_padded_sequence(x, batch["lengths"], batch_first=True, enforce_sorted=False)
        hidden, _ = pad_packed_sequence(
            self.lstm(packed)[0], batch_first=True, total_length=x.shape[1]
        )  # (B, T, 2 * hidden_dim)
        return self.emit(self.dropout(hidden))

    def dropout(self, x: torch.Tensor) -> torch.Tensor:
        """Dropout at ``shape.dropout`` while training: ``elmolab.native``'s, whose mask costs a
        fraction of torch's (whose ``bernoulli_`` took a sixth of a training step at batch 256)."""
        return native.dropout(x, self.shape.dropout) if self.training else x

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The gold sequences' negative log-likelihood per token, plus the mix's L2 penalty."""
        nll = -self.crf(self.emissions(batch), batch["tags"], batch["mask"], reduction="token_mean")
        return nll + self.penalty()

    def penalty(self) -> torch.Tensor:
        """``lambda |s|^2`` of the learned mix weights (0 without a mix)."""
        if self.elmo is None:
            return torch.zeros(())
        return self.elmo.scalar_mix_l2(self.shape.l2_lambda)

    def decode(self, batch: dict[str, torch.Tensor]) -> list[list[int]]:
        """The Viterbi tag sequence of each sentence (its own length)."""
        return self.crf.decode(self.emissions(batch), batch["mask"])

    def mix_summary(self) -> tuple[list[float], float] | None:
        """The mix's normalized weights ``softmax(s)`` and ``gamma`` (None without a mix)."""
        return None if self.elmo is None else self.elmo.scalar_mix.summary(0)


class TaggerModule(pl.LightningModule):
    """Lightning's view of a :class:`BiLstmCrfTagger`: Adam (the mix, and a fine-tuned biLM, each
    at its own rate), span F1 on
    the dev split after each epoch (``dev/f1``, in percent, scored in the data's tag scheme by
    ``elmolab.probing.metrics.task_score``), Viterbi predictions in ``predict_step``."""

    def __init__(
        self,
        tagger: BiLstmCrfTagger,
        vocabulary: LabelVocabulary,
        dev_gold: list[list[int]],
        lr: float,
        mix_lr: float,
        encoder_lr: float = 0.0,
    ) -> None:
        super().__init__()
        self.tagger = tagger
        self.vocabulary = vocabulary
        self.dev_gold = dev_gold
        self.lr = lr
        self.mix_lr = mix_lr
        self.encoder_lr = encoder_lr  # of a fine-tuned biLM's parameters
        self._dev_predictions: dict[int, list[int]] = {}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.tagger.loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["lengths"]))
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._dev_predictions.update(self.predict_step(batch, batch_idx))

    def on_validation_epoch_end(self) -> None:
        predicted = [self._dev_predictions.pop(i) for i in range(len(self.dev_gold))]
        self.log("dev/f1", sentence_f1(self.vocabulary, self.dev_gold, predicted), prog_bar=True)

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[int, list[int]]:
        """Sentence index -> its predicted tag ids."""
        return dict(zip(batch["index"].tolist(), self.tagger.decode(batch), strict=True))

    def configure_optimizers(self) -> Any:
        elmo = self.tagger.elmo
        mix = [] if elmo is None else list(elmo.scalar_mix.parameters())
        encoder = [] if elmo is None or elmo.bilm is None else list(elmo.bilm.parameters())
        own = {id(p) for p in mix + encoder}
        rest = [p for p in self.tagger.parameters() if id(p) not in own]
        groups = [{"params": rest, "lr": self.lr}]
        if mix:
            groups.append({"params": mix, "lr": self.mix_lr})
        if encoder:
            groups.append({"params": encoder, "lr": self.encoder_lr})
        return torch.optim.Adam(groups)


def sentence_f1(
    vocabulary: LabelVocabulary, gold: list[list[int]], predicted: list[list[int]]
) -> float:
    """Span F1 in percent of per-sentence tag ids, in the vocabulary's tag scheme."""
    flat_gold = torch.tensor([t for s in gold for t in s], dtype=torch.int64)
    flat_predicted = torch.tensor([t for s in predicted for t in s], dtype=torch.int64)
    lengths = [len(s) for s in gold]
    return 100.0 * task_score(TaskMetric.SPAN_F1, flat_predicted, flat_gold, lengths, vocabulary)
