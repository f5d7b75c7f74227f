"""The extract stage's batch size: one split extracted at several ``extract.batch_size`` values.

Runs ``elmolab.extraction.features.extract_split`` (what the stage runs: the biLM stateless over the
length-sorted sentences, float16 feature files written) on one split of a probing dataset with
each batch size, interleaved over ``--rounds`` rounds (each size's best time counts), on
``--threads`` threads with idle OpenMP threads spinning, as in the stage
(``elmolab.core.openmp``). It prints each size's time and words/s, its speed against the first
size, and the largest difference of its features from the first size's (the matrix products'
rounding depends on the batch shape).

The encoder is the trained biLM (``--model``, default ``artifacts/bilm``) when it exists, else one
with the CPU default's shape and random weights (the speed does not depend on the weights).

    .venv/bin/python bench/extract.py [--batch-sizes 64 128 256] [--dataset ud_english_ewt]
        [--split train] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from elmolab.core.openmp import spin_idle_threads

spin_idle_threads()  # before torch loads, as the stage does

import numpy as np  # noqa: E402
import torch  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from elmolab.core.config import section  # noqa: E402
from elmolab.core.hardware import cpu_model  # noqa: E402
from elmolab.core.params import compose_params  # noqa: E402
from elmolab.core.schema import ExtractConfig, ModelConfig  # noqa: E402
from elmolab.data.catalogue import data_catalog  # noqa: E402
from elmolab.extraction.features import extract_split  # noqa: E402
from elmolab.io.features import read_features  # noqa: E402
from elmolab.models.bilm import BiLM, BiLMOptions  # noqa: E402
from elmolab.models.encoder_files import load_encoder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def encoder(folder: Path, cfg: DictConfig) -> tuple[BiLM, str]:
    """The biLM of ``folder`` as the extract stage loads an encoder, else the configured shape
    with random weights."""
    if folder.is_dir():
        return load_encoder(str(folder)), str(folder)
    options = BiLMOptions.from_dict(section(cfg, "model", ModelConfig).options())
    return BiLM(options).eval(), "random weights, the configured shape"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--dataset", default="ud_english_ewt")
    parser.add_argument("--split", default="train")
    parser.add_argument("--model", type=Path, default=ROOT / "artifacts/bilm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = OmegaConf.create(compose_params(ROOT / "conf"))
    source = data_catalog(section(cfg, "extract", ExtractConfig)).read(args.dataset, args.split)
    model, described = encoder(args.model, cfg)
    print(
        f"CPU: {cpu_model()}, {torch.get_num_threads()} threads; {args.dataset}/{args.split}: "
        f"{len(source.sentences)} sentences; encoder: {described}"
    )
    best: dict[int, float] = {}
    words = 0
    with tempfile.TemporaryDirectory() as tmp:
        paths = {size: Path(tmp) / f"batch{size}.hdf5" for size in args.batch_sizes}
        for _ in range(args.rounds):
            for size in args.batch_sizes:
                started = time.perf_counter()
                stats = extract_split(model, source, paths[size], batch_size=size)
                best[size] = min(best.get(size, float("inf")), time.perf_counter() - started)
                words = int(stats["words"])
        first = args.batch_sizes[0]
        reference = read_features(paths[first])
        for size in args.batch_sizes:
            features = read_features(paths[size])
            difference = max(
                float(np.abs(a.astype(np.float32) - b.astype(np.float32)).max())
                for a, b in zip(reference, features, strict=True)
            )
            print(
                f"batch {size:4d}: {best[size]:6.2f} s, {words / best[size]:8,.0f} words/s, "
                f"{best[first] / best[size]:.2f}x batch {first}; largest feature difference "
                f"{difference:.2e}"
            )


if __name__ == "__main__":
    main()
