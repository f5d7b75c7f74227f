"""The ELMo biLM: a character CNN token encoder and two LSTM stacks, forward and backward.

For a sentence ``w_1 .. w_n`` the model reads ``<S> w_1 .. w_n </S>``::

    x_t     = CharCNN(chars(w_t))                               (proj)
    f^k_t   = forward LSTM layer k over x_0 .. x_t              (proj)
    b^k_t   = backward LSTM layer k over x_{n+1} .. x_t         (proj)
    layer 0 = [x_t; x_t],  layer k = [f^k_t; b^k_t]              (2 * proj)

and returns the layers for ``w_1 .. w_n`` (the marks are removed). The backward LSTM reads each
sentence reversed by its own length; its outputs are re-reversed so position t lines up.

States: stateless (the default) starts every call from zero. Stateful keeps ``(h, c)`` per row
from one call to the next (row r of batch k+1 starts where row r of batch k ended, at its last
real token), as bilm-tf and the reference PyTorch port do; ``reset_states()`` forgets them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from elmolab.core.errors import ElmolabError
from elmolab.core.fsutil import write_json
from elmolab.models.char_cnn import ACTIVATIONS, CharCNN
from elmolab.models.lstm import LstmPathChoice, LstmStack, LstmState, choose_lstm_path
from elmolab.models.lstm_paired import paired_forward
from elmolab.text.chars import BOS_TOKEN, EOS_TOKEN, N_CHARACTERS_INFERENCE, char_ids_for_token

ELMO_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]
PUBLISHED_SHAPES = {  # name: (lstm dim, projection dim, n_highway), all with ELMO_FILTERS
    "small": (1024, 128, 1),  # elmo_2x1024_128_2048cnn_1xhighway, 13.6M parameters
    "medium": (2048, 256, 1),  # elmo_2x2048_256_2048cnn_1xhighway, 28.0M parameters
    "original": (4096, 512, 2),  # elmo_2x4096_512_2048cnn_2xhighway, 93.6M parameters
}


@dataclass
class LstmOptions:
    """``options.json["lstm"]``."""

    dim: int  # memory cell size
    projection_dim: int  # output (and token vector) size; bilm-tf projects only when < dim
    n_layers: int  # LSTM layers per direction (2 in ELMo)
    cell_clip: float | None  # memory cells clipped to [-cell_clip, cell_clip]; None: no clip
    proj_clip: float | None  # projected outputs clipped likewise
    use_skip_connections: bool = False  # layer k >= 2 adds its input; absent key means False


@dataclass
class CharCNNOptions:
    """``options.json["char_cnn"]`` (``embedding.dim`` flattened to ``embedding_dim``)."""

    filters: list[list[int]]  # [[width, n_filters], ...]
    embedding_dim: int  # character embedding size (16 in ELMo)
    n_highway: int  # highway layers over the concatenated filters
    n_characters: int = N_CHARACTERS_INFERENCE  # must be 262: inference ids, 0 is padding
    max_characters_per_token: int = 50  # bytes are cut at this minus 2
    activation: str = "relu"  # after the max over positions: relu or tanh


@dataclass
class BiLMOptions:
    """bilm-tf's ``options.json``: ``{"lstm": {...}, "char_cnn": {...}, "dropout": p, ...}``.

    Keys that the reference implementations read without a default are required;
    ``use_skip_connections`` defaults to False and ``dropout`` (training only) to 0. Other
    top-level keys (bilm-tf's training settings such as ``n_tokens_vocab``) are kept in ``extra``
    and written back unchanged.
    """

    lstm: LstmOptions
    char_cnn: CharCNNOptions
    dropout: float = 0.0  # on every LSTM layer's input, in training only
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def published(cls, name: str, dropout: float = 0.0) -> BiLMOptions:
        """The options of a published ELMo size: ``small``, ``medium`` or ``original``."""
        dim, projection_dim, n_highway = PUBLISHED_SHAPES[name]
        return cls(
            LstmOptions(dim, projection_dim, 2, 3.0, 3.0, use_skip_connections=True),
            CharCNNOptions([list(f) for f in ELMO_FILTERS], 16, n_highway),
            dropout=dropout,
        )

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> BiLMOptions:
        """Read and validate an ``options.json``; every problem is an ElmolabError naming it."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ElmolabError("no such options file", path) from None
        except (OSError, UnicodeDecodeError) as error:
            raise ElmolabError(f"cannot read options file: {error}", path) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ElmolabError(f"not valid JSON: {error}", path) from None
        return cls.from_dict(data, source=path)

    @classmethod
    def from_dict(cls, data: Any, source: str | os.PathLike[str] | None = None) -> BiLMOptions:
        """Validate the parsed JSON; ``source`` names the file in error messages."""

        def require(ok: bool, problem: str) -> None:
            if not ok:
                raise ElmolabError(problem, source)

        def value(dotted: str, default: Any = ...) -> Any:
            node, keys = data, dotted.split(".")
            for depth, key in enumerate(keys):
                where = ".".join(keys[:depth])
                require(isinstance(node, dict), f"'{where or 'options'}' must be a JSON object")
                if key not in node:
                    require(default is not ..., f"missing key '{dotted}'")
                    return default
                node = node[key]
            return node

        def integer(dotted: str, minimum: int = 1) -> int:
            number = value(dotted)
            require(
                isinstance(number, int) and not isinstance(number, bool) and number >= minimum,
                f"'{dotted}' must be an integer >= {minimum}, got {number!r}",
            )
            return number

        def clip(dotted: str) -> float | None:
            number = value(dotted)
            require(
                number is None
                or (
                    isinstance(number, int | float) and not isinstance(number, bool) and number > 0
                ),
                f"'{dotted}' must be a positive number or null, got {number!r}",
            )
            return None if number is None else float(number)

        lstm = LstmOptions(
            dim=integer("lstm.dim"),
            projection_dim=integer("lstm.projection_dim"),
            n_layers=integer("lstm.n_layers"),
            cell_clip=clip("lstm.cell_clip"),
            proj_clip=clip("lstm.proj_clip"),
            use_skip_connections=bool(value("lstm.use_skip_connections", False)),
        )
        filters = value("char_cnn.filters")
        require(
            isinstance(filters, list)
            and len(filters) > 0
            and all(
                isinstance(f, list)
                and len(f) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in f)
                for f in filters
            ),
            f"'char_cnn.filters' must be a list of [width, n_filters], got {filters!r}",
        )
        cnn = CharCNNOptions(
            filters=filters,
            embedding_dim=integer("char_cnn.embedding.dim"),
            n_highway=integer("char_cnn.n_highway", minimum=0),
            n_characters=value("char_cnn.n_characters"),
            max_characters_per_token=integer("char_cnn.max_characters_per_token"),
            activation=value("char_cnn.activation"),
        )
        require(
            cnn.n_characters == N_CHARACTERS_INFERENCE,
            f"'char_cnn.n_characters' must be {N_CHARACTERS_INFERENCE} (inference ids, 0 is "
            f"padding; bilm-tf sets it after training), got {cnn.n_characters!r}",
        )
        require(
            isinstance(cnn.activation, str) and cnn.activation in ACTIVATIONS,
            f"'char_cnn.activation' must be one of {sorted(ACTIVATIONS)}, got {cnn.activation!r}",
        )
        require(
            max(w for w, _ in filters) <= cnn.max_characters_per_token,
            "a filter is wider than 'char_cnn.max_characters_per_token'",
        )
        require(
            lstm.projection_dim < lstm.dim,
            f"'lstm.projection_dim' ({lstm.projection_dim}) must be smaller than 'lstm.dim' "
            f"({lstm.dim}): bilm-tf stores no projection otherwise",
        )
        require(
            sum(n for _, n in filters) != lstm.projection_dim,
            "the filters add up to 'lstm.projection_dim': bilm-tf stores no CNN projection then, "
            "which elmolab does not support",
        )
        dropout = value("dropout", 0.0)
        require(
            isinstance(dropout, int | float) and not isinstance(dropout, bool) and 0 <= dropout < 1,
            f"'dropout' must be a number in [0, 1), got {dropout!r}",
        )
        extra = {k: v for k, v in data.items() if k not in ("lstm", "char_cnn", "dropout")}
        return cls(lstm, cnn, float(dropout), extra)

    def to_dict(self) -> dict[str, Any]:
        """The ``options.json`` content, in bilm-tf's nesting."""
        lstm, cnn = self.lstm, self.char_cnn
        return {
            "lstm": {
                "dim": lstm.dim,
                "projection_dim": lstm.projection_dim,
                "n_layers": lstm.n_layers,
                "cell_clip": lstm.cell_clip,
                "proj_clip": lstm.proj_clip,
                "use_skip_connections": lstm.use_skip_connections,
            },
            "char_cnn": {
                "embedding": {"dim": cnn.embedding_dim},
                "filters": [list(f) for f in cnn.filters],
                "n_highway": cnn.n_highway,
                "n_characters": cnn.n_characters,
                "max_characters_per_token": cnn.max_characters_per_token,
                "activation": cnn.activation,
            },
            "dropout": self.dropout,
            **self.extra,
        }

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write ``options.json`` atomically."""
        write_json(path, self.to_dict())


class BiLMOutput(NamedTuple):
    """What ``BiLM.forward`` returns."""

    layers: Tensor  # (batch, n_layers + 1, time, 2 * proj), zero past each row's length
    mask: Tensor  # (batch, time) bool: True where a token is (time + 2 with the marks kept)


class BiLMState(NamedTuple):
    """The recurrent state of both directions."""

    forward: LstmState  # h (layers, batch, proj), c (layers, batch, cell)
    backward: LstmState


class BiLM(nn.Module):
    """ELMo's bidirectional language model without its softmax (see the module docstring).

    ``BiLM(options, stateful=False, lstm_path="auto")``; ``options.dropout`` applies in train mode
    only. ``lstm_path`` picks how the LSTMs compute (``elmolab.models.lstm``: ``cell``,
    ``compiled``, ``fused``, ``paired``, ``native``, or ``auto``: fused without clips, native
    with them, paired where native's C++ loop cannot be built);
    every path computes the same function of the same parameters. Submodules:
    ``token_encoder`` (CharCNN), ``forward_lstm`` and ``backward_lstm`` (LstmStack).
    """

    def __init__(
        self, options: BiLMOptions, stateful: bool = False, lstm_path: str = "auto"
    ) -> None:
        super().__init__()
        self.options = options
        self.stateful = stateful
        cnn, lstm = options.char_cnn, options.lstm
        self.token_encoder = CharCNN(
            cnn.filters,
            cnn.embedding_dim,
            cnn.n_highway,
            lstm.projection_dim,
            cnn.n_characters,
            cnn.activation,
        )
        self.forward_lstm, self.backward_lstm = (
            LstmStack(
                lstm.n_layers,
                lstm.projection_dim,
                lstm.dim,
                lstm.projection_dim,
                lstm.cell_clip,
                lstm.proj_clip,
                lstm.use_skip_connections,
                options.dropout,
            )
            for _ in range(2)
        )
        max_chars = cnn.max_characters_per_token
        marks = [char_ids_for_token(t, max_chars) for t in (BOS_TOKEN, EOS_TOKEN)]
        self.register_buffer("sentence_marks", torch.tensor(marks), persistent=False)
        self._states: BiLMState | None = None
        self.lstm_path = self.set_lstm_path(lstm_path)

    def set_lstm_path(self, requested: str) -> LstmPathChoice:
        """Switch both LSTM stacks to the path ``requested`` resolves to; returns the choice."""
        lstm = self.options.lstm
        choice = choose_lstm_path(requested, lstm.cell_clip, lstm.proj_clip)
        for stack in (self.forward_lstm, self.backward_lstm):
            stack.set_path(choice.path)
        self.lstm_path = choice
        return choice

    def reset_states(self) -> None:
        """Forget the states carried between calls in stateful mode."""
        self._states = None

    def forward(self, char_ids: Tensor, keep_marks: bool = False) -> BiLMOutput:
        """``char_ids``: long (batch, time, chars), inference ids (+1 shift, 0 = padding), tokens
        left-aligned and without sentence marks: ``<S>``/``</S>`` are added here and removed from
        the outputs. Returns every layer (batch, n_layers + 1, time, 2 * proj) and the mask.

        ``keep_marks``: keep the marks instead, as allennlp's biLM returns its activations: layers
        (batch, n_layers + 1, time + 2, 2 * proj) with row r's ``<S>`` at 0 and ``</S>`` at
        ``n_r + 1``, and the mask (batch, time + 2) True on ``<S>``, the tokens and ``</S>``.
        """
        mask = (char_ids > 0).any(dim=-1)  # (batch, time)
        return self.contextualize(self.token_encoder(char_ids), mask, keep_marks)

    def contextualize(self, tokens: Tensor, mask: Tensor, keep_marks: bool = False) -> BiLMOutput:
        """``forward`` from token vectors (batch, time, proj), e.g. cached ones, and their mask
        (batch, time) bool, True on the left-aligned tokens of each row.
        """
        batch, time, proj = tokens.shape
        lengths = mask.sum(dim=1) + 2  # (batch,) with <S> and </S>
        order = torch.argsort(lengths, descending=True, stable=True)  # longest row first
        lengths = lengths[order]  # (batch,)
        steps = torch.arange(time + 2, device=tokens.device)  # (time + 2,)
        batch_sizes = (lengths[None, :] > steps[:, None]).sum(dim=1).tolist()  # rows per step

        bos, eos = self.token_encoder.encode_tokens(self.sentence_marks)  # (proj,) each
        x = tokens.new_zeros(batch, time + 2, proj)  # (batch, time + 2, proj)
        x[:, 1:-1] = tokens[order]
        x[:, 0] = bos
        x[torch.arange(batch, device=tokens.device), lengths - 1] = eos

        # Reversing row r maps position t < length_r to length_r - 1 - t; padding stays put.
        reverse = torch.where(steps < lengths[:, None], lengths[:, None] - 1 - steps, steps)
        reverse = reverse[..., None].expand_as(x)  # (batch, time + 2, proj)
        state = self._initial_state(order)
        forward, forward_state = self.forward_lstm(
            x, batch_sizes, None if state is None else state.forward
        )  # n_layers x (batch, time + 2, proj)
        backward, backward_state = self.backward_lstm(
            x.gather(1, reverse), batch_sizes, None if state is None else state.backward
        )  # n_layers x (batch, time + 2, proj), reversed
        if self.stateful:
            self._store_state(BiLMState(forward_state, backward_state), order)

        layers = [torch.cat([x, x], dim=-1)]  # (batch, time + 2, 2 * proj)
        for f, b in zip(forward, backward, strict=True):
            layers.append(torch.cat([f, b.gather(1, reverse)], dim=-1))
        stacked = torch.stack(layers, dim=1)  # (batch, n_layers + 1, time + 2, 2 * proj)
        if keep_marks:
            mask = steps < (mask.sum(dim=1) + 2)[:, None]  # (batch, time + 2)
        else:
            stacked = stacked[:, :, 1:-1]  # (batch, n_layers + 1, time, 2 * proj)
        restore = torch.argsort(order)  # (batch,)
        stacked = stacked[restore] * mask[:, None, :, None]  # zero past each row's end
        return BiLMOutput(stacked, mask)

    def encode_lm(
        self,
        forward_char_ids: Tensor,
        backward_char_ids: Tensor,
        states: BiLMState | None = None,
        resets: Tensor | None = None,
    ) -> tuple[list[Tensor], list[Tensor], BiLMState]:
        """Run both language models for training with truncated backpropagation through time.

        ``forward_char_ids`` and ``backward_char_ids``: long (batch, time, chars), inference ids,
        every row full (no padding) and already in reading order: the backward stream is the
        text reversed, sentence marks included as the stream has them. ``states``: where each
        row's previous window ended (None: zeros). ``resets``: bool (batch, time), True where
        both directions restart from the zero state (a sentence's first pair is at the same
        position in both streams).

        Returns the outputs of every LSTM layer of each direction, n_layers x (batch, time, proj)
        in reading order (``[-1]`` feeds the softmax; bilm-tf also applies dropout to it there),
        and the final states, detached so the next window does not backpropagate into this one.
        """
        both = torch.cat([forward_char_ids, backward_char_ids])  # (2 * batch, time, chars)
        return self.encode_lm_tokens(self.token_encoder(both), states, resets)

    def encode_lm_tokens(
        self, tokens: Tensor, states: BiLMState | None = None, resets: Tensor | None = None
    ) -> tuple[list[Tensor], list[Tensor], BiLMState]:
        """``encode_lm`` from the token vectors (2 * batch, time, proj) of both streams (forward
        rows first), e.g. to run the LSTMs twice over one pass of the char CNN."""
        batch = tokens.shape[0] // 2
        if self.lstm_path.path in ("paired", "native"):
            forward, backward, forward_state, backward_state = paired_forward(
                (self.forward_lstm, self.backward_lstm),
                tokens.view(2, batch, *tokens.shape[1:]),
                (None, None) if states is None else states,
                resets,
                native=self.lstm_path.path == "native",
            )
            return forward, backward, _detached(forward_state, backward_state)
        forward, forward_state = self.forward_lstm(
            tokens[:batch], None, None if states is None else states.forward, resets
        )
        backward, backward_state = self.backward_lstm(
            tokens[batch:], None, None if states is None else states.backward, resets
        )
        return forward, backward, _detached(forward_state, backward_state)

    def _initial_state(self, order: Tensor) -> BiLMState | None:
        """The stored states of rows ``0 .. batch - 1`` (zeros for rows never seen), sorted."""
        if not self.stateful or self._states is None:
            return None
        return BiLMState(
            *(
                LstmState(*(_with_rows(s, len(order))[:, order] for s in direction))
                for direction in self._states
            )
        )

    def _store_state(self, final: BiLMState, order: Tensor) -> None:
        """Store a sorted batch's final states under rows ``order``; other rows keep theirs."""
        if self._states is None:
            self._states = BiLMState(*(LstmState(*map(torch.zeros_like, d)) for d in final))

        def merge(stored: Tensor, new: Tensor) -> Tensor:  # (layers, rows, dim)
            merged = _with_rows(stored, len(order)).clone()
            merged[:, order] = new.detach()
            return merged

        self._states = BiLMState(
            *(
                LstmState(*map(merge, old, new))
                for old, new in zip(self._states, final, strict=True)
            )
        )


def _detached(forward: LstmState, backward: LstmState) -> BiLMState:
    """Both directions' final states, detached: the next window does not backpropagate here."""
    return BiLMState(
        LstmState(*(s.detach() for s in forward)), LstmState(*(s.detach() for s in backward))
    )


def _with_rows(stored: Tensor, rows: int) -> Tensor:
    """A state (layers, stored rows, dim) with zero rows appended up to at least ``rows``."""
    missing = rows - stored.shape[1]
    if missing <= 0:
        return stored
    return torch.cat([stored, stored.new_zeros(stored.shape[0], missing, stored.shape[2])], dim=1)
