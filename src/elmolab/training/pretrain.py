"""The pretrain stage: train the biLM with Lightning, export it in bilm-tf's format, measure it.

Outputs (``out_dir``, replaced whole when complete)::

    model.pt              elmolab checkpoint of the biLM ({"options", "state_dict"}, weights only)
    options.json          bilm-tf options (readable by `elmolab embed` and bilm-tf itself)
    weights.hdf5          bilm-tf lm_weights.hdf5 layout
    softmax.hdf5          the word softmax (softmax/W (V, proj), softmax/b (V,)): not in bilm-tf's
                          weights file, so written beside it
    vocab.txt             the softmax vocabulary
    metrics.json          valid/test perplexities (full softmax; states carried along the
                          stream and stateless per sentence, each direction), unigram
                          baselines, tokens/s, the precision and the LSTM path chosen and
                          why, wall time, parameter counts
    curve.csv             the learning curve (step, tokens, train loss, validation perplexities)

Under ``dvc repro`` (stdout not a terminal) a plain progress line replaces the progress bar.

Resumable checkpoints live in ``ckpt_dir`` (kept across interrupted runs: DVC persists it). A
run resumes from ``ckpt_dir/last.ckpt`` when that checkpoint belongs to an unfinished run of the
same configuration; otherwise training starts from scratch.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, Timer, TQDMProgressBar
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from elmolab.core.errors import ElmolabError
from elmolab.core.failpoints import failpoint
from elmolab.core.fsutil import atomic_dir, atomic_hdf5, atomic_path, write_json
from elmolab.core.hardware import PrecisionChoice, choose_precision, peak_memory
from elmolab.core.schema import ModelConfig, PretrainConfig, TrainerConfig
from elmolab.io.results import CURVE_COLUMNS, CURVE_FILE, METRICS_FILE
from elmolab.models.bilm_tf import export_bilm, save_bilm_checkpoint
from elmolab.native import native_kernels
from elmolab.text.vocab import Vocabulary
from elmolab.training.data import LMDataModule
from elmolab.training.module import BiLMPretrainer, count_parameters
from elmolab.training.quiet import quiet_lightning

log = logging.getLogger(__name__)


# Lightning messages that do not apply to elmolab's trainers (pretraining, the task model). The
# data position and LSTM states are part of every pretraining checkpoint (the data module's
# state_dict), so a mid-epoch resume is exact, whatever the warning says; the data loader has no
# worker processes; the rest are advertisements and deprecations inside Lightning itself.
class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a temporary file and renamed: a kill never leaves half a file."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        with atomic_path(path) as tmp:
            super().save_checkpoint(checkpoint, tmp, storage_options)
            failpoint("checkpoint_written")  # the whole file is written but not yet renamed


class _Throughput(Callback):
    """Training tokens per second over the steps of this process (excluding validation)."""

    def __init__(self, tokens_per_row_step: int) -> None:
        self.tokens_per_row_step = tokens_per_row_step  # batch_size * unroll_steps
        self.tokens_per_step = tokens_per_row_step
        self.seconds = 0.0
        self.steps = 0
        self._start = 0.0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.tokens_per_step = self.tokens_per_row_step * trainer.world_size

    def on_train_batch_start(self, *args: Any) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, *args: Any) -> None:
        self.seconds += time.perf_counter() - self._start
        self.steps += 1

    @property
    def tokens_per_second(self) -> float:
        return self.steps * self.tokens_per_step / self.seconds if self.seconds else 0.0


class ProgressLine(Callback):
    """A plain line every ``every_seconds`` (and at the last step) for logs, where a progress bar
    would print control characters: step, training tokens/s, training loss, the last validation
    perplexities (carried and stateless) and the time left at the pace so far."""

    def __init__(self, throughput: _Throughput, every_seconds: float = 30.0) -> None:
        self.throughput = throughput
        self.every_seconds = every_seconds
        self._start = self._last = 0.0
        self._first_step = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = self._last = time.perf_counter()
        self._first_step = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        now, step, total = time.perf_counter(), trainer.global_step, trainer.max_steps
        last = total is not None and step >= total > 0
        if not trainer.is_global_zero or (now - self._last < self.every_seconds and not last):
            return
        self._last = now
        print(self.line(trainer, now), flush=True)

    def line(self, trainer: pl.Trainer, now: float) -> str:
        step, total = trainer.global_step, trainer.max_steps
        metrics = trainer.callback_metrics
        parts = [f"step {step:,}" + (f"/{total:,}" if total and total > 0 else "")]
        parts.append(f"{self.throughput.tokens_per_second:,.0f} tokens/s")
        if "train/loss" in metrics:
            parts.append(f"train loss {float(metrics['train/loss']):.3f}")
        if "val/ppl" in metrics:
            val = f"val ppl {float(metrics['val/ppl']):,.1f}"
            if "val/stateless_ppl" in metrics:
                val += f" (stateless {float(metrics['val/stateless_ppl']):,.1f})"
            parts.append(val)
        done, elapsed = step - self._first_step, now - self._start
        left = math.inf
        if total and total > 0 and done > 0:
            left = (total - step) * elapsed / done
        for timer in (c for c in trainer.callbacks if isinstance(c, Timer)):  # pretrain.max_time
            remaining = timer.time_remaining()
            if remaining is not None:
                left = min(left, max(0.0, remaining))
        if math.isfinite(left):
            parts.append(f"{int(left // 60)}:{int(left % 60):02d} left")
        return " | ".join(parts)


def fingerprint(*parts: Any) -> str:
    """A short hash of the settings a checkpoint is valid for."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _resume_path(ckpt_dir: Path, run_id: str) -> Path | None:
    """``last.ckpt`` if ``ckpt_dir`` holds an unfinished run with ``run_id``; else clear it.

    Only global rank 0 clears: DDP starts the other ranks while rank 0 waits for them in
    ``fit``, and they must find what rank 0 decided (a checkpoint to resume, or none yet).
    """
    marker = ckpt_dir / "run.json"
    last = ckpt_dir / "last.ckpt"
    if marker.is_file() and last.is_file():
        info = json.loads(marker.read_text())
        if info.get("run_id") == run_id and not info.get("complete"):
            return last
    if rank_zero_only.rank != 0:
        return None
    if ckpt_dir.exists():
        shutil.rmtree(ckpt_dir)
    ckpt_dir.mkdir(parents=True)
    write_json(marker, {"run_id": run_id, "complete": False})
    return None


