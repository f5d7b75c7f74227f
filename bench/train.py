"""Pretraining throughput: tokens/s of a preset in fp32 and bf16-mixed, against the machine.

Prints, measured in this one run on this machine: the fp32 matmul rate (GFLOP/s), the model's
FLOP per training token (analytic: forward + backward = 3x the forward matmuls), the training
tokens/s of the real Lightning training loop (Trainer, data module, sampled softmax) in fp32 and
bf16-mixed, and the fp32 model FLOP rate as a fraction of the matmul rate (target: >= 40%).

Run: .venv/bin/python bench/train.py [--model cpu_default] [--steps 40] [--threads 2]
(needs artifacts/corpus: `dvc repro prepare`). A GPU run: --model elmo_small --accelerator gpu.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
import yaml
from omegaconf import OmegaConf

from elmolab.config import section
from elmolab.params import compose_params
from elmolab.text.vocab import Vocabulary
from elmolab.training.data import LMDataModule
from elmolab.training.module import BiLMPretrainer
from elmolab.training.pretrain import ModelConfig, PretrainConfig

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


def flop_per_token(model: ModelConfig, settings: PretrainConfig, vocab_size: int) -> float:
    """Training FLOP per token (both directions): 3x the forward multiply-adds x 2."""
    cnn, lstm = model.char_cnn, model.lstm
    n_filters = sum(n for _, n in cnn["filters"])
    chars = cnn["max_characters_per_token"]
    char_dim = cnn["embedding"]["dim"]
    proj, cell = lstm["projection_dim"], lstm["dim"]
    # Token encoder, once per token (the network computes it for both directions' inputs).
    conv = sum(2 * (chars - w + 1) * w * char_dim * n for w, n in cnn["filters"])
    highway = cnn["n_highway"] * 2 * (2 * n_filters * n_filters)
    projection = 2 * n_filters * proj
    token = 2 * (conv + highway + projection)  # forward and backward inputs
    # LSTMs: per layer and direction, [x; h] @ W_0 and the projection.
    lstm_flop = 2 * lstm["n_layers"] * (2 * (proj + proj) * 4 * cell + 2 * cell * proj)
    if settings.softmax.kind == "sampled":
        classes = min(settings.softmax.n_negative_samples + 1, vocab_size)
    else:
        classes = vocab_size
    softmax = 2 * (2 * proj * classes)
    return 3.0 * (token + lstm_flop + softmax)


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
    module = BiLMPretrainer(
        model.options(), vocab_size, vars(settings.softmax), dict(settings.optimizer)
    )
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
        "--precisions", nargs="+", default=["32-true", "bf16-mixed"], help="Lightning precisions"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = OmegaConf.create(yaml.safe_load(compose_params(ROOT / "conf", [f"model={args.model}"])))
    model = section(cfg, "model", ModelConfig)
    settings = section(cfg, "pretrain", PretrainConfig)
    vocab_size = len(Vocabulary.from_file(args.corpus / "vocab.txt"))

    flop = flop_per_token(model, settings, vocab_size)
    rate = matmul_gflops() if args.accelerator == "cpu" else float("nan")
    print(
        f"model {args.model}: batch {settings.batch_size} x unroll {settings.unroll_steps}, "
        f"softmax {settings.softmax.kind} ({settings.softmax.n_negative_samples} negatives), "
        f"vocabulary {vocab_size:,}, {args.threads} threads"
    )
    print(f"fp32 matmul rate (2048^3, measured): {rate:8.1f} GFLOP/s")
    print(f"training FLOP per token (analytic):   {flop / 1e6:8.1f} MFLOP")
    results = {}
    for precision in args.precisions:
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
