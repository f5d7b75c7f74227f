"""Embedding throughput of elmolab's engine against the reference PyTorch port of ELMo.

The reference is allennlp 2.10.1's ``_ElmoBiLm`` (``allennlp/modules/elmo.py`` with
``elmo_lstm.py``, ``lstm_cell_with_projection.py``, ``encoder_base.py``, ``highway.py``). Both
load the same random weights at the published small shape (``2x1024_128_2048cnn_1xhighway``),
written by ``export_bilm``; both run the same sentences (CoNLL-2000 train, the word column) in
fp32 on ``--threads`` threads (OpenMP threads sleep when idle, see ``main``), stateless: the
reference's states are reset before every batch.

Runs, each timed end to end (character ids, model, per-sentence outputs without the sentence
marks):

1. elmolab engine: ``embed_sentences`` (sentences sorted by length into batches);
2. reference on the same batches as run 1;
3. reference on file-order batches (as the removed ``allennlp elmo`` command ran);
4. elmolab ``BiLM`` on the file-order batches of run 3.

All outputs (every layer) must agree within 1e-5 (the script fails otherwise). It prints, for
each run, wall-clock seconds and tokens/s, and the process's CPU seconds and tokens per CPU
second (steadier when other jobs share the machine), then the speed-ups. ``--repeats N`` runs
N interleaved rounds and keeps each run's best time.

    .venv/bin/python bench/embed.py [--sentences 2000] [--batch-size 64] [--threads 2]

The reference is fetched once into ``.bench/`` (git-ignored) with pip; what it imports but ELMo
never uses (transformers, cached_path, fairscale, ...) is replaced by empty stub modules.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import types
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar, NamedTuple

import torch

from elmolab.embed import embed_sentences
from elmolab.models.bilm import BiLM, BiLMOptions
from elmolab.models.bilm_tf import export_bilm, load_bilm
from elmolab.text.chars import char_ids_for_sentences

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / ".bench"
ALLENNLP = "allennlp==2.10.1"
TOLERANCE = 1e-5
ENGINE = "elmolab engine (length-sorted batches)"
REFERENCE_SAME = "reference, the same batches"
REFERENCE_FILE = "reference, file-order batches"
BILM_FILE = "elmolab BiLM, file-order batches"


def conll_sentences(path: Path, limit: int) -> list[list[str]]:
    """The first ``limit`` sentences of a CoNLL file (first column; blank lines separate)."""
    sentences: list[list[str]] = []
    tokens: list[str] = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            fields = line.split()
            if fields:
                tokens.append(fields[0])
            elif tokens:
                sentences.append(tokens)
                tokens = []
                if len(sentences) == limit:
                    break
    if tokens and len(sentences) < limit:
        sentences.append(tokens)
    return sentences


class _StubModule(types.ModuleType):
    """A module whose every attribute is a new empty class: enough for import-time use."""

    __path__: ClassVar[list[str]] = []

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (), {})
        setattr(self, name, value)
        return value


def import_reference() -> types.ModuleType:
    """``allennlp.modules.elmo`` from ``.bench/allennlp``, fetched with pip if missing."""
    target = BENCH_DIR / "allennlp"
    if not (target / "allennlp" / "modules" / "elmo.py").is_file():
        wheels = BENCH_DIR / "wheels"
        print(f"fetching {ALLENNLP} (no dependencies) into {wheels}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", ALLENNLP, "--no-deps", "-d", str(wheels)],
            check=True,
        )
        (wheel,) = wheels.glob("allennlp-2.10.1-*.whl")
        print(f"unpacking {wheel.name} into {target}", flush=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
    sys.path.insert(0, str(target))
    stubbed: list[str] = []
    while True:
        try:
            import allennlp.modules.elmo as elmo
            import allennlp.modules.elmo_lstm as elmo_lstm
        except ImportError as error:
            if error.name is None or error.name.startswith("allennlp"):
                raise
            parts = error.name.split(".")
            for end in range(1, len(parts) + 1):
                name = ".".join(parts[:end])
                if not isinstance(sys.modules.get(name), _StubModule):
                    sys.modules[name] = _StubModule(name)
                    stubbed.append(name)
            for name in [n for n in sys.modules if n.split(".")[0] == "allennlp"]:
                del sys.modules[name]  # import again from scratch, with the new stub
            continue
        break
    print(f"stubbed for the reference: {', '.join(sorted(stubbed)) or 'nothing'}")
    # Local files only: the stubbed cached_path package is never needed.
    elmo.cached_path = elmo_lstm.cached_path = str
    return elmo


def reference_runner(
    elmo: types.ModuleType, model: torch.nn.Module
) -> Callable[[Sequence[Sequence[str]]], list[torch.Tensor]]:
    """Runs one batch statelessly; one (3, n_tokens, 2 * proj) tensor per sentence."""

    def run(batch: Sequence[Sequence[str]]) -> list[torch.Tensor]:
        model._elmo_lstm.reset_states()  # the port is stateful; every batch starts from zero
        output = model(elmo.batch_to_ids([list(s) for s in batch]))
        layers = torch.stack(output["activations"], dim=1)  # (batch, 3, time + 2, 2 * proj)
        return [layers[r, :, 1 : len(s) + 1] for r, s in enumerate(batch)]

    return run


def elmolab_runner(model: BiLM) -> Callable[[Sequence[Sequence[str]]], list[torch.Tensor]]:
    """Runs one batch through the model (stateless); one tensor per sentence."""

    def run(batch: Sequence[Sequence[str]]) -> list[torch.Tensor]:
        layers = model(
            char_ids_for_sentences(batch, add_sentence_marks=False)
        ).layers  # (batch, 3, time, 2 * proj)
        return [layers[r, :, : len(s)] for r, s in enumerate(batch)]

    return run


def batches(order: Sequence[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(order), size):
        yield list(order[start : start + size])


def run_batches(
    run: Callable[[Sequence[Sequence[str]]], list[torch.Tensor]],
    sentences: Sequence[Sequence[str]],
    groups: Sequence[list[int]],
) -> dict[int, torch.Tensor]:
    outputs: dict[int, torch.Tensor] = {}
    for group in groups:
        outputs.update(zip(group, run([sentences[i] for i in group]), strict=True))
    return outputs


class Timing(NamedTuple):
    wall: float  # seconds on the clock
    cpu: float  # seconds of CPU used by this process (all threads)


def measure(work: Callable[[], dict[int, torch.Tensor]]) -> tuple[dict[int, torch.Tensor], Timing]:
    wall, cpu = time.perf_counter(), time.process_time()
    outputs = work()
    return outputs, Timing(time.perf_counter() - wall, time.process_time() - cpu)


def max_difference(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[i] - b[i]).abs().max()) for i in a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="rounds; the best time counts")
    parser.add_argument("--corpus", type=Path, default=ROOT / "data/probing/conll2000/train.txt")
    args = parser.parse_args()
    if "OMP_WAIT_POLICY" not in os.environ:
        # OpenMP threads spin after each parallel region; on a shared 2-core machine a spinning
        # thread holds the core that another job needs and small ops run ~10x slower (measured
        # here: 30 s instead of 4.7 s). Sleeping threads keep the timings meaningful. OpenMP
        # reads this when torch loads, so the script restarts itself with it.
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    elmo = import_reference()

    sentences = conll_sentences(args.corpus, args.sentences)
    n_tokens = sum(len(s) for s in sentences)
    with tempfile.TemporaryDirectory() as tmp:
        options, weights = Path(tmp) / "options.json", Path(tmp) / "lm_weights.hdf5"
        export_bilm(BiLM(BiLMOptions.published("small")), options, weights)
        ours = load_bilm(options, weights)
        reference = elmo._ElmoBiLm(str(options), str(weights)).eval()
    print(
        f"{len(sentences)} sentences, {n_tokens} tokens, batch size {args.batch_size}, "
        f"{torch.get_num_threads()} threads (OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}), "
        "fp32, small shape (2x1024_128_2048cnn_1xhighway)"
    )

    run_reference = reference_runner(elmo, reference)
    run_ours = elmolab_runner(ours)
    file_order = list(batches(range(len(sentences)), args.batch_size))
    by_length = sorted(range(len(sentences)), key=lambda i: len(sentences[i]), reverse=True)
    same_batches = list(batches(by_length, args.batch_size))  # what embed_sentences forms
    runs: dict[str, Callable[[], dict[int, torch.Tensor]]] = {
        ENGINE: lambda: dict(embed_sentences(ours, sentences, args.batch_size)),
        REFERENCE_SAME: lambda: run_batches(run_reference, sentences, same_batches),
        REFERENCE_FILE: lambda: run_batches(run_reference, sentences, file_order),
        BILM_FILE: lambda: run_batches(run_ours, sentences, file_order),
    }
    outputs: dict[str, dict[int, torch.Tensor]] = {}
    timings: dict[str, list[Timing]] = {name: [] for name in runs}
    with torch.inference_mode():
        warmup = [sentences[i] for i in file_order[0]]
        run_reference(warmup)
        run_ours(warmup)
        for _ in range(args.repeats):  # rounds interleave the runs, so load changes hit all
            for name, work in runs.items():
                outputs[name], timing = measure(work)
                timings[name].append(timing)

    pairs = {  # label: (elmolab run, reference run)
        "engine vs reference, same batches": (ENGINE, REFERENCE_SAME),
        "engine vs reference, file order": (ENGINE, REFERENCE_FILE),
        "BiLM vs reference, both file order": (BILM_FILE, REFERENCE_FILE),
    }
    worst = 0.0
    for label, (ours_run, reference_run) in pairs.items():
        difference = max_difference(outputs[ours_run], outputs[reference_run])
        worst = max(worst, difference)
        print(f"max |difference| over all 3 layers, {label}: {difference:.2e}")
    best = {n: Timing(min(t.wall for t in ts), min(t.cpu for t in ts)) for n, ts in timings.items()}
    header = f"{'wall s':>8} {'tokens/s':>9} {'CPU s':>8} {'tokens/CPU s':>12}"
    print(f"{f'best of {args.repeats} run(s)':<40} {header}")
    for name, t in best.items():
        rates = f"{n_tokens / t.wall:9.0f} {t.cpu:8.2f} {n_tokens / t.cpu:12.0f}"
        print(f"{name:<40} {t.wall:8.2f} {rates}")
    for label, (ours_run, reference_run) in pairs.items():
        wall = best[reference_run].wall / best[ours_run].wall
        cpu = best[reference_run].cpu / best[ours_run].cpu
        print(f"speed-up {label:<36} {wall:5.2f}x wall, {cpu:5.2f}x CPU")
    if worst > TOLERANCE:
        sys.exit(f"outputs differ by more than {TOLERANCE}")


if __name__ == "__main__":
    main()
