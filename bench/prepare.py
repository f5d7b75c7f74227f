"""Prepare-stage scaling: wall time and peak RSS on the full corpus and on it replicated 5 times.

The replicated corpus lists every source five times under different names (same files), so the
text is 5x larger while the vocabulary stays the same: time should grow about linearly and peak
memory (which depends on the vocabulary, not on the corpus size) by less than 20%.

Run: .venv/bin/python bench/prepare.py   (needs `make install` for the data)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    from pathlib import Path
    import yaml
    from omegaconf import OmegaConf
    from elmolab.core.config import section
    from elmolab.core.params import compose_params
    from elmolab.text.prepare import CorpusConfig, prepare_corpus

    copies, out = int(sys.argv[1]), Path(sys.argv[2])
    cfg = OmegaConf.create(yaml.safe_load(compose_params(Path("conf"))))
    corpus = section(cfg, "corpus", CorpusConfig)
    corpus.sources = {
        f"{name}_{k}" if copies > 1 else name: src
        for k in range(copies) for name, src in corpus.sources.items()
    }
    start = time.perf_counter()
    stats = prepare_corpus(corpus, out, seed=cfg.seed)
    wall = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tokens = sum(s["tokens"] for s in stats["splits"].values())
    print(json.dumps({"wall_s": wall, "peak_rss_mib": rss, "tokens": tokens,
                      "vocab": stats["vocabulary"]["size"]}))
    """
)


def measure(copies: int, out: Path) -> dict:
    """One prepare run in a fresh process (so peak RSS is its own)."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(copies), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        one = measure(1, Path(tmp) / "x1")
        five = measure(5, Path(tmp) / "x5")
    print(f"{'corpus':<10}{'tokens':>12}{'wall s':>10}{'peak RSS MiB':>15}{'vocab':>8}")
    for name, r in (("full", one), ("full x5", five)):
        print(
            f"{name:<10}{r['tokens']:>12,}{r['wall_s']:>10.1f}{r['peak_rss_mib']:>15.0f}"
            f"{r['vocab']:>8,}"
        )
    time_ratio = five["wall_s"] / one["wall_s"]
    rss_growth = five["peak_rss_mib"] / one["peak_rss_mib"] - 1
    print(f"tokens x{five['tokens'] / one['tokens']:.2f}: time x{time_ratio:.2f} (linear: 5), ")
    print(
        f"peak RSS {rss_growth:+.1%} (target: < +20%); full corpus {one['wall_s']:.0f} s "
        "(target: < 120 s)"
    )


if __name__ == "__main__":
    main()
