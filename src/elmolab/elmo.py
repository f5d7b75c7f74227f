"""ELMo's second stage in a user's own model: ``Elmo`` and ``batch_to_ids``, allennlp's interface.

Code written for allennlp 2.10.1's ``allennlp.modules.elmo`` runs with its import changed::

    from elmolab import Elmo, batch_to_ids

    elmo = Elmo(options_file, weight_file, num_output_representations=1)
    output = elmo(batch_to_ids([["I", "saw", "it", "."], ["Hello", "!"]]))
    output["elmo_representations"][0]  # (2, 4, 2 * proj)
    output["mask"]  # (2, 4) bool

Each output representation ``k`` of a token at position t is its own scalar mix of the biLM's
layers ``h_j`` (layer 0 the char CNN's token vector duplicated, then one per LSTM layer)::

    ELMo_k,t = dropout(gamma_k * sum_j softmax(w_k)_j * norm(h_j)_t)

with ``w_k = 0`` and ``gamma_k = 1`` at the start (Peters et al. 2018, eq. 1). ``norm`` is the
identity, or with ``do_layer_norm`` each layer minus its mean over the batch's unmasked elements
(``<S>`` and ``</S>`` included, every dimension), divided by their standard deviation, as
allennlp's ``ScalarMix`` does.

The biLM is the project's own (``elmolab.models.bilm``), read from any bilm-tf ``options.json``
and ``lm_weights.hdf5`` by ``elmolab.models.bilm_tf``. The features equal allennlp's ``Elmo``
within 1e-5 on the reference fixture (``tests/test_elmo.py``, against outputs of allennlp itself:
``tools/allennlp_reference.py``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from elmolab.core.errors import ElmolabError
from elmolab.models.bilm import BiLM, BiLMOptions
from elmolab.models.bilm_tf import load_bilm_weights
from elmolab.models.scalar_mix import ScalarMix
from elmolab.text.chars import MAX_CHARACTERS_PER_TOKEN, char_ids_for_sentences

PathLike = str | os.PathLike[str]
LAYER_NORM_EPS = 1e-13  # allennlp's tiny_value_of_dtype(float32), added to the variance


def batch_to_ids(sentences: Sequence[Sequence[str]], truncate: bool = False) -> Tensor:
    """Character ids of tokenized sentences: long (batch, max_len, 50), as allennlp's.

    Each token is bilm-tf's 50 character ids (its UTF-8 bytes between begin- and end-of-word
    marks, then padding) shifted by +1; rows shorter than ``max_len`` are padded with 0, which
    ``Elmo`` reads as "no token". No sentence marks: ``Elmo`` adds them.

    A token has room for 48 UTF-8 bytes. allennlp and bilm-tf cut a longer one silently; here it
    is an error naming the sentence and token (indices from 0) unless ``truncate`` (CoNLL-2003's
    training file has four such tokens, rows of dashes). Raises ElmolabError for that, an empty
    batch, an empty sentence, or a sentence given as one string.
    """
    if len(sentences) == 0:
        raise ElmolabError("batch_to_ids: no sentences")
    limit = MAX_CHARACTERS_PER_TOKEN - 2  # the word marks take two of the 50 slots
    for s, sentence in enumerate(sentences):
        if isinstance(sentence, str):
            raise ElmolabError(
                f"batch_to_ids: sentence {s} is a string, not a list of tokens "
                "(split it first, e.g. sentence.split())"
            )
        if len(sentence) == 0:
            raise ElmolabError(f"batch_to_ids: sentence {s} is empty")
        for t, token in enumerate(sentence):
            size = len(token.encode("utf-8", "ignore"))
            if size > limit and not truncate:
                shown = token if len(token) <= 30 else token[:30] + "..."
                raise ElmolabError(
                    f"batch_to_ids: sentence {s}, token {t} ({shown!r}) has {size} UTF-8 bytes, "
                    f"more than the {limit} a token may have (truncate=True cuts it, as "
                    "allennlp does)"
                )
    return char_ids_for_sentences(sentences, add_sentence_marks=False)


class Elmo(nn.Module):
    """ELMo representations from a pretrained bilm-tf biLM, with allennlp's ``Elmo`` interface.

    Parameters
    ----------
    options_file, weight_file
        bilm-tf's ``options.json`` and ``lm_weights.hdf5`` (a published ELMo, or this project's
        ``artifacts/bilm/``).
    num_output_representations
        How many representations (each its own scalar mix) ``forward`` returns; at least 1.
    requires_grad
        True fine-tunes the biLM (its parameters get gradients); False freezes it and runs it
        without a graph.
    do_layer_norm
        Normalize each layer over the batch before mixing (see the module docstring).
    dropout
        Dropout probability on each representation (train mode only).
    keep_sentence_boundaries
        Keep the ``<S>``/``</S>`` positions: representations and mask then have ``timesteps + 2``
        positions per row, ``<S>`` first and ``</S>`` right after the row's last token.
    scalar_mix_parameters
        Fixed mix logits, one per layer (``num_layers``): every representation is then
        ``softmax(scalar_mix_parameters)``-weighted with ``gamma`` 1, neither trained.
    stateful
        False (the default): every sentence starts from zero LSTM states, so its features do not
        depend on the previous batch. True: row r of a batch continues from where row r of the
        previous batch ended, as allennlp's (stateful) ``ElmoLstm`` and bilm-tf run;
        ``reset_states()`` forgets the states.

    The biLM's own training dropout (``dropout`` in ``options.json``) is not applied, as in
    allennlp. Attributes: ``bilm`` (``elmolab.models.bilm.BiLM``), ``num_layers`` (the biLM's
    LSTM layers + 1), ``scalar_mix`` (``elmolab.models.scalar_mix.ScalarMix``, one head per
    representation: ``w`` (num_output_representations, num_layers) and ``gamma``
    (num_output_representations,)).

    :meth:`from_bilm` builds one of a biLM in memory, :meth:`of_layers` one that mixes layers
    the caller already has (:meth:`mix`); :meth:`layers` gives the biLM's layers unmixed.
    """

    def __init__(
        self,
        options_file: PathLike,
        weight_file: PathLike,
        num_output_representations: int,
        requires_grad: bool = False,
        do_layer_norm: bool = False,
        dropout: float = 0.5,
        keep_sentence_boundaries: bool = False,
        scalar_mix_parameters: Sequence[float] | None = None,
        stateful: bool = False,
    ) -> None:
        super().__init__()
        _check_arguments(num_output_representations, dropout)
        # allennlp's biLM runs without the options' training dropout, in train mode too.
        options = dataclasses.replace(BiLMOptions.from_json(options_file), dropout=0.0)
        fixed = _fixed_weights(scalar_mix_parameters, options, options_file)
        bilm = BiLM(options, stateful=stateful)
        load_bilm_weights(bilm, weight_file, options_file)
        self._build(
            bilm,
            options.lstm.n_layers + 1,
            num_output_representations,
            fixed,
            requires_grad=requires_grad,
            do_layer_norm=do_layer_norm,
            dropout=dropout,
            keep_sentence_boundaries=keep_sentence_boundaries,
        )

    @classmethod
    def from_bilm(
        cls,
        bilm: BiLM,
        num_output_representations: int,
        *,
        dropout: float = 0.5,
        scalar_mix_parameters: Sequence[float] | None = None,
        stateful: bool = False,
        **settings: Any,
    ) -> Elmo:
        """The ``Elmo`` of a biLM in memory (e.g. one trained here, not yet exported), with the
        constructor's keyword parameters (``settings``: ``requires_grad``, ``do_layer_norm``,
        ``keep_sentence_boundaries``). It runs a copy of ``bilm`` without its training dropout, so
        fine-tuning (``requires_grad``) leaves ``bilm`` as it is."""
        _check_arguments(num_output_representations, dropout)
        options = dataclasses.replace(bilm.options, dropout=0.0)
        fixed = _fixed_weights(scalar_mix_parameters, options, None)
        copy = BiLM(options, stateful=stateful)
        copy.load_state_dict(bilm.state_dict())
        elmo = cls.__new__(cls)
        nn.Module.__init__(elmo)
        elmo._build(
            copy,
            options.lstm.n_layers + 1,
            num_output_representations,
            fixed,
            dropout=dropout,
            **settings,
        )
        return elmo

    @classmethod
    def of_layers(
        cls,
        num_layers: int,
        num_output_representations: int,
        do_layer_norm: bool = False,
        dropout: float = 0.5,
        scalar_mix_parameters: Sequence[float] | None = None,
    ) -> Elmo:
        """An ``Elmo`` without a biLM, for layers the caller already has (e.g. features cached by
        the extract stage): :meth:`mix` gives their representations; what needs the biLM
        (``forward``, :meth:`layers`, :meth:`get_output_dim`, :meth:`reset_states`) raises
        ElmolabError."""
        _check_arguments(num_output_representations, dropout)
        fixed = None
        if scalar_mix_parameters is not None:
            fixed = _softmax_of(scalar_mix_parameters, num_layers, f"{num_layers} layers to mix")
        elmo = cls.__new__(cls)
        nn.Module.__init__(elmo)
        elmo._build(
            None,
            num_layers,
            num_output_representations,
            fixed,
            do_layer_norm=do_layer_norm,
            dropout=dropout,
        )
        return elmo

    def _build(
        self,
        bilm: BiLM | None,
        num_layers: int,
        num_output_representations: int,
        fixed: Tensor | None,
        *,
        requires_grad: bool = False,
        do_layer_norm: bool = False,
        dropout: float = 0.5,
        keep_sentence_boundaries: bool = False,
    ) -> None:
        """The mixes, and the settings every constructor shares; ``fixed``: the softmax of
        ``scalar_mix_parameters`` (None: learned mixes)."""
        self.num_layers = num_layers
        self.bilm = bilm
        if bilm is not None:
            bilm.requires_grad_(requires_grad)
        self.requires_grad = requires_grad
        self.scalar_mix = ScalarMix(
            num_layers,
            num_output_representations,
            learned=fixed is None,
            fixed=fixed,
            l2_lambda=1.0,
            layer_norm=do_layer_norm,
            eps=LAYER_NORM_EPS,
        )
        if fixed is not None:
            self.scalar_mix.requires_grad_(False)
        self.do_layer_norm = do_layer_norm
        self.keep_sentence_boundaries = keep_sentence_boundaries
        self.dropout = nn.Dropout(dropout)

    def get_output_dim(self) -> int:
        """The size of each representation: ``2 * projection_dim``."""
        return 2 * self._the_bilm().options.lstm.projection_dim

    def reset_states(self) -> None:
        """Forget the LSTM states carried between calls (``stateful=True`` only)."""
        self._the_bilm().reset_states()

    def scalar_mix_l2(self, lambda_: float) -> Tensor:
        """The paper's regularizer ``lambda_ * sum_k ||w_k||^2`` over the learned mix weights, a
        scalar tensor to add to the task loss (0 with fixed ``scalar_mix_parameters``)."""
        return lambda_ * self.scalar_mix.penalty().sum()

    def forward(self, char_ids: Tensor) -> dict[str, Tensor | list[Tensor]]:
        """``char_ids``: long (batch, timesteps, 50) as ``batch_to_ids`` makes them (any leading
        shape ``(..., timesteps, 50)`` is flattened and restored, as in allennlp).

        Returns ``{"elmo_representations": [num_output_representations tensors of shape
        (batch, timesteps, 2 * proj)], "mask": (batch, timesteps) bool}``, zero at padding;
        ``timesteps + 2`` with ``keep_sentence_boundaries`` (then, with ``do_layer_norm``,
        padding positions hold the normalized zero, as in allennlp).

        Raises ElmolabError, naming what was given, for ids that are not an integer tensor of
        that shape: floats, word ids (batch, timesteps), sentences not yet through
        ``batch_to_ids``. Other integer types are read as long.
        """
        leading, layers, marked = self._bilm_layers(char_ids)
        # The layer norm's statistics take <S> and </S> too, as allennlp's do.
        mixed = self.scalar_mix(layers, mask=marked)  # (k, batch, time + 2, D)
        if self.keep_sentence_boundaries:
            mask = marked  # (batch, time + 2)
        else:
            mask = marked[:, 2:]  # (batch, time): position t + 1 holds token t if t + 2 is marked
            # Shifting drops <S>; the mask then zeroes each row's </S> (and padding).
            mixed = mixed[:, :, 1:-1] * mask[None, :, :, None]  # (k, batch, time, D)
        representations = [
            self.dropout(r).reshape(*leading, *r.shape[1:]) for r in mixed.unbind(0)
        ]  # k x (..., time, D)
        return {
            "elmo_representations": representations,
            "mask": mask.reshape(*leading, mask.shape[-1]),
        }

    def layers(self, char_ids: Tensor) -> tuple[Tensor, Tensor]:
        """The biLM's layers before mixing, as :meth:`mix` reads them: ``(num_layers, ...,
        timesteps, 2 * proj)`` (the layer axis first; ``char_ids`` as ``forward`` reads them)
        and the mask ``(..., timesteps)``; ``timesteps + 2`` with ``keep_sentence_boundaries``.
        Positions the mask marks False hold ``</S>``'s or padding's activations."""
        leading, layers, marked = self._bilm_layers(char_ids)
        if not self.keep_sentence_boundaries:
            layers, marked = layers[:, :, 1:-1], marked[:, 2:]  # token t at position t
        return (
            layers.reshape(self.num_layers, *leading, *layers.shape[2:]),
            marked.reshape(*leading, marked.shape[-1]),
        )

    def mix(self, layers: Tensor, mask: Tensor | None = None) -> list[Tensor]:
        """The representations of layers the caller already has, ``(num_layers, ..., dim)``
        (the layer axis first, as :meth:`layers` gives them and the extract stage caches them),
        ``mask`` ``(...)`` True at real tokens (the layer norm's statistics; None: all real):
        ``num_output_representations`` tensors ``(..., dim)``, each its own scalar mix, after
        dropout."""
        if layers.shape[0] != self.num_layers:
            raise ElmolabError(
                f"Elmo.mix: layers has {layers.shape[0]} layers on its first axis, the mix has "
                f"{self.num_layers}"
            )
        return [self.dropout(r) for r in self.scalar_mix(layers, mask=mask).unbind(0)]

    def _the_bilm(self) -> BiLM:
        if self.bilm is None:
            raise ElmolabError(
                "this Elmo has no biLM (Elmo.of_layers): it mixes given layers, with Elmo.mix"
            )
        return self.bilm

    def _bilm_layers(self, char_ids: Tensor) -> tuple[torch.Size, Tensor, Tensor]:
        """The leading shape of ``char_ids``, the biLM's layers ``(L, batch, time + 2, D)`` with
        ``<S>`` first and the mask of ``<S>``, the tokens and ``</S>`` ``(batch, time + 2)``."""
        bilm = self._the_bilm()
        char_ids = _checked_char_ids(char_ids)
        leading = char_ids.shape[:-2]
        flat = char_ids.reshape(-1, *char_ids.shape[-2:])  # (batch, timesteps, 50)
        with torch.set_grad_enabled(self.requires_grad and torch.is_grad_enabled()):
            layers, marked = bilm(flat, keep_marks=True)  # (batch, L, time + 2, D)
        return leading, layers.transpose(0, 1), marked


def _check_arguments(num_output_representations: object, dropout: float) -> None:
    if isinstance(num_output_representations, bool) or not isinstance(
        num_output_representations, int
    ):
        raise ElmolabError(
            f"num_output_representations must be an integer, got {num_output_representations!r}"
        )
    if num_output_representations < 1:
        raise ElmolabError(
            f"num_output_representations must be at least 1, got {num_output_representations}"
        )
    if not 0 <= dropout < 1:
        raise ElmolabError(f"dropout must be in [0, 1), got {dropout!r}")


def _fixed_weights(
    scalar_mix_parameters: Sequence[float] | None, options: BiLMOptions, path: PathLike | None
) -> Tensor | None:
    """``softmax(scalar_mix_parameters)`` ``(num_layers,)``, every representation's fixed
    weights (None: learned mixes), or an ElmolabError naming ``path`` if their count is not the
    biLM's."""
    if scalar_mix_parameters is None:
        return None
    n = options.lstm.n_layers
    layers = f"{n + 1} layers to mix (the token layer and {n} LSTM layers)"
    return _softmax_of(scalar_mix_parameters, n + 1, layers, path)


def _softmax_of(
    logits: Sequence[float], num_layers: int, layers: str, path: PathLike | None = None
) -> Tensor:
    values = list(logits)
    if len(values) != num_layers:
        raise ElmolabError(
            f"scalar_mix_parameters has {len(values)} values, the model has {layers}", path
        )
    return torch.softmax(torch.tensor(values, dtype=torch.float32), dim=0)


def _checked_char_ids(char_ids: object) -> Tensor:
    """``char_ids`` as long, or an ElmolabError that says what was given and what is expected:
    float or (batch, timesteps) word ids would otherwise fail deep in the char CNN."""
    expected = (
        f"Elmo expects integer character ids of shape (batch, timesteps, "
        f"{MAX_CHARACTERS_PER_TOKEN}), as batch_to_ids(sentences) makes them"
    )
    if not isinstance(char_ids, Tensor):
        raise ElmolabError(f"{expected}; got {type(char_ids).__name__}, not a tensor")
    shape = tuple(char_ids.shape)
    if char_ids.dtype == torch.bool or char_ids.is_floating_point() or char_ids.is_complex():
        raise ElmolabError(f"{expected}; got {char_ids.dtype} of shape {shape}")
    if char_ids.dim() == 2:
        raise ElmolabError(
            f"{expected}; got shape {shape}: word ids? Elmo reads each token's characters"
        )
    if char_ids.dim() < 3 or char_ids.shape[-1] != MAX_CHARACTERS_PER_TOKEN:
        raise ElmolabError(f"{expected}; got shape {shape}")
    return char_ids.long()  # a no-op for batch_to_ids' ids; the char CNN reads int64 only
