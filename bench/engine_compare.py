"""The old and the new probe engine on the same cached features: do they agree within seed spread?

The probe engine (``elmolab.probing.engine``: every mode and seed of a task as heads of one model)
replaced one training loop per probe run (``probing/train.py`` of commit ``4bd36d3``). This runs
both on the same splits, loaded once by the current code (features, labels and the label
vocabulary handed to each side as tensors), every feature mode, encoder and seed, full training
sets, float32, each side in a process of its own with one thread, the two side by side:

- **old engine**: the old commit's ``train_probe`` with its ``conf/probe/default.yaml`` (its
  learning rate, epoch cap and patience; a constant learning rate; the scalar mix at the probe's
  learning rate); its source comes from ``git archive`` of ``--old-commit`` into ``--out``;
- **probe engine, old schedule**: ``train_heads`` with the old learning rate (token and pair
  probes alike), epoch cap and patience, ``lr_decay`` 1, ``min_delta`` 0, ``mix_lr`` = the old
  learning rate, ``32-true``: the engine alone changes.

Prints, per task, both wall times and a table (mean +- standard deviation over seeds of the test
score, points; "within spread": the means differ by at most the larger of the two standard
deviations; with ``--probes``, the default run's scores beside them), then how many cells agree.
The tables also go to ``--out``/engine-comparison.md. The default grid (upos, chunk, deplabel x 6
modes x 3 encoders x 3 seeds) takes about 20 minutes on 2 cores.

Run: .venv/bin/python bench/engine_compare.py [--features artifacts/features] [--tasks ...]
     [--max-sentences N  (a quick check on each split's first N sentences)]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OLD_COMMIT = "4bd36d3"
SPLIT_FIELDS = ("features", "labels", "sentence_lengths", "heads")


# --- the two sides (each in its own process; only torch and the elmolab on its path) -----------


def _load_payload(path: Path) -> dict:
    return torch.load(path, weights_only=False)


def _old_side(payload: dict, old_root: Path) -> dict:
    """Every run with the old engine: ``train_probe`` per mode, encoder and seed."""
    from omegaconf import OmegaConf

    from elmolab.probing import FeatureDataset, LabelVocabulary, ProbeConfig, train_probe

    conf = OmegaConf.load(old_root / "conf" / "probe" / "default.yaml")
    # the fields its runner passed on from conf (its ``kind`` is the config's ``probe``)
    same = ("hidden_dim", "dropout", "root", "lr", "weight_decay", "batch_size", "max_epochs")
    same += ("patience", "layer_norm", "l2_lambda", "min_epoch_tokens")
    config = ProbeConfig(probe=conf.kind, **{name: conf[name] for name in same})
    vocabulary = _vocabulary(LabelVocabulary, payload["vocabulary"])
    runs, started = [], time.perf_counter()
    for encoder, splits in payload["encoders"].items():
        data = {role: FeatureDataset(**split) for role, split in splits.items()}
        for mode in payload["modes"]:
            for seed in payload["seeds"]:
                result = train_probe(
                    data["train"],
                    data["dev"],
                    data["test"],
                    vocabulary,
                    mode=mode,
                    metric=payload["metric"],
                    seed=seed,
                    config=config,
                )
                runs.append(_run(encoder, result))
    return {"wall_seconds": time.perf_counter() - started, "runs": runs}


def _new_side(payload: dict, schedule: dict) -> dict:
    """Every run with the probe engine and the old schedule: one fit per encoder."""
    import dataclasses

    from omegaconf import OmegaConf

    from elmolab.core.config import section
    from elmolab.core.params import compose_params
    from elmolab.core.schema import ProbeSettings
    from elmolab.data.labels import LabelVocabulary
    from elmolab.io.results import FeatureMode
    from elmolab.probing.datasets import FeatureDataset
    from elmolab.probing.engine import train_heads
    from elmolab.probing.probes import Head

    settings = section(OmegaConf.create(compose_params(ROOT / "conf")), "probe", ProbeSettings)
    settings = dataclasses.replace(
        settings,
        lr=schedule["lr"],
        pair_lr=schedule["lr"],  # the old loop had one rate for token and pair probes
        mix_lr=schedule["lr"],
        max_epochs=schedule["max_epochs"],
        patience=schedule["patience"],
        max_stalls=schedule["max_epochs"],  # the old loop stopped on patience alone
        lr_decay=1.0,
        min_delta=0.0,
        precision="32-true",
    )
    vocabulary = _vocabulary(LabelVocabulary, payload["vocabulary"])
    heads = [Head(FeatureMode(m), seed) for m in payload["modes"] for seed in payload["seeds"]]
    runs, started = [], time.perf_counter()
    for encoder, splits in payload["encoders"].items():
        data = {role: FeatureDataset(**split) for role, split in splits.items()}
        kind = "pair" if data["train"].heads is not None else "token"
        for result in train_heads(
            heads, data, settings, kind=kind, metric=payload["metric"], vocabulary=vocabulary
        ):
            runs.append(_run(encoder, result))
    return {"wall_seconds": time.perf_counter() - started, "runs": runs}


def _vocabulary(cls, saved: dict):
    """The label vocabulary of the payload in the given side's class, with the same ids."""
    from elmolab.data.conll import TagScheme

    scheme = None if saved["scheme"] is None else TagScheme(saved["scheme"])
    vocabulary = cls(saved["labels"][: saved["train_labels"]], unseen="keep", scheme=scheme)
    extra = saved["labels"][saved["train_labels"] :]
    if extra:
        vocabulary.encode([extra])
    if vocabulary.labels != saved["labels"]:
        raise RuntimeError("the label vocabulary did not come out with the same ids")
    vocabulary.unseen = saved["unseen"]
    return vocabulary


