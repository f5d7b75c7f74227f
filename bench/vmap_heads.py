"""The engine's stacked token heads against ``torch.func``'s vmap over the reference probes.

``torch.func.stack_module_state`` stacks the parameters of modules of one structure, and
``vmap(functional_call)`` runs one module's forward over them: the reference probes
(``elmolab.probing.kinds.token.TokenProbe``) batched without a hand-written batched form. This
times one training step's forward and backward (no optimizer step: the same Adam follows either)
of the token heads of one fit, every feature mode and seeds 1-3 on synthetic features, both in
float32 on one thread as the probe stage runs: the engine's ``TokenProbes.step_loss`` (linear
heads: one folded product per seed's minibatch) and vmap over each group of heads of one
structure (the fixed mixes; the learned mixes; the concatenations), each head reading its seed's
minibatch.

Run: .venv/bin/python bench/vmap_heads.py [--dim 1024 --labels 17 --batch 1024 --steps 20]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch.func import functional_call, stack_module_state, vmap
from torch.nn import functional as F

from elmolab.core.config import section
from elmolab.core.hardware import cpu_model
from elmolab.core.schema import ProbeSettings
from elmolab.io.results import FeatureMode
from elmolab.probing.datasets import FeatureDataset
from elmolab.probing.kinds.token import TokenProbe, TokenProbes, classifier_options
from elmolab.probing.metrics import LabelVocabulary
from elmolab.probing.probes import Head, LayerInput

MODES = ["layer0", "layer1", "layer2", "mean", "scalar_mix", "concat"]
SEEDS = (1, 2, 3)
NUM_LAYERS = 3
CONF = Path(__file__).resolve().parents[1] / "conf"


def _splits(dim: int, labels: int, tokens: int) -> dict[str, FeatureDataset]:
    generator = torch.Generator().manual_seed(0)
    sentences = tokens // 20
    features = [torch.randn(NUM_LAYERS, 20, dim, generator=generator) for _ in range(sentences)]
    tags = [torch.randint(labels, (20,), generator=generator).tolist() for _ in range(sentences)]
    split = FeatureDataset.from_sentences(features, tags)
    return {"train": split, "dev": split, "test": split}


def _vmapped_loss(groups, x: torch.Tensor, y: torch.Tensor, l2_lambda: float) -> torch.Tensor:
    """The summed loss of every group of reference probes, each head on its seed's minibatch:
    ``x`` ``(seeds, L, N, dim)``, ``y`` ``(seeds, N)``. A group of one seed's heads shares its
    minibatch (``in_dims`` None); a group of several seeds gathers each head's (a copy)."""
    total = torch.zeros(())
    for base, params, buffers, seeds in groups:

        def loss(p, b, xs, ys, base=base):
            logits = functional_call(base, (p, b), (xs,))  # (N, labels)
            penalty = l2_lambda * (p["input.mix.w"] ** 2).sum() if "input.mix.w" in p else 0.0
            return F.cross_entropy(logits, ys) + penalty

        if len(set(seeds.tolist())) == 1:
            seed = int(seeds[0])
            losses = vmap(loss, in_dims=(0, 0, None, None))(params, buffers, x[seed], y[seed])
        else:
            losses = vmap(loss)(params, buffers, x[seeds], y[seeds])
        total = total + losses.sum()
    return total


def _groups(heads: list[Head], settings, dim: int, labels: int, by_seed: bool) -> list:
    """The reference probes of ``heads``, stacked by structure (a fixed mix, a learned mix, a
    concatenation) and, ``by_seed``, by seed: per group its module on the meta device, its
    stacked parameters and buffers, and its heads' seed numbers."""
    references: dict = {}
    for head in heads:
        layer_input = LayerInput(head.mode, NUM_LAYERS, dim, l2_lambda=settings.l2_lambda)
        generator = torch.Generator().manual_seed(head.seed)
        probe = TokenProbe(layer_input, labels, generator, **classifier_options(settings))
        structure = head.mode if head.mode in (FeatureMode.SCALAR_MIX, FeatureMode.CONCAT) else None
        key = (structure, head.seed if by_seed else None)
        references.setdefault(key, []).append((probe, SEEDS.index(head.seed)))
    groups = []
    for members in references.values():
        params, buffers = stack_module_state([probe for probe, _ in members])
        base = copy.deepcopy(members[0][0]).to("meta")
        groups.append((base, params, buffers, torch.tensor([seed for _, seed in members])))
    return groups


def _median_ms(step, steps: int) -> float:
    step()  # oneDNN builds its kernels per shape on the first call
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--labels", type=int, default=17)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = OmegaConf.create({"paths": {"artifacts": "artifacts", "data": "data"}})
    cfg.probe = OmegaConf.load(CONF / "probe" / "default.yaml")
    defaults = section(cfg, "probe", ProbeSettings, where=str(CONF / "probe" / "default.yaml"))
    settings = dataclasses.replace(
        defaults, precision="32-true", kind="linear", layer_norm=False, batch_size=args.batch
    )
    splits = _splits(args.dim, args.labels, 4 * args.batch)
    heads = [Head(FeatureMode(mode), seed) for mode in MODES for seed in SEEDS]
    vocabulary = LabelVocabulary([str(label) for label in range(args.labels)])

    probes = TokenProbes(heads, splits, vocabulary, "accuracy", settings)
    shuffles = [torch.Generator().manual_seed(seed) for seed in probes.seeds]
    step = next(probes.epoch_steps(shuffles))  # a minibatch per seed
    active = torch.ones(len(heads), dtype=torch.bool)

    def engine_step() -> None:
        for p in probes.parameters():
            p.grad = None
        total, _, _ = probes.step_loss(step, active)
        total.backward()

    train = splits["train"]
    x = torch.stack([train.features[:, rows].float() for rows in step])  # (seeds, L, N, dim)
    y = torch.stack([train.labels[rows] for rows in step])  # (seeds, N)
    engine_total = float(probes.step_loss(step, active)[0].detach())
    times = {}
    for by_seed in (False, True):
        groups = _groups(heads, settings, args.dim, args.labels, by_seed)

        def vmap_step(groups=groups) -> None:
            for _, params, _, _ in groups:
                for p in params.values():
                    p.grad = None
            _vmapped_loss(groups, x, y, settings.l2_lambda).backward()

        # the same work: each side's summed loss (the heads draw the same parameters)
        total = float(_vmapped_loss(groups, x, y, settings.l2_lambda).detach())
        assert abs(engine_total - total) <= 1e-4 * abs(engine_total), (engine_total, total)
        times[by_seed] = _median_ms(vmap_step, args.steps)
    engine = _median_ms(engine_step, args.steps)
    print(f"{cpu_model()}, 1 thread, float32; {len(heads)} linear token heads, {NUM_LAYERS}")
    print(f"layers of {args.dim}, {args.labels} labels, {args.batch} tokens per seed's minibatch")
    print(f"engine (TokenProbes.step_loss + backward): {engine:.1f} ms per step")
    for by_seed, words in ((False, "per structure"), (True, "per structure and seed")):
        vmapped = times[by_seed]
        print(
            f"vmap(functional_call) over TokenProbe, {words}: {vmapped:.1f} ms per step"
            f" ({vmapped / engine:.2f}x the engine's)"
        )


if __name__ == "__main__":
    main()
