"""Pretraining recipes side by side: the same wall time each, learning curves, final perplexities.

Each candidate is a set of Hydra overrides of the default config, trained by the real pretrain
stage (``pipelines/pretrain.py``) for ``--minutes`` of wall time, ``--parallel`` runs at a time
with one thread each (two on a 2-core machine: every run gets one core, so the runs of one call
are measured under the same conditions). Every ``--val-every`` steps the stage validates on the
first 20,480 tokens of the valid streams (the same text whatever the batch size), with the
states carried and stateless (every sentence from zero). A run is stopped when its time is up,
before the stage's whole-split evaluation (minutes on a slow CPU; the pretrain stage itself does
that). Prints, for each candidate: steps, tokens, the last validation of each direction in both
regimes against the unigram perplexity of the split, and the curve.

Run: .venv/bin/python bench/pretrain_recipes.py [--minutes 10] [--only NAME ...]
(needs artifacts/corpus: `dvc repro prepare`). Runs go to outputs/recipes/<name>/.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from elmolab.core.hardware import cpu_model  # noqa: E402

ADAM = [
    "pretrain.optimizer._target_=torch.optim.Adam",
    "pretrain.optimizer.lr=0.001",
    "~pretrain.optimizer.initial_accumulator_value",
]
NO_CLIPS = ["model.lstm.cell_clip=null", "model.lstm.proj_clip=null"]
SHARED_2048 = ["pretrain.softmax.n_negative_samples=2048", "pretrain.softmax.share_negatives=true"]
ZERO_HALF = ["pretrain.zero_state_share=0.5"]

# name: (what it is, overrides of the default config)
CANDIDATES: dict[str, tuple[str, list[str]]] = {
    "old_default": (
        "the previous CPU default: Adagrad lr 1.0 on the unscaled loss, batch 64, "
        "8192 negatives per direction, states always carried",
        [
            "pretrain.scale_loss_by_unroll_steps=false",
            "pretrain.optimizer.lr=1.0",
            "pretrain.zero_state_share=0.0",
            "pretrain.batch_size=64",
            "pretrain.softmax.n_negative_samples=8192",
            "pretrain.softmax.share_negatives=false",
            "model.lstm.cell_clip=3",
            "model.lstm.proj_clip=3",
        ],
    ),
    "adagrad_bilm_tf": (
        "bilm-tf's optimizer exactly (loss x 20, clip 10, Adagrad lr 0.2), batch 64, "
        "8192 per direction, half the sentences from zero",
        ["pretrain.optimizer.lr=0.2", "pretrain.batch_size=64", *ZERO_HALF],
    ),
    "adam_b64_8192": (
        "Adam 1e-3, no cell/projection clip, batch 64, 8192 per direction, half from zero",
        [*ADAM, *NO_CLIPS, "pretrain.batch_size=64", *ZERO_HALF],
    ),
    "adam_b128_shared2048": (
        "Adam 1e-3, no cell/projection clip, batch 128, 2048 shared, half from zero",
        [*ADAM, *NO_CLIPS, "pretrain.batch_size=128", *SHARED_2048, *ZERO_HALF],
    ),
    "adam_b64_shared2048": (
        "Adam 1e-3, no cell/projection clip, batch 64, 2048 shared, half from zero",
        [*ADAM, *NO_CLIPS, "pretrain.batch_size=64", *SHARED_2048, *ZERO_HALF],
    ),
    "adam_b128_shared2048_carried": (
        "adam_b128_shared2048 with states always carried (zero_state_share 0)",
        [*ADAM, *NO_CLIPS, "pretrain.batch_size=128", *SHARED_2048, "pretrain.zero_state_share=0"],
    ),
    "adam_b128_shared2048_lr2e-3": (
        "adam_b128_shared2048 at learning rate 2e-3",
        [
            *ADAM,
            *NO_CLIPS,
            "pretrain.batch_size=128",
            *SHARED_2048,
            *ZERO_HALF,
            "pretrain.optimizer.lr=0.002",
        ],
    ),
    "adam_b128_shared2048_nodropout": (
        "adam_b128_shared2048 without dropout (less than one epoch: nothing to regularise)",
        [
            *ADAM,
            *NO_CLIPS,
            "pretrain.batch_size=128",
            *SHARED_2048,
            *ZERO_HALF,
            "model.dropout=0.0",
        ],
    ),
    "adam_b64_shared2048_clips": (
        "adam_b64_shared2048 with bilm-tf's cell and projection clips (3)",
        [*ADAM, "pretrain.batch_size=64", *SHARED_2048, *ZERO_HALF],
    ),
    "adam_b64_shared2048_linear": (
        "adam_b64_shared2048 with a linear decay to 0 over --decay-steps steps",
        [
            *ADAM,
            *NO_CLIPS,
            "pretrain.batch_size=64",
            *SHARED_2048,
            *ZERO_HALF,
            "pretrain.lr_schedule.kind=linear",
        ],
    ),
}


VAL_TOKENS = 20480


def batch_size(overrides: list[str]) -> int:
    for override in overrides:
        if override.startswith("pretrain.batch_size="):
            return int(override.split("=")[1])
    return 64


def launch(
    overrides: list[str], minutes: float, out: Path, steps: int, val_every: int
) -> subprocess.Popen:
    seconds = int(minutes * 60)
    args = [
        sys.executable,
        str(ROOT / "pipelines" / "pretrain.py"),
        *overrides,
        f"pretrain.max_steps={steps}",
        f"pretrain.max_time=00:00:{seconds // 60:02d}:{seconds % 60:02d}",
        f"pretrain.val_every_n_steps={val_every}",
        f"pretrain.limit_val_batches={VAL_TOKENS // (batch_size(overrides) * 20)}",
        "pretrain.checkpoint_every_n_steps=100000",
        "trainer.num_threads=1",
        f"hydra.run.dir={out}",
    ]
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "run.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    return subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)


def summary(name: str, out: Path, unigram: float) -> str:
    logs = out / "bilm_checkpoints" / "logs" / "attempt-0" / "metrics.csv"
    if not logs.is_file():
        return f"{name}: no log (see {out / 'run.log'})"
    with logs.open() as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("val/ppl")]
    if not rows:
        return f"{name}: no validation yet (see {out / 'run.log'})"
    tokens = 20 * batch_size(CANDIDATES[name][1])
    last = {k: float(v) for k, v in rows[-1].items() if v}
    curve = " ".join(
        f"{(int(r['step']) + 1) * tokens / 1e6:.2f}M:{float(r['val/ppl']):.0f}"
        f"/{float(r['val/stateless_ppl']):.0f}"
        for r in rows
    )
    return (
        f"{name}: {int(last['step']) + 1} steps, {(last['step'] + 1) * tokens / 1e6:.2f}M "
        f"tokens; last validation carried fwd {last['val/ppl_fwd']:.0f} bwd "
        f"{last['val/ppl_bwd']:.0f} mean {last['val/ppl']:.0f} = "
        f"{last['val/ppl'] / unigram:.3f}x unigram ({unigram}); stateless fwd "
        f"{last['val/stateless_ppl_fwd']:.0f} bwd {last['val/stateless_ppl_bwd']:.0f} = "
        f"{last['val/stateless_ppl'] / unigram:.3f}x\n"
        f"  curve (tokens: val ppl carried/stateless): {curve}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="wall time per candidate")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (1 thread each)")
    parser.add_argument("--only", nargs="+", choices=sorted(CANDIDATES), help="these candidates")
    parser.add_argument("--steps", type=int, default=100000, help="step limit (time decides)")
    parser.add_argument("--val-every", type=int, default=50, help="validate every n steps")
    parser.add_argument(
        "--decay-steps", type=int, default=None, help="max_steps of the linear-decay candidate"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "recipes")
    parser.add_argument("--report", action="store_true", help="only print the finished runs")
    args = parser.parse_args()
    names = args.only or list(CANDIDATES)
    print(f"CPU: {cpu_model()}; {args.minutes} min per candidate, {args.parallel} at a time")
    if not args.report:
        pending = list(names)
        running: list[tuple[str, subprocess.Popen]] = []
        while pending or running:
            while pending and len(running) < args.parallel:
                name = pending.pop(0)
                steps = args.steps
                if name.endswith("_linear") and args.decay_steps:
                    steps = args.decay_steps
                process = launch(
                    CANDIDATES[name][1], args.minutes, args.out / name, steps, args.val_every
                )
                running.append((name, process))
            time.sleep(5)
            for name, process in running:
                log = (args.out / name / "run.log").read_text(errors="replace")
                if "Time limit reached" in log or "`Trainer.fit` stopped" in log:
                    process.terminate()  # the whole-split evaluation is not needed here
                    process.wait()
            running = [(n, p) for n, p in running if p.poll() is None]
    stats = json.loads((ROOT / "artifacts" / "corpus" / "stats.json").read_text())
    unigram = stats["splits"]["valid"]["unigram_perplexity"]
    for name in names:
        print(f"[{CANDIDATES[name][0]}]")
        print(summary(name, args.out / name, unigram))


if __name__ == "__main__":
    main()