# The keys of the ``trainer`` section that are not Lightning Trainer arguments of the same name.
NOT_TRAINER_ARGS = ("num_threads",)  # torch's intra-op threads, set by the stage


def lightning_args(trainer_cfg: TrainerConfig, precision: PrecisionChoice) -> dict[str, Any]:
    """The ``trainer`` section as Lightning Trainer arguments, each under its own name, with
    ``precision`` as resolved for this machine; ``enable_progress_bar`` is the caller's."""
    args = {
        f.name: getattr(trainer_cfg, f.name)
        for f in fields(trainer_cfg)
        if f.name not in (*NOT_TRAINER_ARGS, "enable_progress_bar")
    }
    return {**args, "precision": precision.precision}


def pretrain(
    model_cfg: ModelConfig,
    cfg: PretrainConfig,
    trainer_cfg: TrainerConfig,
    corpus_dir: Path,
    out_dir: Path,
    ckpt_dir: Path,
    seed: int,
    loggers: list[Any] | None = None,
) -> dict[str, Any]:
    """Train (or resume), evaluate on valid and test with the full softmax, export; return
    the metrics also written to ``out_dir/metrics.json``."""
    started = time.perf_counter()
    if trainer_cfg.num_threads:
        torch.set_num_threads(trainer_cfg.num_threads)
    vocab = Vocabulary.from_file(corpus_dir / "vocab.txt")
    stats = _corpus_stats(corpus_dir)
    train = stats["splits"]["train"]
    n_train_pairs = train["tokens"] + train["sentences"]  # every word and </S> is a target
    datamodule = LMDataModule(
        corpus_dir, cfg.batch_size, cfg.unroll_steps, seed=seed, n_train_tokens=n_train_pairs
    )
    # Index every split now (which checks each shard line): a bad line, even in a test shard,
    # fails the stage before anything is written, not after training.
    for stage in ("fit", "test"):
        datamodule.setup(stage)
    run_id = fingerprint(
        asdict(model_cfg), asdict(cfg), asdict(trainer_cfg), seed, stats["splits"], len(vocab)
    )
    resume = _resume_path(ckpt_dir, run_id)
    if resume:
        log.info("resuming from %s", resume)
    precision = choose_precision(trainer_cfg.precision, trainer_cfg.accelerator)
    log.info("precision %s: %s", precision.precision, precision.reason)
    log.info("OpenMP idle threads: OMP_WAIT_POLICY=%s", os.environ.get("OMP_WAIT_POLICY", "unset"))

    pl.seed_everything(seed, workers=True, verbose=False)
    module = make_module(model_cfg, cfg, len(vocab))
    log.info("LSTM path %s: %s", module.bilm.lstm_path.path, module.bilm.lstm_path.reason)
    eval_logits = use_eval_logits(module, cfg.eval_logits, precision)
    throughput = _Throughput(cfg.batch_size * cfg.unroll_steps)
    # A bar in a terminal; plain progress lines in logs (dvc repro, CI, a batch job).
    terminal = sys.stdout.isatty()
    bar = trainer_cfg.enable_progress_bar and terminal
    progress: list[Callback] = [TQDMProgressBar()] if bar else []
    if not terminal:
        progress.append(ProgressLine(throughput))
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir,
        every_n_train_steps=cfg.checkpoint_every_n_steps,
        save_top_k=0,
        save_last=True,
    )
    # One log folder per attempt: a resumed run's log continues where its checkpoint was.
    attempt = len(list((ckpt_dir / "logs").glob("attempt-*")))
    quiet_lightning()
    csv_logger = CSVLogger(save_dir=ckpt_dir, name="logs", version=f"attempt-{attempt}")
    trainer = pl.Trainer(
        **lightning_args(trainer_cfg, precision),
        enable_progress_bar=bar,
        max_steps=cfg.max_steps if cfg.max_steps is not None else -1,
        max_epochs=cfg.max_epochs,
        max_time=cfg.max_time,
        val_check_interval=cfg.val_every_n_steps,
        check_val_every_n_epoch=None,
        limit_val_batches=cfg.limit_val_batches,
        num_sanity_val_steps=0,
        gradient_clip_val=cfg.gradient_clip_val,
        gradient_clip_algorithm="norm",
        callbacks=[checkpoint, throughput, *progress],
        logger=[csv_logger, *(loggers or [])],
        plugins=[AtomicCheckpointIO()],
        default_root_dir=ckpt_dir,
        enable_model_summary=False,
    )
    # weights_only: a checkpoint is tensors and plain values; nothing in it is unpickled as code.
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume, weights_only=True)
    if trainer.is_global_zero:
        write_json(ckpt_dir / "run.json", {"run_id": run_id, "complete": True})
    trainer.limit_val_batches = 1.0  # the reported perplexities: always the whole splits
    val = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
    test = trainer.test(module, datamodule=datamodule, verbose=False)[0]
    if trainer.global_rank != 0:
        return {}

    metrics = {
        **_evaluation(val, test, stats),
        "precision": precision.as_dict(),
        "lstm_path": module.bilm.lstm_path.as_dict(),
        "native_kernels": native_kernels().as_dict(),
        "eval_logits": eval_logits,
        "tokens_per_second": round(throughput.tokens_per_second, 1),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "steps": trainer.global_step,
        "tokens": trainer.global_step * throughput.tokens_per_step,
        "resumed": resume is not None,
        **peak_memory(),
        "parameters": count_parameters(module),
        "model": model_cfg.options(),
        "model_name": model_cfg.name,
    }
    logs = sorted((ckpt_dir / "logs").glob("attempt-*/metrics.csv"), key=_attempt_number)
    metrics["state_check"] = state_check(metrics["val"])
    if not metrics["state_check"]["ok"]:
        log.warning("%s", metrics["state_check"]["message"])
    export_model(module, vocab, out_dir, metrics, curve_from=logs)
    return metrics


