"""The full-softmax evaluation in float32 and with a bf16 logits product, side by side.

For each biLM of a finished workspace (the trained one, ``artifacts/bilm``, and the random-init
control, ``artifacts/bilm_random``), runs the pretrain stage's evaluation of the whole validation
split (the full softmax, both directions, states carried and stateless) twice in one process,
alternating the order: with every product in float32 (what the stages run), and with the
logits' product in bf16 and the bias, log-sum-exp and loss in float32
(``LMSoftmax.full_nll(..., logits_dtype=torch.bfloat16)``). Prints the CPU model, each
perplexity, their relative difference and the seconds of each pass. On a CPU without native bf16
it stops at once: the stages evaluate in float32 there (``pretrain.eval_logits: auto``).

    .venv/bin/python bench/eval_precision.py WORKSPACE [--repeats 1] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import h5py
import lightning.pytorch as pl
import torch
from omegaconf import OmegaConf

from elmolab.core.config import section
from elmolab.core.hardware import choose_precision, cpu_model, native_bf16_flags
from elmolab.core.schema import ModelConfig, PretrainConfig
from elmolab.models.bilm_tf import load_bilm_from_checkpoint
from elmolab.text.vocab import Vocabulary
from elmolab.training.data import LMDataModule
from elmolab.training.pretrain import make_module

DTYPES = {"float32": torch.float32, "bf16 logits": torch.bfloat16}
KEYS = ("val/ppl", "val/stateless_ppl")


def load_module(workspace: Path, folder: str, cfg) -> pl.LightningModule:
    model_cfg = section(cfg, "model", ModelConfig)
    pretrain_cfg = section(cfg, "pretrain", PretrainConfig)
    bilm_dir = workspace / "artifacts" / folder
    vocab = Vocabulary.from_file(bilm_dir / "vocab.txt")
    module = make_module(model_cfg, pretrain_cfg, len(vocab))
    module.bilm.load_state_dict(load_bilm_from_checkpoint(bilm_dir / "model.pt").state_dict())
    with h5py.File(bilm_dir / "softmax.hdf5", "r") as f, torch.no_grad():
        module.softmax.weight.copy_(torch.from_numpy(f["softmax/W"][...]))
        module.softmax.bias.copy_(torch.from_numpy(f["softmax/b"][...]))
    return module.eval()


def evaluate(module, datamodule, dtype: torch.dtype) -> tuple[dict[str, float], float]:
    module.eval_logits_dtype = dtype
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    started = time.perf_counter()
    results = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    return {key: float(results[key]) for key in KEYS}, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--repeats", type=int, default=1, help="passes of each, alternating")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if "OMP_WAIT_POLICY" not in os.environ:
        # As the stages run (elmolab.core.openmp): idle OpenMP threads spin. OpenMP reads the
        # variable when torch loads, so the script restarts itself with it.
        os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    choice = choose_precision("auto", "cpu")
    if choice.precision != "bf16-mixed":  # the bf16 passes would take minutes, emulated
        raise SystemExit(
            f"{choice.reason}: the stages evaluate in float32 here, nothing to compare"
        )
    torch.set_num_threads(args.threads)
    cfg = OmegaConf.load(args.workspace / "params.yaml")
    print(f"CPU: {cpu_model()} (native bf16: {', '.join(native_bf16_flags()) or 'none'}),")
    print(f"{args.threads} threads; the whole validation split, full softmax")
    corpus = args.workspace / "artifacts" / "corpus"
    pretrain_cfg = section(cfg, "pretrain", PretrainConfig)
    for folder in ("bilm", "bilm_random"):
        module = load_module(args.workspace, folder, cfg)
        datamodule = LMDataModule(corpus, pretrain_cfg.batch_size, pretrain_cfg.unroll_steps, 1)
        seconds: dict[str, list[float]] = {name: [] for name in DTYPES}
        ppl: dict[str, dict[str, float]] = {}
        for repeat in range(args.repeats):
            order = list(DTYPES) if repeat % 2 == 0 else list(reversed(DTYPES))
            for name in order:
                ppl[name], wall = evaluate(module, datamodule, DTYPES[name])
                seconds[name].append(wall)
        print(f"\n{folder}:")
        for name in DTYPES:
            values = ", ".join(f"{key} {ppl[name][key]:.3f}" for key in KEYS)
            walls = ", ".join(f"{s:.1f}" for s in seconds[name])
            print(f"  {name:12s} {values}; seconds {walls}")
        for key in KEYS:
            change = ppl["bf16 logits"][key] / ppl["float32"][key] - 1
            print(f"  {key}: bf16 logits / float32 - 1 = {change:+.4%}")
        ratio = min(seconds["float32"]) / min(seconds["bf16 logits"])
        print(f"  float32 seconds / bf16 logits seconds = {ratio:.2f}x")


if __name__ == "__main__":
    main()
