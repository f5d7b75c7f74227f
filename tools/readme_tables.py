"""The results of a finished default run, as markdown: what docs/results.md quotes, taken from
the run's report (``artifacts/report/summary.json``) and the biLM's curve, its encoders, their
roles and the control tasks from its composed config (``params.yaml``).

    .venv/bin/python tools/readme_tables.py [WORKSPACE] [--start EPOCH --end EPOCH]

Prints README's results (``--readme``: them alone, as README holds them: the report's claims and
a table per task of the means), the report's own sections that docs/results.md quotes (claims,
main result, layer panel, task model, selectivity, online code, conditional probing: copied from
``summary.md``, so they read as the report does), the pretraining figures (perplexities against
the unigram model, the stateless ratios, the validation curve), the probe runs and how many hit
the epoch cap, the probe time the information measures took, and the scalar mix's weights on the
tree tasks. With
``--start`` and ``--end`` (seconds since the epoch around ``make run``), also each stage's wall
time, read from when its outputs were last written (a stage ends with its last output file).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from elmolab.core.config import load_params
from elmolab.core.schema import control_folder
from elmolab.report.collect import Display
from elmolab.report.format import interval_text, p_equals, pct

SHORT_METRICS = {"uas": "UAS", "uuas": "UUAS", "accuracy": "accuracy", "span_f1": "span F1"}
SHORT_VERDICTS = {
    "mix better": "better",
    "best layer better": "worse",
    "no significant difference": "n.s.",
}
CONDITIONED = (("layer1", "layer 1"), ("layer2", "layer 2"), ("scalar_mix", "scalar mix"))


def mean_std(cell: dict[str, Any]) -> str:
    if cell.get("std") is None:
        return pct(cell["mean"])
    return f"{pct(cell['mean'])} ± {pct(cell['std'])}"


def header(*columns: str) -> list[str]:
    """A Markdown table's header and rule."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


# The report's sections docs/results.md quotes, by their summary.md headings.
QUOTED_SECTIONS = (
    "Claims",
    "Main result",
    "What each layer encodes",
    "ELMo in a task model",
    "Selectivity",
    "Online code (description length)",
    "Information beyond layer 0 (conditional probing)",
)


def report_sections(workspace: Path, headings: tuple[str, ...]) -> list[str]:
    """The report's ``summary.md`` sections with these ``headings``, each whole (its heading down
    to the next), figures left out."""
    path = workspace / "artifacts/report/summary.md"
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    blocks = {}
    for block in text.split("\n## ")[1:]:
        heading, _, body = block.partition("\n")
        blocks[heading.strip()] = [
            line for line in body.strip().splitlines() if not line.startswith("![")
        ]
    lines: list[str] = []
    for heading in headings:
        if heading in blocks:
            lines += [f"### {heading}", "", *blocks[heading], ""]
    return lines


def claims_table(summary: dict[str, Any]) -> list[str]:
    """The report's claims, compact: claim, effect [95% CI], Holm-adjusted p, verdict."""
    found = summary.get("claims", {}).get("claims", [])
    if not found:
        return []
    lines = header("claim", "effect [95% CI]", "p (Holm)", "verdict")
    for c in found:
        effect = "–"
        if c["effect"] is not None:
            effect = interval_text(c["effect"], (c["low"], c["high"]))
        p = "–" if c["p_value"] is None else p_equals(c["p_value"]).removeprefix("p ").strip("= ")
        lines.append(f"| {c['claim']} ({c['measure']}) | {effect} | {p} | {c['verdict']} |")
    return lines


def readme_table(summary: dict[str, Any], display: Display) -> list[str]:
    """README's "Results" table: per task of the layer panel (its family), the main encoder's
    (the trained biLM's) best single layer (chosen on dev) and its scalar mix, and the scalar mix
    of the encoders in the baseline roles (report.encoders: random, token_layer; all instances),
    means over runs."""
    lines = header(
        "task",
        "family",
        "trained: best layer",
        "scalar mix",
        "random init (mix)",
        "token layer (mix)",
    )
    comparisons = {(c["task"], c["encoder"]): c for c in summary["comparisons"]}
    for row in summary["layer_panel"]["tasks"]:
        task = row["task"]
        main = comparisons.get((task, display.main))
        if main is None:
            continue
        cells = summary["probes"][task]
        metric = cells[main["best_layer"]][display.main]["metric"]
        label = "1-NN F1" if metric == "f1" else SHORT_METRICS.get(metric, metric)
        layer = main["best_layer"].replace("layer", "layer ")
        mix = cells.get("scalar_mix", {}).get(display.main)
        applicable = mix is not None and mix.get("applicable", True)
        baselines = [
            pct(cell["mean"])
            if (cell := cells.get("scalar_mix", {}).get(str(encoder))) and cell.get("n")
            else "–"
            for encoder in (display.random, display.token_layer)
        ]
        lines.append(
            f"| {task} ({label}) | {row['family']} | {pct(main['best_layer_mean'])} ({layer}) | "
            f"{pct(mix['mean']) if applicable else '–'} | " + " | ".join(baselines) + " |"
        )
    return lines


