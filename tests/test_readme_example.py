"""README's "ELMo in your own model" examples run as written: the tagger trains what it says it
trains, and ``elmolab embed`` writes the features it says it writes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import h5py
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def readme_blocks(language: str) -> list[str]:
    """The ``language`` blocks of README's "ELMo in your own model" section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    parts = re.split(r"^#+ ELMo in your own model\n", readme, maxsplit=1, flags=re.MULTILINE)
    assert len(parts) == 2, "README has no 'ELMo in your own model' heading"
    section = re.split(r"^#+ ", parts[1], maxsplit=1, flags=re.MULTILINE)[0]
    blocks = re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, f"README's ELMo section has no {language} block"
    return blocks


def test_readme_elmo_example_runs(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(readme_blocks("python")[0], "README.md", "exec"), namespace)
    elmo, loss = namespace["elmo"], namespace["loss"]
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert namespace["logits"].shape == (2, 4, 9)
    # The step moved the mix and not the frozen biLM.
    assert elmo.scalar_mix.w.grad is not None and elmo.scalar_mix.w.abs().sum() > 0
    assert all(p.grad is None for p in elmo.bilm.parameters())


def test_readme_embed_example_runs(data_dir: Path, tmp_path: Path) -> None:
    # a folder laid out as the repository (its data/ and .venv/), so the files land in tmp_path
    (tmp_path / "data").symlink_to(data_dir)
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (example,) = readme_blocks("bash")
    done = subprocess.run(
        ["bash", "-euc", example], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    with h5py.File(tmp_path / "features.hdf5", "r") as features:
        # the fixture's 2 LSTM layers + the token layer, 2 * its projection (16); 9 and 2 tokens
        assert features["0"].shape == (3, 9, 32) and features["1"].shape == (3, 2, 32)
        assert "sentence_to_index" in features