def _run(encoder: str, result) -> dict:
    return {
        "encoder": encoder,
        "features": result.features,
        "seed": result.seed,
        "test": 100 * result.test,
        "epochs": result.epochs,
    }


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    results = {}
    for path in args.payloads:
        payload = _load_payload(path)
        if args.worker == "old":
            results[payload["task"]] = _old_side(payload, args.old_root)
        else:
            results[payload["task"]] = _new_side(payload, json.loads(args.schedule))
    args.result.write_text(json.dumps(results, indent=1))


# --- the comparison -------------------------------------------------------------------------


def write_payloads(args: argparse.Namespace, out: Path) -> list[Path]:
    """Each task's splits, for every encoder, as the current code loads them: one file a task."""
    from omegaconf import OmegaConf

    from elmolab.core.config import feature_modes, section
    from elmolab.core.params import compose_params
    from elmolab.core.schema import ExtractConfig, GridConfig, ProbeSettings
    from elmolab.data.catalogue import data_catalog
    from elmolab.probing.cell_data import load_cell

    cfg = OmegaConf.create(compose_params(ROOT / "conf"))
    OmegaConf.update(cfg, "probe.features_dir", str(args.features))
    grid = section(cfg, "grid", GridConfig)
    settings = section(cfg, "probe", ProbeSettings)
    settings.encoders = args.encoders or settings.encoders
    catalog = data_catalog(section(cfg, "extract", ExtractConfig))
    modes = feature_modes(ROOT / "conf", grid.features)
    paths = []
    for name in args.tasks:
        task = grid.tasks[name]
        if task.kind not in ("token", "pair"):
            raise SystemExit(f"{name}: the old engine's train_probe ran token and pair tasks only")
        data = load_cell(task, settings, catalog)
        splits, labels = data.splits, data.labels
        assert labels is not None
        vocabulary = labels.vocabulary
        payload = {
            "task": name,
            "metric": task.metric,
            "modes": modes,
            "seeds": list(args.seeds),
            "vocabulary": {
                "labels": list(vocabulary.labels),
                "train_labels": vocabulary.num_train_labels,
                "unseen": vocabulary.unseen,
                "scheme": None if vocabulary.scheme is None else str(vocabulary.scheme),
            },
            "encoders": {
                encoder: {
                    role: _first_sentences(split, args.max_sentences)
                    for role, split in by_role.items()
                }
                for encoder, by_role in splits.items()
            },
        }
        path = out / f"{name}.pt"
        torch.save(payload, path)
        paths.append(path)
    return paths


def _first_sentences(split, sentences: int | None) -> dict:
    """A split's fields, cut to its first ``sentences`` (all: None). A prefix of whole sentences
    keeps every pair task's head inside it."""
    fields = {f: getattr(split, f) for f in SPLIT_FIELDS}
    if sentences is None:
        return fields
    lengths = fields["sentence_lengths"][:sentences]
    rows = sum(lengths)
    fields["features"] = fields["features"][:, :rows].clone()
    fields["labels"] = fields["labels"][:rows].clone()
    if fields["heads"] is not None:
        fields["heads"] = fields["heads"][:rows].clone()
    fields["sentence_lengths"] = tuple(lengths)
    return fields


