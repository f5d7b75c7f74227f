"""The ``elmolab`` command line: ``elmolab SUBCOMMAND [ARGS]``.

A subcommand is a ``Command`` in ``COMMANDS``: a help line, a function that declares its
arguments, and a function that runs it and returns the exit status. Every ElmolabError ends
the program with one line on stderr (naming the file at fault) and status 1, without a traceback;
so does a full disk (naming the file and the free space) or exhausted memory.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from elmolab.core.errors import ElmolabError, resource_errors_named
from elmolab.embed import DEFAULT_BATCH_SIZE, embed_file
from elmolab.io.features import LAYER_MODES, STORAGE_DTYPES
from elmolab.models.bilm_tf import load_bilm, load_bilm_from_checkpoint

# Ends the help of every option that has a default (tests/test_embed_cli.py checks each does).
DEFAULT = " (default: %(default)s)"


class Command(NamedTuple):
    """One subcommand of ``elmolab``."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _add_embed_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="text file: one whitespace-tokenized sentence per line")
    parser.add_argument("output", help="HDF5 feature file to write (allennlp elmo format)")
    model = parser.add_argument_group("model (bilm-tf files, or an elmolab checkpoint)")
    model.add_argument("--options", help="bilm-tf options.json")
    model.add_argument("--weights", help="bilm-tf lm_weights.hdf5")
    model.add_argument("--checkpoint", help="biLM checkpoint written by the pretraining stage")
    parser.add_argument(
        "--layers",
        choices=LAYER_MODES,
        default="all",
        help=f"what to store per token: every layer, the top one, or their average{DEFAULT}",
    )
    parser.add_argument(
        "--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help=f"sentences per batch{DEFAULT}"
    )
    parser.add_argument(
        "--stateful",
        action="store_true",
        help="file order, LSTM states carried from batch to batch (as bilm-tf); default: "
        "every sentence starts from zero states, batched by length",
    )
    parser.add_argument(
        "--device", default="cpu", help=f"torch device, e.g. cpu or cuda:0{DEFAULT}"
    )
    parser.add_argument(
        "--dtype",
        choices=STORAGE_DTYPES,
        default="float32",
        help=f"storage type of the features{DEFAULT}",
    )


def _run_embed(args: argparse.Namespace) -> int:
    if args.checkpoint is not None and (args.options is not None or args.weights is not None):
        raise ElmolabError("give either --checkpoint or --options and --weights, not both")
    if args.checkpoint is None and (args.options is None or args.weights is None):
        raise ElmolabError("give --options and --weights (or --checkpoint)")
    if args.batch_size < 1:
        raise ElmolabError(f"--batch-size must be at least 1, got {args.batch_size}")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise ElmolabError(f"--device {args.device!r} is not a torch device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ElmolabError(f"--device {args.device}: CUDA is not available")
    if args.checkpoint is not None:
        model = load_bilm_from_checkpoint(args.checkpoint)
    else:
        model = load_bilm(args.options, args.weights)
    count = embed_file(
        args.input,
        args.output,
        model.to(device),
        layers=args.layers,
        batch_size=args.batch_size,
        stateful=args.stateful,
        dtype=args.dtype,
    )
    print(f"embedded {count} sentences into {args.output}", file=sys.stderr)
    return 0


COMMANDS: dict[str, Command] = {
    "embed": Command(
        "write every layer of a biLM for each sentence of a text file",
        _add_embed_arguments,
        _run_embed,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per command of ``COMMANDS``."""
    parser = argparse.ArgumentParser(
        prog="elmolab",
        description="elmolab's tools for bilm-tf (ELMo) models.",
        epilog="'elmolab COMMAND --help' lists the arguments of a command.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        command.add_arguments(
            subparsers.add_parser(name, help=command.help, description=command.help)
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``elmolab`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        with resource_errors_named(args.command, getattr(args, "output", ".")):
            return COMMANDS[args.command].run(args)
    except ElmolabError as error:
        print(f"elmolab {args.command}: error: {error}", file=sys.stderr)
        return 1
