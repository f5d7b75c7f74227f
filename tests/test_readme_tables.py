"""tools/readme_tables.py: README's results blocks from a run's report summary."""

import json
import os
import subprocess
import sys
from pathlib import Path

from elmolab.core.params import compose_params

ROOT = Path(__file__).resolve().parents[1]


def _cell(metric: str, mean: float, std: float | None = 0.01, encoder_ok: bool = True) -> dict:
    return {"metric": metric, "applicable": encoder_ok, "n": 3, "mean": mean, "std": std}


def _summary() -> dict:
    modes = ("layer0", "layer1", "layer2", "mean", "scalar_mix", "concat")
    probes = {
        task: {
            mode: {
                encoder: _cell("accuracy", 0.5 + 0.1 * i + 0.01 * j)
                for j, encoder in enumerate(("trained", "random", "token_only"))
            }
            for i, mode in enumerate(modes)
        }
        for task in ("upos", "upos_control")
    }
    comparisons = [
        {
            "task": task,
            "encoder": encoder,
            "best_layer": "layer2",
            "best_layer_mean": probes[task]["layer2"][encoder]["mean"],
            "p_value": 0.0004,
            "verdict": "mix better",
        }
        for task in probes
        for encoder in ("trained", "random", "token_only")
    ]
    compression = {"mean": 9.75, "std": 0.01}
    gain = {"mean": 0.4, "std": 0.09, "significant": True}
    points = {"mean": 0.0795, "std": 0.0098, "significant": False}
    return {
        "probes": probes,
        "comparisons": comparisons,
        "pretraining": {
            "trained": {
                "val": {
                    "ppl": 200.0,
                    "ppl_fwd": 202.0,
                    "ppl_bwd": 198.0,
                    "stateless_ppl_fwd": 204.02,
                    "stateless_ppl_bwd": 198.0,
                },
                "test": {"ppl": 210.0},
                "unigram_ppl": {"valid": 800.0, "test": 840.0},
                "steps": 1000,
                "tokens": 2560000,
                "tokens_per_second": 4130.4,
                "wall_seconds": 818.4,
                "precision": {"chosen": "bf16-mixed"},
            }
        },
        "training": {"trained_runs": 999, "hit_epoch_cap": 0},
        "online_code": {
            "cells": [
                {"task": "upos", "features": "layer1", "encoder": e, "compression": compression}
                for e in ("trained", "random", "token_only")
            ]
        },
        "conditional_probing": {
            "gains": [
                {
                    "task": "upos",
                    "mode": "layer1",
                    "encoder": e,
                    "test_bits_gain": gain,
                    "metric_gain": points,
                }
                for e in ("trained", "random", "token_only")
            ]
        },
        "information_time": [
            {"task": "upos", "online_code_seconds": 237.9, "conditional_seconds": 62.3}
        ],
        "layer_panel": {"tasks": [{"task": "upos", "family": "syntactic"}]},
        "claims": {
            "claims": [
                {
                    "claim": "layer 1 holds more syntax than layer 2",
                    "measure": "layer 1 − layer 2, points",
                    "effect": -1.5,
                    "low": -2.0,
                    "high": -1.0,
                    "p_value": 0.0004,
                    "verdict": "contradicted",
                },
                {
                    "claim": "ELMo adds to a task model",
                    "measure": "F1 points",
                    "effect": None,
                    "low": None,
                    "high": None,
                    "p_value": None,
                    "verdict": "not testable",
                },
            ]
        },
    }


SUMMARY_MD = """# a report

## Claims

| claim | effect |
|---|---|
| **layer 1 holds more syntax than layer 2** | -1.50 [-2.00, -1.00] |

## Pretraining

not quoted

## Selectivity

| task | selectivity |
|---|---|
| upos | +34.00 [+33.00, +35.00] |

![selectivity](figures/selectivity.png)
"""