def old_source(commit: str, out: Path) -> Path:
    """The old commit's ``src`` and ``conf`` under ``out`` (``git archive``)."""
    target = out / f"old-{commit}"
    if not (target / "src" / "elmolab").is_dir():
        archive = out / f"old-{commit}.tar"
        with archive.open("wb") as handle:
            subprocess.run(
                ["git", "-C", str(ROOT), "archive", commit, "src", "conf"],
                stdout=handle,
                check=True,
            )
        with tarfile.open(archive) as tar:
            tar.extractall(target, filter="data")
        archive.unlink()
    return target


def old_schedule(old_root: Path) -> dict:
    from omegaconf import OmegaConf

    conf = OmegaConf.load(old_root / "conf" / "probe" / "default.yaml")
    return {"lr": conf.lr, "max_epochs": conf.max_epochs, "patience": conf.patience}


def default_run(probes: Path | None) -> dict[tuple[str, str, str], list[float]]:
    """(task, encoder, features) -> the test scores of a finished probe stage (full training
    sets, read as the report reads them), points."""
    from elmolab.report.collect import read_probe_runs

    scores: dict[tuple[str, str, str], list[float]] = {}
    for run in read_probe_runs(probes) if probes is not None else []:
        if run.test is not None:
            scores.setdefault((run.task, run.encoder, run.features), []).append(100 * run.test)
    return scores


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _scores(runs: list[dict], encoder: str, features: str) -> list[float]:
    return [r["test"] for r in runs if (r["encoder"], r["features"]) == (encoder, features)]


def tables(old: dict, new: dict, defaults: dict) -> tuple[list[str], int, int]:
    lines, agree, cells = [], 0, 0
    for task in old:
        lines += [
            f"## {task}",
            "",
            f"Old engine {old[task]['wall_seconds']:.0f} s, probe engine (old schedule, float32)"
            f" {new[task]['wall_seconds']:.0f} s.",
            "",
            "| encoder | features | old engine | probe engine, old schedule | within spread"
            + (" | default run |" if defaults else " |"),
            "|---|---|---|---|---|" + ("---|" if defaults else ""),
        ]
        keys = dict.fromkeys((r["encoder"], r["features"]) for r in old[task]["runs"])
        for encoder, features in keys:
            (m_old, s_old), (m_new, s_new) = (
                _mean_std(_scores(side[task]["runs"], encoder, features)) for side in (old, new)
            )
            within = abs(m_old - m_new) <= max(s_old, s_new)
            agree += within
            cells += 1
            row = (
                f"| {encoder} | {features} | {m_old:.2f} ± {s_old:.2f} | {m_new:.2f} ± {s_new:.2f}"
                f" | {'yes' if within else 'no'} |"
            )
            if defaults:
                default = defaults.get((task, encoder, features))
                row += " – |" if not default else " {:.2f} ± {:.2f} |".format(*_mean_std(default))
            lines.append(row)
        lines.append("")
    return lines, agree, cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--features", type=Path, default=ROOT / "artifacts" / "features")
    parser.add_argument("--tasks", nargs="+", default=["upos", "chunk", "deplabel"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--encoders", nargs="+", help="default: probe.encoders")
    parser.add_argument("--max-sentences", type=int, help="each split's first N sentences")
    parser.add_argument("--old-commit", default=OLD_COMMIT)
    parser.add_argument(
        "--probes", type=Path, help="a finished probe stage to show beside (artifacts/probes)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "engine-compare")
    # one side (run by main in a subprocess)
    parser.add_argument("--worker", choices=["old", "new"], help=argparse.SUPPRESS)
    parser.add_argument("--payloads", nargs="*", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--old-root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--schedule", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    from elmolab.core.hardware import cpu_model

    args.out.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; each side one process, one thread")
    old_root = old_source(args.old_commit, args.out)
    schedule = old_schedule(old_root)
    print(f"old schedule ({args.old_commit}'s conf/probe/default.yaml): {schedule}")
    payloads = write_payloads(args, args.out)
    sides = {}
    for side in ("old", "new"):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if side == "old":
            env["PYTHONPATH"] = str(old_root / "src")  # the old elmolab before the installed one
        command = [sys.executable, __file__, "--worker", side, "--payloads", *map(str, payloads)]
        command += ["--old-root", str(old_root), "--schedule", json.dumps(schedule)]
        command += ["--result", str(args.out / f"{side}.json")]
        sides[side] = subprocess.Popen(command, env=env)
    for side, process in sides.items():
        if process.wait():
            raise SystemExit(f"the {side} engine's side failed (exit status {process.returncode})")
    old = json.loads((args.out / "old.json").read_text())
    new = json.loads((args.out / "new.json").read_text())
    lines, agree, cells = tables(old, new, default_run(args.probes))
    text = "\n".join(lines) + f"\n{agree} of {cells} cells within the seed spread.\n"
    (args.out / "engine-comparison.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
