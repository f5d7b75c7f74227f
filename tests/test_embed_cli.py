"""``elmolab embed`` and the embedding engine: bilm-tf's outputs through the command line, the
stateless fast path against plain file order, and one clear error line for every bad input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from elmolab.cli import COMMANDS, main
from elmolab.embed import embed_sentences
from elmolab.io.features import read_features
from elmolab.models.bilm import BiLM
from elmolab.models.bilm_tf import save_bilm_checkpoint
from elmolab.text.chars import char_ids_for_sentences


@pytest.fixture(scope="module")
def batch_order_lines(fixture_dir: Path) -> list[str]:
    """The 30 sentences in the reference batch order: line 3 * i + k is sentences[k][i]."""
    sentences = json.loads((fixture_dir / "sentences.json").read_text(encoding="utf-8"))
    return [sentences[k][i] for i in range(len(sentences[0])) for k in range(3)]


def model_args(fixture_dir: Path) -> list[str]:
    return [
        "--options",
        str(fixture_dir / "options.json"),
        "--weights",
        str(fixture_dir / "lm_weights.hdf5"),
    ]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_cli_stateful_run_reproduces_bilm_tf(
    fixture_dir: Path,
    batch_order_lines: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = write_lines(tmp_path / "in.txt", batch_order_lines)
    out = tmp_path / "out.hdf5"
    argv = [
        "embed",
        str(text),
        str(out),
        *model_args(fixture_dir),
        "--batch-size",
        "3",
        "--stateful",
    ]
    assert main(argv) == 0
    assert "embedded 30 sentences" in capsys.readouterr().err
    layers = read_features(out, n_units=[len(line.split()) for line in batch_order_lines])
    assert all(a.shape[0] == 3 and a.shape[2] == 32 for a in layers)
    for k in (0, 1):
        with h5py.File(fixture_dir / f"lm_embeddings_{k}.hdf5", "r") as expected:
            for i in range(10):
                top = layers[3 * i + k][-1]  # (tokens, 2 * proj)
                got = np.stack([top[:, :16], top[:, 16:]])
                np.testing.assert_allclose(got, expected[str(i)][...], rtol=0, atol=1e-6)
    with h5py.File(out, "r") as f:
        index = json.loads(f["sentence_to_index"][0])
    assert index[batch_order_lines[4]] == "4"


@pytest.mark.parametrize("layers", ["top", "average"])
def test_cli_single_layer_outputs(
    fixture_dir: Path, batch_order_lines: list[str], tmp_path: Path, layers: str
) -> None:
    text = write_lines(tmp_path / "in.txt", batch_order_lines[:5])
    assert main(["embed", str(text), str(tmp_path / "all.hdf5"), *model_args(fixture_dir)]) == 0
    argv = [
        "embed",
        str(text),
        str(tmp_path / "one.hdf5"),
        *model_args(fixture_dir),
        "--layers",
        layers,
    ]
    assert main(argv) == 0
    for everything, one in zip(
        read_features(tmp_path / "all.hdf5"), read_features(tmp_path / "one.hdf5"), strict=True
    ):
        want = everything[-1] if layers == "top" else everything.mean(axis=0)
        np.testing.assert_allclose(one, want, rtol=0, atol=1e-7)


def test_stateless_fast_path_equals_file_order(model: BiLM, batch_order_lines: list[str]) -> None:
    sentences = [line.split() for line in batch_order_lines]
    with torch.no_grad():
        file_order = []
        for start in range(0, len(sentences), 4):
            batch = sentences[start : start + 4]
            layers = model(
                char_ids_for_sentences(batch, add_sentence_marks=False)
            ).layers  # (batch, 3, time, 32)
            file_order += [layers[r, :, : len(s)] for r, s in enumerate(batch)]
    for batch_size in (7, 64):
        fast = dict(embed_sentences(model, sentences, batch_size=batch_size))
        assert sorted(fast) == list(range(len(sentences)))
        for i, want in enumerate(file_order):
            torch.testing.assert_close(fast[i], want, rtol=0, atol=1e-5)
    assert model.stateful is False


def test_stateful_rows_keep_their_state_at_their_last_token(model: BiLM) -> None:
    """A row shorter than its batch carries the state of its own last token, not of padding."""
    short, long, other = (
        ["A", "short", "one", "."],
        ["A", "much", "longer", "row", "of", "words", "!"],
        ["Hi"],
    )
    after = [["Next", "sentence", "here", "."], ["And", "another", "one", "."]]

    def second_batch(first: list[list[str]]) -> torch.Tensor:
        outputs = dict(embed_sentences(model, [*first, *after], batch_size=2, stateful=True))
        return outputs[3]  # row 1 of the second batch, which continues `short`

    torch.testing.assert_close(
        second_batch([long, short]), second_batch([other, short]), rtol=0, atol=1e-6
    )


def test_cli_checkpoint_gives_the_same_features(
    fixture_dir: Path, model: BiLM, batch_order_lines: list[str], tmp_path: Path
) -> None:
    save_bilm_checkpoint(model, tmp_path / "model.pt")
    text = write_lines(tmp_path / "in.txt", batch_order_lines[:6])
    assert main(["embed", str(text), str(tmp_path / "a.hdf5"), *model_args(fixture_dir)]) == 0
    assert (
        main(
            [
                "embed",
                str(text),
                str(tmp_path / "b.hdf5"),
                "--checkpoint",
                str(tmp_path / "model.pt"),
            ]
        )
        == 0
    )
    for a, b in zip(
        read_features(tmp_path / "a.hdf5"), read_features(tmp_path / "b.hdf5"), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def edited_copy(source: Path, target: Path, edit) -> Path:
    shutil.copy(source, target)
    if target.suffix == ".json":
        options = json.loads(target.read_text(encoding="utf-8"))
        edit(options)
        target.write_text(json.dumps(options), encoding="utf-8")
    else:
        with h5py.File(target, "r+") as f:
            edit(f)
    return target


def bad_input_cases(tmp: Path, fixture_dir: Path) -> dict[str, tuple[list[str], Path, str]]:
    """name: (arguments after the output path, the file the message must name, text in it)."""
    good = write_lines(tmp / "good.txt", ["The cat sat .", "It purred ."])
    options, weights = fixture_dir / "options.json", fixture_dir / "lm_weights.hdf5"
    empty = write_lines(tmp / "empty_line.txt", ["The cat sat .", "   ", "It purred ."])
    bad_utf8 = tmp / "latin1.txt"
    bad_utf8.write_bytes("ok .\nfine .\ncaf\xe9 au lait .\n".encode("latin-1"))
    no_proj = edited_copy(weights, tmp / "no_proj.hdf5", lambda f: f.__delitem__("CNN_proj/W_proj"))
    renamed = edited_copy(
        weights, tmp / "renamed.hdf5", lambda f: f.move("CNN/W_cnn_2", "CNN/W_cnn2")
    )
    narrow = edited_copy(
        options, tmp / "proj32.json", lambda o: o["lstm"].update(projection_dim=32)
    )
    no_key = edited_copy(options, tmp / "no_clip.json", lambda o: o["lstm"].pop("cell_clip"))
    model_files = ["--options", str(options), "--weights", str(weights)]
    return {
        "empty line": ([str(empty), *model_files], empty, ":2: empty line"),
        "not UTF-8": ([str(bad_utf8), *model_files], bad_utf8, ":3: not valid UTF-8"),
        "missing input": (
            [str(tmp / "absent.txt"), *model_files],
            tmp / "absent.txt",
            "no such input file",
        ),
        "missing dataset": (
            [str(good), "--options", str(options), "--weights", str(no_proj)],
            no_proj,
            "missing dataset 'CNN_proj/W_proj'",
        ),
        "misnamed dataset": (
            [str(good), "--options", str(options), "--weights", str(renamed)],
            renamed,
            "missing dataset 'CNN/W_cnn_2' (the file has 'CNN/W_cnn2')",
        ),
        "shape mismatch": (
            [str(good), "--options", str(narrow), "--weights", str(weights)],
            weights,
            "dataset 'CNN_proj/W_proj' has shape (124, 16), "
            f"{narrow} imply (124, 32) (from 'lstm.projection_dim' 32)",
        ),
        "missing option key": (
            [str(good), "--options", str(no_key), "--weights", str(weights)],
            no_key,
            "missing key 'lstm.cell_clip'",
        ),
        "missing weights": (
            [str(good), "--options", str(options), "--weights", str(tmp / "absent.hdf5")],
            tmp / "absent.hdf5",
            "no such weights file",
        ),
    }


CASES = [
    "empty line",
    "not UTF-8",
    "missing input",
    "missing dataset",
    "misnamed dataset",
    "shape mismatch",
    "missing option key",
    "missing weights",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gives_one_line_naming_the_file_and_no_output(
    fixture_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    arguments, named, text = bad_input_cases(inputs, fixture_dir)[case]
    out_dir = tmp_path / "out"
    status = main(["embed", arguments[0], str(out_dir / "features.hdf5"), *arguments[1:]])
    err = capsys.readouterr().err
    assert status == 1
    assert err.count("\n") == 1 and err.startswith("elmolab embed: error: "), err
    assert str(named) in err and text in err, err
    assert not out_dir.exists() or list(out_dir.iterdir()) == []  # no output, no temp file


def test_console_script_exits_without_traceback(fixture_dir: Path, tmp_path: Path) -> None:
    empty = write_lines(tmp_path / "in.txt", ["One .", ""])
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from elmolab.cli import main; sys.exit(main())",
            "embed",
            str(empty),
            str(tmp_path / "out.hdf5"),
            *model_args(fixture_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert (
        done.stderr
        == f"elmolab embed: error: {empty}:2: empty line: every line must hold one sentence\n"
    )
    assert not (tmp_path / "out.hdf5").exists()


def test_help_is_plain_text_and_shows_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], *([name, "--help"] for name in COMMANDS)):
        with pytest.raises(SystemExit):
            main(argv)
        assert "``" not in capsys.readouterr().out, argv
    for name, command in COMMANDS.items():
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        text = " ".join(parser.format_help().split())  # argparse wraps lines by the terminal
        for action in parser._actions:
            # a flag's False and an absent value (None) are no defaults to show; 0 would be one
            if action.default is None or action.default is False:
                continue
            if action.default != argparse.SUPPRESS:
                assert f"(default: {action.default})" in text, (name, action.dest)