# Stateless perplexity over carried perplexity, per direction, above which a model is flagged:
# its probe features (computed stateless) come from a regime it does not model well.
STATELESS_GAP_LIMIT = 1.25


def state_check(val: dict[str, float]) -> dict[str, Any]:
    """How far the stateless perplexities are from the carried ones (ratios per direction)."""
    ratios = {d: round(val[f"stateless_ppl_{d}"] / val[f"ppl_{d}"], 3) for d in ("fwd", "bwd")}
    ok = max(ratios.values()) <= STATELESS_GAP_LIMIT
    message = (
        f"stateless / carried validation perplexity: forward x{ratios['fwd']}, backward "
        f"x{ratios['bwd']}"
        + ("" if ok else f" (above x{STATELESS_GAP_LIMIT}: train with pretrain.zero_state_share)")
    )
    return {
        "stateless_over_carried": ratios,
        "limit": STATELESS_GAP_LIMIT,
        "ok": ok,
        "message": message,
    }


EVAL_LOGITS = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def eval_logits_choice(requested: str, precision: PrecisionChoice) -> dict[str, str]:
    """The dtype of the evaluation's full-softmax logits product (``pretrain.eval_logits``) and
    why: ``auto`` takes bfloat16 where training runs bf16-mixed (within 0.02% of the float32
    perplexity, docs/pretraining.md), float32 otherwise. Recorded in metrics.json."""
    if requested not in (*EVAL_LOGITS, "auto"):
        raise ElmolabError(
            f"pretrain.eval_logits must be auto, float32 or bfloat16, got {requested!r}"
        )
    if requested != "auto":
        return {"chosen": requested, "requested": requested, "reason": "set in the config"}
    if precision.precision == "bf16-mixed":
        reason = "training runs bf16-mixed: the logits product in bf16, the rest in float32"
        return {"chosen": "bfloat16", "requested": requested, "reason": reason}
    reason = f"training runs {precision.precision}: every product in float32"
    return {"chosen": "float32", "requested": requested, "reason": reason}