def _write_run(workspace: Path) -> None:
    """A finished run's report summary and the composed config it ran with (the default's, with
    the summary's encoders: each control's first instance)."""
    report = workspace / "artifacts" / "report"
    report.mkdir(parents=True)
    (report / "summary.json").write_text(json.dumps(_summary()))
    (report / "summary.md").write_text(SUMMARY_MD, encoding="utf-8")
    encoders = "probe.encoders=[trained,random,token_only]"
    params = compose_params(ROOT / "conf", [encoders])
    (workspace / "params.yaml").write_text(params, encoding="utf-8")


def _run(workspace: Path, *args: str) -> str:
    tool = ROOT / "tools" / "readme_tables.py"
    proc = subprocess.run(
        [sys.executable, tool, workspace, *args], capture_output=True, text=True, check=True
    )
    return proc.stdout


def test_the_blocks_come_from_the_summary(tmp_path: Path) -> None:
    _write_run(tmp_path)
    out = _run(tmp_path)
    assert (
        "| layer 1 holds more syntax than layer 2 (layer 1 − layer 2, points) |"
        " -1.50 [-2.00, -1.00] | < 0.001 | contradicted |" in out
    )
    assert "| ELMo adds to a task model (F1 points) | – | – | not testable |" in out
    # the report's own sections, quoted whole (figures left out); the others not
    assert "### Claims\n\n| claim | effect |" in out
    assert "### Selectivity\n\n| task | selectivity |\n|---|---|\n| upos |" in out
    assert "not quoted" not in out and "figures/selectivity.png" not in out
    assert "validation perplexity 200.0 = 0.250x unigram (800)" in out
    assert "(x1.010 / x1.000); test 210.0 = 0.250x (840.0)" in out
    assert "probe runs: 999, at the epoch cap: 0" in out
    assert "upos: online code 238 s, conditional heads 62 s" in out


def test_stage_times_follow_the_outputs_last_writes(tmp_path: Path) -> None:
    _write_run(tmp_path)
    files = {
        "artifacts/corpus/vocab.txt": 60,
        "artifacts/bilm/weights.hdf5": 900,
        "artifacts/bilm_random_2/weights.hdf5": 930,
        "artifacts/bilm_token_only/weights.hdf5": 936,
        "artifacts/features/trained/ewt/train.hdf5": 1200,
        "artifacts/features/random/ewt/train.hdf5": 1260,
        "artifacts/probes/upos/layer1/trained/seed1/metrics.json": 1500,
        "artifacts/report/summary.json": 1530,
        "artifacts/report/summary.md": 1530,
    }
    start = 1_000_000.0
    for name, offset in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        os.utime(path, (start + offset, start + offset))
    out = _run(tmp_path, "--start", str(start), "--end", str(start + 1560))
    lines = [line.split() for line in out.splitlines() if " ends at " in line]
    assert [(w[0], w[3], w[-2]) for w in lines] == [
        ("prepare", "60", "1.0"),
        ("pretrain", "900", "14.0"),
        ("pretrain_random@random_2", "930", "0.5"),
        ("token_control@token_only", "936", "0.1"),
        ("extract@ewt", "1260", "5.4"),
        ("probe@upos", "1500", "4.0"),
        ("report", "1530", "0.5"),
    ]
    assert "whole run: 1560 s = 26.0 min" in out


def test_readme_table_is_the_results_table_of_readme(tmp_path: Path) -> None:
    """``--readme`` prints README's tables as README holds them: the claims, then the layer
    panel's tasks with their family, the trained biLM's best layer and mix, each baseline's mix;
    README's own tables have the same headers, made by the same command."""
    _write_run(tmp_path)
    claims, table = (block.splitlines() for block in _run(tmp_path, "--readme").split("\n\n"))
    assert table[2:] == [
        "| upos (accuracy) | syntactic | 70.00 (layer 2) | 90.00 | 91.00 | 92.00 |"
    ]
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    for lines in (claims, table):
        assert lines[0] in readme
        assert readme[readme.index(lines[0]) + 1] == lines[1]
