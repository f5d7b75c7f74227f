"""Pretraining throughput: tokens/s of a preset in fp32 and bf16-mixed, against the machine.

Prints, measured in this one run on this machine (CPU model first): the fp32 matmul rate
(GFLOP/s), the model's FLOP per training token (forward + backward = 3x the forward matmuls), the
training tokens/s of the real Lightning training loop (Trainer, data module, the configured
softmax) in fp32 and, where the CPU runs bf16 natively (or --precisions asks), bf16-mixed, and the
model FLOP rate as a fraction of the fp32 matmul rate.

The char CNN's FLOP are counted two ways: per position (every token of both streams, every
filter over every valid window, as a textbook count would) and as the model computes them (once
per distinct token of a batch, in chunks of 32 tokens sorted by length, each chunk's windows over
its longest token plus the widest filter, every filter zero-padded to the widest): counted on
real training batches. The rate and the share of the matmul rate use the second count.

Run: .venv/bin/python bench/train.py [--model cpu_default] [--steps 40] [--threads 2]
(needs artifacts/corpus: `dvc repro prepare`). A GPU run: --model elmo_small --accelerator gpu.
Idle OpenMP threads spin (OMP_WAIT_POLICY=ACTIVE, as the stage) unless the environment sets it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
import yaml
from omegaconf import OmegaConf

from elmolab.config import section
from elmolab.hardware import cpu_model, native_bf16_flags
from elmolab.models.char_cnn import length_chunks
from elmolab.params import compose_params
from elmolab.text.vocab import Vocabulary
from elmolab.training.data import LMDataModule
from elmolab.training.pretrain import ModelConfig, PretrainConfig, make_module

ROOT = Path(__file__).resolve().parents[1]


def matmul_gflops(n: int = 2048, repeats: int = 10, dtype: torch.dtype = torch.float32) -> float:
    """The sustained rate of an (n x n) @ (n x n) product."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(2):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e9


def per_position_token_flop(model: ModelConfig) -> float:
    """Forward FLOP of the char CNN per training token, counted per position: every token of
    both streams, every filter over its valid windows."""
    cnn, proj = model.char_cnn, model.lstm["projection_dim"]
    n_filters = sum(n for _, n in cnn["filters"])
    chars, char_dim = cnn["max_characters_per_token"], cnn["embedding"]["dim"]
    conv = sum(2 * (chars - w + 1) * w * char_dim * n for w, n in cnn["filters"])
    highway = cnn["n_highway"] * 2 * (2 * n_filters * n_filters)
    return 2 * (conv + highway + 2 * n_filters * proj)  # forward and backward inputs


def computed_token_flop(model: ModelConfig, data: LMDataModule, batches: int = 20) -> float:
    """Forward FLOP of the char CNN per training token as ``CharCNN.forward`` computes them,
    counted on ``batches`` real training batches (see the module docstring)."""
    cnn, proj = model.char_cnn, model.lstm["projection_dim"]
    n_filters = sum(n for _, n in cnn["filters"])
    max_width = max(w for w, _ in cnn["filters"])
    char_dim = cnn["embedding"]["dim"]
    total, tokens = 0.0, 0
    for _, batch in zip(range(batches), iter(data.train_dataloader()), strict=False):
        both = torch.cat([batch["forward_char_ids"], batch["backward_char_ids"]])
        distinct = torch.unique(both.reshape(-1, both.shape[-1]), dim=0)  # (distinct, chars)
        _, chunks = length_chunks(distinct, max_width)
        for start, end, frame in chunks:
            total += 2 * (end - start) * frame * max_width * char_dim * n_filters
        total += len(distinct) * (cnn["n_highway"] * 4 * n_filters**2 + 2 * n_filters * proj)
        tokens += batch["forward_char_ids"].shape[0] * batch["forward_char_ids"].shape[1]
    return total / tokens


def flop_per_token(
    model: ModelConfig, settings: PretrainConfig, vocab_size: int, token_flop: float
) -> float:
    """Training FLOP per token (both directions): 3x the forward multiply-adds x 2, with the
    char CNN's forward FLOP per token given."""
    lstm = model.lstm
    proj, cell = lstm["projection_dim"], lstm["dim"]
    # LSTMs: per layer and direction, [x; h] @ W_0 and the projection.
    lstm_flop = 2 * lstm["n_layers"] * (2 * (proj + proj) * 4 * cell + 2 * cell * proj)
    if settings.softmax.kind == "sampled":
        classes = min(settings.softmax.n_negative_samples + 1, vocab_size)
    else:
        classes = vocab_size
    softmax = 2 * (2 * proj * classes)
    return 3.0 * (token_flop + lstm_flop + softmax)