def use_eval_logits(
    module: BiLMPretrainer, requested: str, precision: PrecisionChoice
) -> dict[str, str]:
    """Set ``module``'s evaluation logits dtype as :func:`eval_logits_choice` decides, log it
    and return the choice (for metrics.json)."""
    choice = eval_logits_choice(requested, precision)
    module.eval_logits_dtype = EVAL_LOGITS[choice["chosen"]]
    log.info("evaluation logits %s: %s", choice["chosen"], choice["reason"])
    return choice


def make_module(model_cfg: ModelConfig, cfg: PretrainConfig, vocab_size: int) -> BiLMPretrainer:
    """The LightningModule of a pretraining config."""
    return BiLMPretrainer(
        model_cfg.options(),
        vocab_size,
        asdict(cfg.softmax),
        dict(cfg.optimizer),
        loss_scale=cfg.unroll_steps if cfg.scale_loss_by_unroll_steps else 1.0,
        zero_state_share=cfg.zero_state_share,
        lr_schedule=asdict(cfg.lr_schedule),
        lstm_path=cfg.lstm_path,
    )


def random_control(
    model_cfg: ModelConfig,
    cfg: PretrainConfig,
    trainer_cfg: TrainerConfig,
    corpus_dir: Path,
    out_dir: Path,
    seed: int,
    evaluate: bool = True,
) -> dict[str, Any]:
    """The random-initialisation control: the same shape, no training, its weights drawn by
    ``seed`` alone; with ``evaluate``, the same measurements as the trained biLM's (the full
    softmax over the validation and test splits: minutes), else none (seconds)."""
    started = time.perf_counter()
    vocab = Vocabulary.from_file(corpus_dir / "vocab.txt")
    pl.seed_everything(seed, workers=True, verbose=False)
    module = make_module(model_cfg, cfg, len(vocab))
    measured: dict[str, Any] = {}
    if evaluate:
        stats = _corpus_stats(corpus_dir)
        datamodule = LMDataModule(corpus_dir, cfg.batch_size, cfg.unroll_steps, seed=seed)
        precision = choose_precision(trainer_cfg.precision, trainer_cfg.accelerator)
        eval_logits = use_eval_logits(module, cfg.eval_logits, precision)
        quiet_lightning()
        trainer = pl.Trainer(
            accelerator="cpu" if trainer_cfg.accelerator == "cpu" else "auto",
            devices=1,
            precision=precision.precision,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=trainer_cfg.enable_progress_bar,
            enable_model_summary=False,
        )
        val = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
        test = trainer.test(module, datamodule=datamodule, verbose=False)[0]
        measured = {
            **_evaluation(val, test, stats),
            "precision": precision.as_dict(),
            "lstm_path": module.bilm.lstm_path.as_dict(),
            "native_kernels": native_kernels().as_dict(),
            "eval_logits": eval_logits,
        }
    metrics = {
        **measured,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "steps": 0,
        "tokens": 0,
        **peak_memory(),
        "parameters": count_parameters(module),
        "model": model_cfg.options(),
        "model_name": model_cfg.name,
        "random_control": True,
        "seed": seed,
        "evaluated": evaluate,
    }
    export_model(module, vocab, out_dir, metrics, curve_from=[])
    return metrics


