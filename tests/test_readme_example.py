"""README's "ELMo in your own model" example runs as written and trains what it says it trains."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    """The first python block of README's "ELMo in your own model" section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    parts = re.split(r"^#+ ELMo in your own model\n", readme, maxsplit=1, flags=re.MULTILINE)
    assert len(parts) == 2, "README has no 'ELMo in your own model' heading"
    section = re.split(r"^#+ ", parts[1], maxsplit=1, flags=re.MULTILINE)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, "README's ELMo section has no python block"
    return blocks[0]


def test_readme_elmo_example_runs(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(readme_example(), "README.md", "exec"), namespace)
    elmo, loss = namespace["elmo"], namespace["loss"]
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert namespace["logits"].shape == (2, 4, 9)
    # The step moved the mix and not the frozen biLM.
    assert elmo.scalar_mix.w.grad is not None and elmo.scalar_mix.w.abs().sum() > 0
    assert all(p.grad is None for p in elmo.bilm.parameters())