def pretraining(summary: dict[str, Any], workspace: Path) -> list[str]:
    trained = summary["pretraining"]["trained"]
    val, test, unigram = trained["val"], trained["test"], trained["unigram_ppl"]
    lines = [
        f"validation perplexity {val['ppl']:.1f} = {val['ppl'] / unigram['valid']:.3f}x unigram"
        f" ({unigram['valid']:.0f}): forward {val['ppl_fwd']:.1f} / backward {val['ppl_bwd']:.1f}"
        f" carried, {val['stateless_ppl_fwd']:.1f} / {val['stateless_ppl_bwd']:.1f} stateless"
        f" (x{val['stateless_ppl_fwd'] / val['ppl_fwd']:.3f} /"
        f" x{val['stateless_ppl_bwd'] / val['ppl_bwd']:.3f}); test {test['ppl']:.1f} ="
        f" {test['ppl'] / unigram['test']:.3f}x ({unigram['test']:.1f})",
        f"pretraining: {trained['steps']:,} steps, {trained['tokens']:,} tokens at"
        f" {trained['tokens_per_second']:,.0f} tokens/s, the stage {trained['wall_seconds']} s,"
        f" precision {trained['precision']['chosen']}",
    ]
    curve = workspace / "artifacts" / "bilm" / "curve.csv"
    if curve.is_file():
        with curve.open() as rows:
            points = [
                f"{float(row['val_ppl']):.0f} / {float(row['val_stateless_ppl']):.0f}"
                for row in csv.DictReader(rows)
                if row["val_ppl"]
            ]
        lines.append("validation curve (carried / stateless): " + ", ".join(points))
    training = summary["training"]
    lines.append(
        f"probe runs: {training['trained_runs']:,}, at the epoch cap: {training['hit_epoch_cap']}"
    )
    return lines


def information_time(summary: dict[str, Any]) -> list[str]:
    """Each task's probe time in the information measures it ran (a measure off: left out)."""
    lines = []
    for t in summary.get("information_time", []):
        parts = [
            f"{what} {t[key]:.0f} s"
            for what, key in (
                ("online code", "online_code_seconds"),
                ("conditional heads", "conditional_seconds"),
            )
            if t.get(key) is not None
        ]
        if parts:
            lines.append(f"{t['task']}: {', '.join(parts)} (probe time, summed over the workers)")
    return lines


def tree_mixes(summary: dict[str, Any], workspace: Path, display: Display) -> list[str]:
    main = display.main
    lines = []
    for task, cells in summary["probes"].items():
        if cells.get("layer2", {}).get(main, {}).get("metric") not in ("uas", "uuas"):
            continue
        runs = {}
        for mode in ("scalar_mix", "layer2"):
            folder = workspace / "artifacts" / "probes" / task / mode / str(main)
            runs[mode] = sorted(
                (json.loads(p.read_text()) for p in folder.glob("seed*/metrics.json")),
                key=lambda run: run["seed"],
            )
        mixes = runs["scalar_mix"]
        if not mixes:
            continue
        weights = [statistics.fmean(r["mix_weights"][i] for r in mixes) for i in range(3)]
        lines.append(
            f"{task}: mix weights {[round(w, 2) for w in weights]} (mean over seeds), gamma"
            f" {sorted(round(r['gamma'], 2) for r in mixes)}, the mean of the layers"
            f" {pct(cells['mean'][main]['mean'])}; best epochs: mix"
            f" {[r['best_epoch'] for r in mixes]},"
            f" layer 2 {[r['best_epoch'] for r in runs['layer2']]}"
        )
    return lines


def stage_times(workspace: Path, start: float, end: float) -> list[str]:
    """Each stage's end (its outputs' last write) and the time since the previous end."""
    artifacts = workspace / "artifacts"
    outputs: dict[str, list[Path]] = {  # a stage's output folders
        "prepare": [artifacts / "corpus"],
        "pretrain": [artifacts / "bilm"],
    }
    cfg = load_params(workspace / "params.yaml")
    for control, stage in (("random", "pretrain_random"), ("token_layer", "token_control")):
        for instance in OmegaConf.select(cfg, f"controls.{control}", default=None) or {}:
            outputs[f"{stage}@{instance}"] = [artifacts / control_folder(instance)]
    features = artifacts / "features"
    encoders = sorted(features.iterdir()) if features.is_dir() else []
    for dataset in sorted({d.name for encoder in encoders for d in encoder.iterdir()}):
        outputs[f"extract@{dataset}"] = [encoder / dataset for encoder in encoders]
    probes = artifacts / "probes"
    for task in sorted(probes.iterdir()) if probes.is_dir() else []:
        outputs[f"probe@{task.name}"] = [task]
    outputs["taskmodel"] = [artifacts / "taskmodel"]
    outputs["report"] = [artifacts / "report"]
    ends = []
    for name, folders in outputs.items():
        files = [f for folder in folders for f in folder.rglob("*")]
        times = [f.stat().st_mtime for f in files if f.is_file()]
        if times:
            ends.append((max(times), name))
    lines, previous = [], start
    for when, name in sorted(ends):
        lines.append(
            f"{name:28s} ends at {when - start:6.0f} s (+{(when - previous) / 60:5.1f} min)"
        )
        previous = when
    lines.append(f"whole run: {end - start:.0f} s = {(end - start) / 60:.1f} min")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workspace", type=Path, nargs="?", default=Path("."))
    parser.add_argument("--start", type=float, help="seconds since the epoch when make run began")
    parser.add_argument("--end", type=float, help="... and when it ended")
    parser.add_argument("--readme", action="store_true", help="README's results table alone")
    args = parser.parse_args()
    summary = json.loads((args.workspace / "artifacts/report/summary.json").read_text())
    display = Display.of(load_params(args.workspace / "params.yaml"))
    readme = [claims_table(summary), readme_table(summary, display)]
    if args.readme:
        print("\n\n".join("\n".join(block) for block in readme if block))
        return
    blocks = [
        *readme,
        report_sections(args.workspace, QUOTED_SECTIONS),
        pretraining(summary, args.workspace),
        information_time(summary),
        tree_mixes(summary, args.workspace, display),
    ]
    if args.start is not None and args.end is not None:
        blocks.append(stage_times(args.workspace, args.start, args.end))
    print("\n\n".join("\n".join(block) for block in blocks if block))


if __name__ == "__main__":
    main()
