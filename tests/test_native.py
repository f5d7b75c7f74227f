"""elmolab's C++ kernels: the build and its cache, and the dropout kernel's mask (the other
kernels are tested beside the Python code they replace: tests/models, tests/training)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from elmolab import native


@pytest.fixture(autouse=True)
def _kernels() -> None:
    if not native.native_kernels().available:
        pytest.skip("elmolab's C++ kernels are not built here (no compiler)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_keeps_1_minus_p_scales_and_reuses_its_mask_for_the_gradient(dtype) -> None:
    torch.manual_seed(0)
    x = (torch.rand(1001, 999) + 0.5).to(dtype).requires_grad_()  # an odd count: a lone last
    y = native.dropout(x, 0.1)
    kept = y != 0
    assert y.dtype == dtype and y.shape == x.shape
    assert abs(kept.float().mean().item() - 0.9) < 0.002  # 1M draws: 6 standard deviations
    torch.testing.assert_close(y[kept], (x[kept].float() / 0.9).to(dtype))
    (y.float() * 3.0).sum().backward()
    assert torch.equal(x.grad != 0, kept)  # the same mask
    torch.testing.assert_close(
        x.grad[kept], torch.full_like(x.grad[kept], 3.0).float().div(0.9).to(dtype)
    )


def test_dropout_repeats_under_a_seed_and_differs_between_calls() -> None:
    x = torch.ones(64, 64)
    torch.manual_seed(1)
    first, second = native.dropout(x, 0.5), native.dropout(x, 0.5)
    torch.manual_seed(1)
    assert torch.equal(native.dropout(x, 0.5), first)
    assert not torch.equal(first, second)
    # neighbouring elements are not correlated (two draws come from one 64-bit hash)
    kept = (first != 0).flatten().float()
    assert abs(torch.corrcoef(torch.stack([kept[:-1], kept[1:]]))[0, 1].item()) < 0.05


def test_without_the_kernels_dropout_is_torchs() -> None:
    x = torch.ones(50, 50)
    with native.turned_off():
        torch.manual_seed(2)
        got = native.dropout(x, 0.3)
    torch.manual_seed(2)
    assert torch.equal(got, torch.nn.functional.dropout(x, 0.3, training=True))


NOTICE = "building the C++ kernels for this machine"


def test_a_build_says_so_in_the_log_where_logging_shows_it_and_names_the_failing_source(
    tmp_path, monkeypatch, caplog, capsys
) -> None:
    compiler = tmp_path / "c++"  # answers --version like a compiler, fails every compile
    compiler.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo "c++ 0.1" && exit 0\n'
        'echo "error: cannot compile" >&2\nexit 1\n',
        encoding="utf-8",
    )
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("ELMOLAB_CACHE_DIR", str(tmp_path / "cache"))
    caplog.set_level(logging.INFO, logger="elmolab.native")
    native._load.cache_clear()
    try:
        kernels = native.native_kernels()
    finally:
        native._load.cache_clear()
    assert not kernels.available
    assert kernels.detail.startswith(f"building the kernels (lstm_paired.cpp) with {compiler}")
    assert kernels.detail.endswith("error: cannot compile")
    notices = [r.getMessage() for r in caplog.records if NOTICE in r.getMessage()]
    assert len(notices) == 1 and str(tmp_path / "cache" / "native") in notices[0]
    assert NOTICE not in capsys.readouterr().err  # in the log, not printed besides


ELMO_SCRIPT = """
import sys
from elmolab import Elmo, batch_to_ids
from elmolab.native import native_kernels

folder = sys.argv[1]
elmo = Elmo(f"{folder}/options.json", f"{folder}/lm_weights.hdf5", num_output_representations=1)
elmo(batch_to_ids([["a", "plain", "script"]]))
print(native_kernels().available)
"""


@pytest.mark.slow
def test_a_plain_script_is_told_of_the_first_build_once_and_of_a_cached_one_never(
    tmp_path, fixture_dir
) -> None:
    """A script that calls ``Elmo`` without configuring logging: the first build in an empty
    cache (a real one, the sources compiled in parallel) says so on stderr, once; the next
    process finds the library cached and says nothing."""
    env = {**os.environ, "ELMOLAB_CACHE_DIR": str(tmp_path)}

    def run() -> subprocess.CompletedProcess:
        command = [sys.executable, "-c", ELMO_SCRIPT, str(fixture_dir)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0 and done.stdout == "True\n", done.stderr
        return done

    first = run().stderr
    assert first.count(NOTICE) == 1, first
    assert f"the library is cached in {tmp_path / 'native'}" in first
    assert list(tmp_path.glob("native/*/elmolab_kernels.so"))
    assert NOTICE not in run().stderr
