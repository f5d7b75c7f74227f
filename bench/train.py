"""Pretraining throughput: tokens/s of every LSTM path of a preset side by side, against the CPU.

Prints, measured in this one run on this machine (CPU model and the precision chosen for it
first): the fp32 matmul rate (GFLOP/s) and the bf16 one where the CPU runs bf16 natively (not
where it would be emulated: minutes of matmuls no run computes), the model's FLOP per training
token (forward + backward = 3x the forward matmuls), and for each LSTM path, batch size and
precision the training tokens/s of the real Lightning training loop (Trainer, data module, the
configured softmax) with the model FLOP rate as a share of the matmul rates. The paths
(``pretrain.lstm_path``):

- ``cell``: bilm-tf's cell with its clips (``--clip``, bilm-tf's 3): the CPU default's path
  until ``paired`` came;
- ``paired``: the same clipped cell with both directions in one time loop and hand-written
  gradients;
- ``native``: ``paired`` with its time loop in C++: what ``lstm_path: auto`` picks for a model
  with clips where a C++ compiler builds elmolab's kernels (the CPU default);
- ``compiled``: the same clipped cell through torch.compile (the compilation falls in the
  untimed warm-up steps; its seconds are printed apart);
- ``fused``: PyTorch's fused LSTM kernel, the model without clips (what ``lstm_path: auto``
  picks for a model without clips).

A path named ``NAME:python`` runs with elmolab's C++ kernels turned off (``elmolab.native``:
the char CNN's table kernel, the sampled softmax's and the dropout kernel as well as the native
LSTM loop) and with Adam's per-parameter loop instead of ``fused`` (which came with them), as
the code computed before: ``cell:python`` is the old default, the first row and baseline by
default. The ratio of each path to the first one is printed too: other jobs on the
machine move the absolute figures, much less their ratio.

The char CNN's FLOP are counted three ways: per position (every token of both streams, every
filter over every valid window, as a textbook count would) and the two ways the model computes
them, counted on real training batches: in Python, once per distinct token of a batch, in chunks
of 32 tokens sorted by length, each chunk's windows over its longest token plus the widest
filter, every filter zero-padded to the widest; with the C++ kernels, from lookup tables (one add
per filter and offset of a window, over each distinct token's windows up to its first
all-padding one, plus the tables' matmul per batch). Each row's rate and share of the matmul
rates use the count of the way it computes.

Run: .venv/bin/python bench/train.py [--model cpu_default] [--steps 20] [--threads 2]
[--paths cell:python cell native fused] [--batch-sizes 128 256] (needs artifacts/corpus: `dvc
repro prepare`). Precision: the stage's automatic choice unless --precisions names some. A GPU
run: --model elmo_small --accelerator gpu. As `make run` runs the stage: idle OpenMP threads spin
(OMP_WAIT_POLICY=ACTIVE) and glibc keeps large buffers mapped (the Makefile's MALLOC_*
settings), unless the environment sets them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
import yaml
from omegaconf import OmegaConf

from elmolab import native
from elmolab.core.config import section
from elmolab.core.hardware import choose_precision, cpu_model, native_bf16_flags
from elmolab.core.params import compose_params
from elmolab.core.schema import ModelConfig, PretrainConfig
from elmolab.models.char_cnn import length_chunks, token_lengths
from elmolab.text.vocab import Vocabulary
from elmolab.training.data import LMDataModule
from elmolab.training.pretrain import make_module

ROOT = Path(__file__).resolve().parents[1]
# What the pretrain stage runs with under make: spinning OpenMP threads (elmolab.core.openmp)
# and the Makefile's glibc settings, which keep large buffers mapped between steps.
MAKE_ENVIRONMENT = {
    "OMP_WAIT_POLICY": "ACTIVE",
    "MALLOC_MMAP_THRESHOLD_": "1073741824",
    "MALLOC_TRIM_THRESHOLD_": "4294967296",
    "MALLOC_TOP_PAD_": "268435456",
}


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


def computed_token_flop(
    model: ModelConfig, data: LMDataModule, tables: bool, batches: int = 20
) -> float:
    """Forward FLOP of the char CNN per training token as ``CharCNN.forward`` computes them, in
    chunked matmuls or (``tables``) by the C++ table kernel, counted on ``batches`` real
    training batches (see the module docstring)."""
    cnn, proj = model.char_cnn, model.lstm["projection_dim"]
    n_filters = sum(n for _, n in cnn["filters"])
    max_width = max(w for w, _ in cnn["filters"])
    min_width = min(w for w, _ in cnn["filters"])
    char_dim, n_chars = cnn["embedding"]["dim"], cnn["n_characters"]
    total, tokens = 0.0, 0
    for _, batch in zip(range(batches), iter(data.train_dataloader()), strict=False):
        both = torch.cat([batch["forward_char_ids"], batch["backward_char_ids"]])
        distinct = torch.unique(both.reshape(-1, both.shape[-1]), dim=0)  # (distinct, chars)
        if tables:
            last = distinct.shape[1] - min_width  # the last position a window fits
            windows = (token_lengths(distinct).clamp(max=last) + 1).sum().item()
            total += windows * (max_width - 1) * n_filters  # one add per offset and filter
            total += 2 * max_width * n_chars * char_dim * n_filters  # the tables, per batch
        else:
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
        self.warmup_seconds = 0.0

    def on_train_batch_start(self, *args: object) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, *args: object) -> None:
        self.steps += 1
        if self.steps > self.warmup:
            self.seconds += time.perf_counter() - self._t
        else:
            self.warmup_seconds += time.perf_counter() - self._t


def tokens_per_second(
    model: ModelConfig,
    settings: PretrainConfig,
    corpus: Path,
    vocab_size: int,
    precision: str,
    steps: int,
    accelerator: str,
) -> tuple[float, float]:
    """Training tokens/s after the warm-up steps, and the seconds of the warm-up steps."""
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
    tps = measured * settings.batch_size * settings.unroll_steps / timer.seconds
    return tps, timer.warmup_seconds


def path_config(
    model: ModelConfig, settings: PretrainConfig, path: str, clip: float, batch_size: int
) -> tuple[ModelConfig, PretrainConfig]:
    """The preset run on ``path`` (without ``:python``): with clips ``clip`` on the cell paths,
    without on fused."""
    value = None if path == "fused" else clip
    lstm = {**model.lstm, "cell_clip": value, "proj_clip": value}
    return (
        dataclasses.replace(model, lstm=lstm),
        dataclasses.replace(settings, lstm_path=path, batch_size=batch_size),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cpu_default", help="a conf/model preset")
    parser.add_argument("--steps", type=int, default=20, help="training steps per measurement")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--corpus", type=Path, default=ROOT / "artifacts" / "corpus")
    parser.add_argument(
        "--paths",
        nargs="+",
        default=["cell:python", "paired:python", "cell", "native", "fused"],
        choices=[
            f"{path}{suffix}"
            for path in ("cell", "paired", "native", "compiled", "fused")
            for suffix in ("", ":python")
            if (path, suffix) != ("native", ":python")
        ],
        help="LSTM paths to measure, ':python' without the C++ kernels (the first is the "
        "baseline of the ratios)",
    )
    parser.add_argument("--clip", type=float, default=3.0, help="cell and proj clip, cell paths")
    parser.add_argument(
        "--batch-sizes", nargs="+", type=int, default=None, help="default: the preset's"
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        default=None,
        help="Lightning precisions (default: the stage's automatic choice: bf16-mixed where the "
        "CPU runs bf16 natively or on a GPU, 32-true elsewhere)",
    )
    args = parser.parse_args()
    if any(name not in os.environ for name in MAKE_ENVIRONMENT):
        # As the pretrain stage runs under make (elmolab.core.openmp, the Makefile): OpenMP
        # and glibc read these when the process starts, so the script restarts itself with them.
        for name, value in MAKE_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    torch.set_num_threads(args.threads)
    choice = choose_precision("auto", args.accelerator)
    precisions = args.precisions or [choice.precision]
    print(
        f"CPU: {cpu_model()}; native bf16: {', '.join(native_bf16_flags()) or 'no'}; "
        + ", ".join(f"{name}={os.environ[name]}" for name in MAKE_ENVIRONMENT)
    )
    why = "--precisions" if args.precisions else choice.reason
    print(f"precision: {' '.join(precisions)} ({why})", flush=True)
    cfg = OmegaConf.create(yaml.safe_load(compose_params(ROOT / "conf", [f"model={args.model}"])))
    model = section(cfg, "model", ModelConfig)
    settings = section(cfg, "pretrain", PretrainConfig)
    batch_sizes = args.batch_sizes or [settings.batch_size]
    vocab_size = len(Vocabulary.from_file(args.corpus / "vocab.txt"))
    data = LMDataModule(args.corpus, settings.batch_size, settings.unroll_steps, seed=1)
    data.setup("fit")

    per_position = per_position_token_flop(model)
    kernels = native.native_kernels()
    computed = {tables: computed_token_flop(model, data, tables) for tables in (False, True)}
    flop = {
        tables: flop_per_token(model, settings, vocab_size, computed[tables])
        for tables in (False, True)
    }
    on_cpu = args.accelerator == "cpu"
    # Emulated bf16 matmuls take minutes and measure nothing a run does there (it trains in
    # float32): the bf16 rate is measured only where the CPU runs bf16 natively.
    bf16_native = on_cpu and bool(native_bf16_flags())
    rates = {
        "fp32": matmul_gflops() if on_cpu else math.nan,
        "bf16": matmul_gflops(dtype=torch.bfloat16) if bf16_native else math.nan,
    }
    shared = " shared by both directions" if settings.softmax.share_negatives else " per direction"
    print(
        f"model {args.model}: unroll {settings.unroll_steps}, softmax {settings.softmax.kind} "
        f"({settings.softmax.n_negative_samples} negatives{shared}), vocabulary {vocab_size:,}, "
        f"{args.threads} threads, {args.steps} steps per row ({max(3, args.steps // 5)} warm-up)"
    )
    bf16_rate = (
        f"{rates['bf16']:.1f} GFLOP/s"
        if bf16_native or not on_cpu
        else "not measured (this CPU would emulate it)"
    )
    print(f"matmul rate (2048^3, measured): fp32 {rates['fp32']:.1f} GFLOP/s, bf16 {bf16_rate}")
    print(f"C++ kernels: {'built for ' + kernels.detail if kernels.available else kernels.detail}")
    print(
        f"char CNN forward FLOP per token: {per_position / 1e6:8.2f} MFLOP counted per position, "
        f"{computed[False] / 1e6:8.2f} MFLOP as computed in Python (distinct tokens, chunked "
        f"frames), {computed[True] / 1e6:8.2f} MFLOP from the C++ kernel's tables"
    )
    print(
        f"training FLOP per token:          {flop[False] / 1e6:8.2f} MFLOP as computed in "
        f"Python, {flop[True] / 1e6:.2f} with the C++ kernels "
        f"({flop_per_token(model, settings, vocab_size, per_position) / 1e6:.2f} with the "
        "per-position char CNN count)"
    )
    print(
        f"{'path':>14} {'clips':>5} {'batch':>5} {'precision':>10} {'tokens/s':>9} "
        f"{'GFLOP/s':>8} {'of fp32':>7} {'of bf16':>7} {'x first':>7} {'warm-up s':>9}"
    )
    for precision in precisions:
        for batch_size in batch_sizes:
            baseline = None
            for spec in args.paths:
                path, _, python = spec.partition(":")
                run_model, run_settings = path_config(model, settings, path, args.clip, batch_size)
                if python:  # Adam as before the kernels: its per-parameter loop
                    optimizer = {**run_settings.optimizer, "fused": None}
                    run_settings = dataclasses.replace(run_settings, optimizer=optimizer)
                tables = kernels.available and not python and on_cpu
                with native.turned_off() if python else contextlib.nullcontext():
                    tps, warmup = tokens_per_second(
                        run_model,
                        run_settings,
                        args.corpus,
                        vocab_size,
                        precision,
                        args.steps,
                        args.accelerator,
                    )
                baseline = baseline or tps
                gflops = tps * flop[tables] / 1e9
                clips = "none" if path == "fused" else f"{args.clip:g}"
                print(
                    f"{spec:>14} {clips:>5} {batch_size:>5} {precision:>10} {tps:9.0f} "
                    f"{gflops:8.1f} {gflops / rates['fp32']:7.1%} {gflops / rates['bf16']:7.1%} "
                    f"{tps / baseline:7.2f} {warmup:9.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
