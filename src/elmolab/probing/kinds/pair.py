"""Pair probes: the label of each word's arc to its gold head (dependency labels).

The reference (:class:`PairProbe`) classifies ``[dep; head; dep * head]`` of a word's and its
head's inputs, a root vector standing for the head of the root word; the batched heads
(:class:`PairProbes`) are the token probes' on those pairs, read from a table of each split's
pairs made once (:meth:`PairProbes._pair_table`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from elmolab.core.schema import TaskKind
from elmolab.probing.datasets import FeatureDataset
from elmolab.probing.heads import Part, float32_region, take_rows
from elmolab.probing.kinds.kind import ProbeKind, ProbeTask
from elmolab.probing.kinds.token import (
    LabelProbe,
    TokenProbes,
    classifier_options,
    labelling_probes,
    token_data,
)
from elmolab.probing.probes import BASELINE_LAYER, Classifier, LayerInput
from elmolab.probing.settings import Schedule

PAIR_TABLE_TOKENS = 8192  # tokens per piece when a split's pair table is made
LEARNED = -1  # a block of a pair head's input mixed by the head's learned mix

# --- The reference ------------------------------------------------------------------------------


class PairProbe(LabelProbe):
    """The label of each word's arc to its gold head: the layers of the words and of their heads,
    ``(L, N, dim)`` each, and ``is_root`` ``(N,)`` -> logits ``(N, labels)`` of
    ``[dep; head; dep * head]``, the root vector standing for the head of a root word. With
    ``layer_norm``, words and heads are normalized together (a root word's head slot holds any
    row; the root vector replaces it)."""

    def __init__(
        self, input: LayerInput, labels: int, generator: torch.Generator, root: str, **mlp
    ) -> None:
        super().__init__(input, root)
        self.classifier = Classifier(generator, 3 * input.width, labels, **mlp)

    def forward(self, deps: torch.Tensor, heads: torch.Tensor, is_root: torch.Tensor):
        dep, head = self.input(torch.cat([deps, heads], dim=1)).chunk(2, dim=0)
        head = torch.where(is_root[:, None], self.root, head)
        return self.classifier(torch.cat([dep, head, dep * head], dim=-1))

    def split_logits(self, split: FeatureDataset, rows: torch.Tensor) -> torch.Tensor:
        layers = split.features[:, rows].float()
        assert split.heads is not None
        heads = split.heads[rows]
        return self(layers, split.features[:, heads.clamp(min=0)].float(), heads < 0)


# --- The batched heads --------------------------------------------------------------------------


class PairProbes(TokenProbes):
    """Pair probes, the label of each word's arc to its gold head, from
    ``[x_dep; x_head; x_dep * x_head]``, a root vector standing in for the head of root words:
    the token probes (linear or MLP, per head) on pairs."""

    pair = True

    def _prepare_inputs(self) -> None:
        """The plan of the pair tables (no side-by-side copy of the splits: pairs are read)."""
        # Pair heads read their inputs from a table of each split (:meth:`_pair_table`), made
        # once: per layer mix ``c`` of ``pair_mixes`` (each fixed mix and concatenated layer of a
        # head, each layer for learned mixes) and token, ``[dep_c; head_c; dep_c * head_c]``. A
        # step then gathers its minibatch's rows once, and a fixed input takes no mixing and no
        # products of features; a learned mix mixes the layers' rows. Not with ``layer_norm``,
        # whose statistics are the minibatch's (:meth:`_pair_logits` then mixes the features).
        # ``table_blocks``: per part, per head, the mixes side by side in its input (LEARNED: the
        # head's own mix).
        self.pair_mixes: list[tuple[float, ...]] = []
        self.table_blocks: list[list[list[int]]] = []
        self.pair_tables: dict[str, torch.Tensor] = {}
        if not self.layer_norm:
            for part in self.parts:
                if part.mix is not None and bool(part.mix.learned.any()):
                    blocks = [LEARNED]
                    if part.baseline:
                        blocks.insert(0, self._pair_mix(_one_hot(BASELINE_LAYER, self.num_layers)))
                    self.table_blocks.append([blocks] * len(part.index))
                    continue
                coefficients = self.layer_coefficients(part, torch.arange(len(part.index)))
                self.table_blocks.append(
                    [[self._pair_mix(tuple(block.tolist())) for block in h] for h in coefficients]
                )
            if any(LEARNED in blocks for part in self.table_blocks for blocks in part):
                self.layer_mixes = torch.tensor(
                    [self._pair_mix(_one_hot(k, self.num_layers)) for k in range(self.num_layers)]
                )

    def _part_logits(
        self,
        role: str,
        batches: Sequence[torch.Tensor],
        groups: torch.Tensor,
        active: torch.Tensor,
    ) -> list[tuple[Part, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """As :meth:`TokenProbes._part_logits`, on pairs: from the pair table, or (with
        ``layer_norm``) from the features of each minibatch's words and heads."""
        split = self.splits[role]
        assert split.heads is not None
        outputs = []
        if self.table_blocks:
            table = self._pair_table(role)
            rows = [_table_rows(table, batch) for batch in batches]  # (mixes, B, 3 * dim) each
            roots = [torch.nonzero(split.heads[batch] < 0).flatten() for batch in batches]
            for part, blocks in zip(self.parts, self.table_blocks, strict=True):
                local, numbers = self.members(part, active)
                if len(local):
                    logits = self._table_logits(part, rows, roots, blocks, groups[numbers], local)
                    outputs.append((part, local, numbers, logits))
            return outputs
        layers, is_root = self._pair_rows(split, batches)
        for part in self.parts:
            local, numbers = self.members(part, active)
            if len(local):
                logits = self._pair_logits(part, layers, is_root, groups[numbers], local)
                outputs.append((part, local, numbers, logits))
        return outputs

    def _pair_mix(self, mix: tuple[float, ...]) -> int:
        """The number of a layer mix in ``pair_mixes``, added if new."""
        if mix not in self.pair_mixes:
            self.pair_mixes.append(mix)
        return self.pair_mixes.index(mix)

    def _pair_table(self, role: str) -> torch.Tensor:
        """``(tokens, mixes, 3 * dim)`` in the probes' type, made on first use: per token of
        split ``role`` and layer mix ``c`` of ``pair_mixes``, ``[dep_c; head_c; dep_c * head_c]``,
        mixed as :class:`ScalarMix` mixes, with zeros for the head of a word headed by the root
        (whose terms :meth:`_table_logits` adds per head, from the head's root vector)."""
        if role not in self.pair_tables:
            split = self.splits[role]
            assert split.heads is not None
            mixes = torch.tensor(self.pair_mixes)  # (mixes, num_layers)
            table = torch.empty(len(split.labels), len(mixes), 3 * split.dim, dtype=self.dtype)
            for chunk in torch.arange(len(split.labels)).split(PAIR_TABLE_TOKENS):
                heads = split.heads[chunk]
                x = _rows(split.features, torch.cat([chunk, heads.clamp(min=0)]), 1, self.dtype)
                with self.autocast():
                    mixed = (mixes @ x.view(len(x), -1)).to(self.dtype)  # (mixes, 2n * dim)
                deps, head = mixed.view(len(mixes), 2, len(chunk), -1).unbind(1)
                head = head.masked_fill((heads < 0)[None, :, None], 0.0)
                start, stop = int(chunk[0]), int(chunk[-1]) + 1
                table[start:stop] = torch.cat([deps, head, deps * head], dim=-1).transpose(0, 1)
            self.pair_tables[role] = table
        return self.pair_tables[role]

    def _table_logits(
        self,
        part: Part,
        rows: Sequence[torch.Tensor],
        roots: Sequence[torch.Tensor],
        blocks: Sequence[Sequence[int]],
        groups: torch.Tensor,
        local: torch.Tensor,
    ) -> torch.Tensor:
        """The pair logits ``(h, B, labels)`` of a part's heads ``local`` from the pair table:
        head ``i`` reads ``rows[groups[i]]`` ``(mixes, B, 3 * dim)``, its minibatch's rows of the
        table, whose blocks ``blocks[local[i]]`` side by side (a learned mix: the table's layers
        mixed) make its input; ``roots[g]``: the rows of minibatch ``g`` headed by the root.

        The first map ``W [dep; head; dep * head]`` of an input of ``k`` blocks is the sum of
        ``k`` maps of the blocks' ``[dep_c; head_c; dep_c * head_c]``, one product for all the
        heads' blocks; on the rows headed by the root, whose table rows hold a zero head, it adds
        ``W_head r + W_product (dep * r)`` (``r`` the head's root vector), as
        :meth:`_pair_logits` computes with ``r`` in place of the head."""
        assert part.root is not None
        first = part.probe.first
        outputs, order = [], []
        for group in groups.unique().tolist():
            which = torch.nonzero(groups == group).flatten()
            heads = local[which]
            x = self._table_inputs(part, rows[group], [blocks[i] for i in heads.tolist()], heads)
            weight = take_rows(first.weight, heads)  # (h, d_out, 3 * width)
            h, d_out, k = len(heads), weight.shape[1], len(blocks[0])
            dim = x.shape[-1] // 3
            # per head and block, the columns of its [dep_c; head_c; dep_c * head_c]
            pieces = weight.view(h, d_out, 3, k, dim).transpose(1, 3).transpose(2, 3)
            pieces = pieces.reshape(h * k, d_out, 3 * dim)
            # (h * k, d_out, B): the outputs along the rows, whose weight gradient (output
            # gradient times input) then runs in the product's fast layout; the input's
            # gradient (a learned mix) wants the other
            y = torch.bmm(x, pieces.mT).mT if x.requires_grad else torch.bmm(pieces, x.mT)
            root_rows = roots[group]
            if part.root.vector.requires_grad and len(root_rows):
                r = take_rows(part.root.vector, heads).to(x.dtype).view(h * k, 1, dim)
                deps = x[:, root_rows, :dim]  # (h * k, roots, dim)
                head_side = torch.cat([r.expand_as(deps), deps * r], dim=-1)
                y = y.index_add(2, root_rows, torch.bmm(pieces[:, :, dim:], head_side.mT))
            y = y.view(h, k, *y.shape[1:]).sum(dim=1) if k > 1 else y
            outputs.append(y + take_rows(first.bias, heads).to(y.dtype)[:, :, None])
            order.append(which)
        y = outputs[0] if len(outputs) == 1 else torch.cat(outputs)[torch.argsort(torch.cat(order))]
        return part.probe.rest(y.mT, local)

    def _table_inputs(
        self,
        part: Part,
        rows: torch.Tensor,
        blocks: Sequence[Sequence[int]],
        heads: torch.Tensor,
    ) -> torch.Tensor:
        """The blocks of heads ``heads`` (positions in ``part``) reading the table rows ``rows``
        ``(mixes, B, 3 * dim)``: ``(h * k, B, 3 * dim)``, head by head, ``k`` blocks each."""
        fixed = [mix for head in blocks for mix in head if mix != LEARNED]
        if len(fixed) == sum(len(head) for head in blocks):
            return take_rows(rows, torch.tensor(fixed))
        assert part.mix is not None
        s = part.mix.coefficients(heads)  # (h, num_layers)
        layers = take_rows(rows, self.layer_mixes)[..., : 2 * rows.shape[-1] // 3]  # [dep; head]
        with float32_region():  # a product over a few layers runs faster in float32 than in bf16
            dep_head = s @ layers.float().reshape(len(layers), -1)
        deps, head = dep_head.to(rows.dtype).view(len(heads), *layers.shape[1:]).chunk(2, dim=-1)
        mixed = torch.cat([deps, head, deps * head], dim=-1)  # (h, B, 3 * dim)
        if not fixed:
            return mixed
        baseline = take_rows(rows, torch.tensor(fixed))  # (h, B, 3 * dim)
        return torch.stack([baseline, mixed], dim=1).flatten(0, 1)

    def _pair_rows(
        self, split: FeatureDataset, batches: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layers ``(num_layers, G, 2B, dim)`` of the minibatches' dependents, then their heads,
        in the probes' type, and whether each head is the root ``(G, B)``."""
        assert split.heads is not None
        head_rows = [split.heads[batch] for batch in batches]
        rows = torch.cat(
            [torch.cat([b, h.clamp(min=0)]) for b, h in zip(batches, head_rows, strict=True)]
        )
        return _rows(split.features, rows, len(batches), self.dtype), torch.stack(head_rows) < 0

    def _pair_logits(
        self,
        part: Part,
        x: torch.Tensor,
        is_root: torch.Tensor,
        groups: torch.Tensor,
        local: torch.Tensor,
    ) -> torch.Tensor:
        # The heads' inputs as blocks (h, N, d_k), e.g. a concatenation's layers.
        blocks = self.inputs(part, x, groups, local)
        assert part.root is not None
        # [dep; head; dep * head], each as wide as the heads' input
        deps, heads = zip(*(block.chunk(2, dim=1) for block in blocks), strict=True)
        roots = part.root.vector[local].to(blocks[0].dtype)
        roots = roots.split([block.shape[-1] for block in blocks], dim=-1)
        # An MLP's dropout in training draws one mask per row and pass: two passes would give the
        # root rows a second mask (and move the head's generator), so it classifies once.
        classifier = part.probe
        dropout = classifier.training and classifier.hidden is not None and classifier.dropout > 0
        if (
            not (roots[0].requires_grad and torch.is_grad_enabled())
            or blocks[0].requires_grad
            or dropout
        ):
            root_rows = is_root[groups][..., None]  # (h, B, 1)
            heads = tuple(
                torch.where(root_rows, root[:, None, :], head)
                for root, head in zip(roots, heads, strict=True)
            )
            return part.probe(_pair_blocks(deps, heads), local)
        # Only the root rows (a few per cent) carry a gradient to the inputs, to the learned root
        # vector: every row is classified with the features' head (no input gradient, so the
        # backward pass skips a third of its work), then the root rows again, with the root.
        logits = part.probe(_pair_blocks(deps, heads), local)
        # Minibatch by minibatch, so that no product's shape depends on another seed's batch
        # (which would change its rounding, and Adam turns rounding into steps).
        for group, mask in enumerate(is_root):
            rows = torch.nonzero(mask).flatten()  # (r,)
            members = torch.nonzero(groups == group).flatten()  # (g,) the group's heads here
            if not len(rows) or not len(members):
                continue
            dep_rows = [dep[members][:, rows] for dep in deps]  # (g, r, dim) each
            root_rows = [
                root[members][:, None, :].expand_as(dep)
                for root, dep in zip(roots, dep_rows, strict=True)
            ]
            root_logits = part.probe(_pair_blocks(dep_rows, root_rows), local[members])
            logits = logits.index_put((members[:, None], rows[None, :]), root_logits)
        return logits


def _pair_blocks(deps: Sequence[torch.Tensor], heads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """A pair probe's input ``[dep; head; dep * head]`` as blocks (each side itself in blocks)."""
    return [*deps, *heads, *(dep * head for dep, head in zip(deps, heads, strict=True))]


def _table_rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The pair table's ``rows`` ``(mixes, B, 3 * dim)``: a gather of whole rows (an evaluation's
    consecutive chunk: a slice), laid out mix by mix for the products."""
    return take_rows(table, rows).transpose(0, 1).contiguous()


def _one_hot(layer: int, num_layers: int) -> tuple[float, ...]:
    return tuple(float(k == layer) for k in range(num_layers))


def _rows(
    features: torch.Tensor, rows: torch.Tensor, groups: int, dtype: torch.dtype
) -> torch.Tensor:
    """``features[:, rows]`` as ``dtype`` ``(num_layers, groups, len(rows) // groups, dim)``."""
    gathered = features.index_select(1, rows).to(dtype)  # (num_layers, rows, dim)
    return gathered.view(gathered.shape[0], groups, -1, gathered.shape[-1])


# --- The kind -----------------------------------------------------------------------------------


def _reference(input: LayerInput, generator: torch.Generator, task: ProbeTask):
    assert task.vocabulary is not None
    labels = task.vocabulary.num_train_labels
    options = classifier_options(task.settings)
    return PairProbe(input, labels, generator, task.settings.root, **options), token_data(task)


KINDS = (
    ProbeKind(
        TaskKind.PAIR,
        PairProbe,
        PairProbes,
        _reference,
        labelling_probes(PairProbes),
        lambda settings: Schedule.of_probe(settings, settings.pair_lr),
        labelled=True,
        conditional=True,
    ),
)