def _evaluation(val: dict[str, float], test: dict[str, float], stats: dict[str, Any]) -> dict:
    """The perplexities of the valid and test splits, beside the unigram model's."""
    return {
        "val": _perplexities(val, "val"),
        "test": _perplexities(test, "test"),
        "unigram_ppl": {
            split: stats["splits"][split].get("unigram_perplexity") for split in ("valid", "test")
        },
    }


def export_model(
    module: BiLMPretrainer,
    vocab: Vocabulary,
    out_dir: Path,
    metrics: dict[str, Any],
    curve_from: list[Path],
) -> None:
    """Write every file of the stage's output folder, atomically (see the module docstring)."""
    module = module.cpu().float().eval()
    with atomic_dir(out_dir) as tmp:
        save_bilm_checkpoint(module.bilm, tmp / "model.pt")
        export_bilm(module.bilm, tmp / "options.json", tmp / "weights.hdf5")
        if module.softmax.weight is not None:
            with atomic_hdf5(tmp / "softmax.hdf5") as f:
                f["softmax/W"] = module.softmax.weight.detach().numpy()
                f["softmax/b"] = module.softmax.bias.detach().numpy()
        vocab.save(tmp / "vocab.txt")
        write_json(tmp / METRICS_FILE, metrics)
        if curve_from:
            write_curve(curve_from, tmp / CURVE_FILE, metrics["tokens"] / max(metrics["steps"], 1))


def write_curve(metrics_csvs: list[Path], out: Path, tokens_per_step: float) -> None:
    """The learning curve from Lightning's CSV logs (one per attempt, oldest first): one row per
    logged step, the latest value of each metric winning (a resumed run logs again the steps
    after its checkpoint)."""
    rows: dict[int, dict[str, str]] = {}
    for metrics_csv in metrics_csvs:
        with metrics_csv.open(newline="") as fh:
            for record in csv.DictReader(fh):
                row = rows.setdefault(int(record["step"]), {})
                row.update({k: v for k, v in record.items() if v not in ("", None)})
    with atomic_path(out) as tmp, tmp.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CURVE_COLUMNS)
        for step in sorted(rows):
            row = rows[step]
            writer.writerow(
                [
                    step,
                    int(step * tokens_per_step),
                    *(row.get(column.replace("_", "/", 1), "") for column in CURVE_COLUMNS[2:]),
                ]
            )


def _attempt_number(path: Path) -> int:
    return int(path.parent.name.removeprefix("attempt-"))


def _perplexities(results: dict[str, float], split: str) -> dict[str, float]:
    keys = [f"{regime}ppl{d}" for regime in ("", "stateless_") for d in ("", "_fwd", "_bwd")]
    return {key: round(float(results[f"{split}/{key}"]), 3) for key in keys}


def _corpus_stats(corpus_dir: Path) -> dict[str, Any]:
    path = corpus_dir / "stats.json"
    if not path.is_file():
        raise ElmolabError("no corpus statistics: run the prepare stage first", path)
    return json.loads(path.read_text())