class _Timer(pl.Callback):
    def __init__(self, warmup: int) -> None:
        self.warmup, self.steps, self.seconds, self._t = warmup, 0, 0.0, 0.0

    def on_train_batch_start(self, *args: object) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, *args: object) -> None:
        self.steps += 1
        if self.steps > self.warmup:
            self.seconds += time.perf_counter() - self._t


def tokens_per_second(
    model: ModelConfig,
    settings: PretrainConfig,
    corpus: Path,
    vocab_size: int,
    precision: str,
    steps: int,
    accelerator: str,
) -> float:
    pl.seed_everything(1, verbose=False)
    data = LMDataModule(corpus, settings.batch_size, settings.unroll_steps, seed=1)
    module = make_module(model, settings, vocab_size)
    warmup = max(3, steps // 5)
    timer = _Timer(warmup)
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_steps=steps,
        limit_val_batches=0,
        gradient_clip_val=settings.gradient_clip_val,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    trainer.fit(module, datamodule=data)
    measured = timer.steps - warmup
    return measured * settings.batch_size * settings.unroll_steps / timer.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cpu_default", help="a conf/model preset")
    parser.add_argument("--steps", type=int, default=40, help="training steps per precision")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--corpus", type=Path, default=ROOT / "artifacts" / "corpus")
    parser.add_argument(
        "--precisions",
        nargs="+",
        default=None,
        help="Lightning precisions (default: 32-true, and bf16-mixed where the CPU runs bf16 "
        "natively or on a GPU)",
    )
    args = parser.parse_args()
    if "OMP_WAIT_POLICY" not in os.environ:
        # As the pretrain stage runs (elmolab.openmp): idle OpenMP threads spin. OpenMP reads
        # the variable when torch loads, so the script restarts itself with it.
        os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    torch.set_num_threads(args.threads)
    precisions = args.precisions
    if precisions is None:
        native = args.accelerator != "cpu" or native_bf16_flags()
        precisions = ["32-true", "bf16-mixed"] if native else ["32-true"]
    cfg = OmegaConf.create(yaml.safe_load(compose_params(ROOT / "conf", [f"model={args.model}"])))
    model = section(cfg, "model", ModelConfig)
    settings = section(cfg, "pretrain", PretrainConfig)
    vocab_size = len(Vocabulary.from_file(args.corpus / "vocab.txt"))
    data = LMDataModule(args.corpus, settings.batch_size, settings.unroll_steps, seed=1)
    data.setup("fit")

    per_position = per_position_token_flop(model)
    computed = computed_token_flop(model, data)
    flop = flop_per_token(model, settings, vocab_size, computed)
    rate = matmul_gflops() if args.accelerator == "cpu" else math.nan
    shared = " shared by both directions" if settings.softmax.share_negatives else " per direction"
    print(
        f"CPU: {cpu_model()}; native bf16: {', '.join(native_bf16_flags()) or 'no'}; "
        f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}"
    )
    print(
        f"model {args.model}: batch {settings.batch_size} x unroll {settings.unroll_steps}, "
        f"softmax {settings.softmax.kind} ({settings.softmax.n_negative_samples} negatives"
        f"{shared}), vocabulary {vocab_size:,}, {args.threads} threads"
    )
    print(f"fp32 matmul rate (2048^3, measured): {rate:8.1f} GFLOP/s")
    print(
        f"char CNN forward FLOP per token: {per_position / 1e6:8.2f} MFLOP counted per position, "
        f"{computed / 1e6:8.2f} MFLOP as computed (distinct tokens, chunked frames)"
    )
    print(
        f"training FLOP per token:          {flop / 1e6:8.2f} MFLOP as computed "
        f"({flop_per_token(model, settings, vocab_size, per_position) / 1e6:.2f} with the "
        "per-position char CNN count)"
    )
    results = {}
    for precision in precisions:
        tps = tokens_per_second(
            model, settings, args.corpus, vocab_size, precision, args.steps, args.accelerator
        )
        results[precision] = tps
        print(
            f"{precision:>11}: {tps:9.0f} tokens/s = {tps * flop / 1e9:7.1f} GFLOP/s "
            f"= {tps * flop / 1e9 / rate:6.1%} of the fp32 matmul rate"
        )
    if "32-true" in results and "bf16-mixed" in results:
        print(f"bf16-mixed / fp32 throughput: x{results['bf16-mixed'] / results['32-true']:.2f}")


if __name__ == "__main__":
    main()
