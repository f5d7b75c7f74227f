"""The report and DVC's plots drawn by a real browser with no network (headless Chromium).

Installs Debian's chromium when it is missing (skips if that fails). The screenshots are kept in
pytest's tmp folder (printed with -s) so one can look at them.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures.report.fake_artifacts import build_report, write_fake_artifacts
from PIL import Image

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
BUILT_TEMPLATE = ROOT / "build" / "dvc-plots.html"  # make vega-template
TRAINED_BLUE = (0x1F, 0x5F, 0xA8)  # elmolab.report.figures.ROLE_COLORS["main"]: the trained biLM
VERDICT_GREEN = (0xD8, 0xF0, 0xDC)  # the "mix better" badge of the headline table
LAYER1_GREEN = (0x1B, 0x9E, 0x77)  # figures.FAVOURED_COLORS["layer1"]: the layer panel's bars


@pytest.fixture(scope="module")
def chromium() -> Path:
    if not CHROMIUM.exists():
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        try:
            subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=900)
            subprocess.run(
                ["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env, timeout=1800
            )
        except (OSError, subprocess.SubprocessError) as err:
            pytest.skip(f"chromium is missing and `apt-get install -y chromium` failed: {err}")
    return CHROMIUM


def screenshot(chromium: Path, page: Path, png: Path, height: int) -> np.ndarray:
    """``page`` rendered at 1400 x ``height`` with every host name unresolvable: (y, x, rgb)."""
    subprocess.run(
        [
            str(chromium),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={png.parent / 'chromium-profile'}",
            "--virtual-time-budget=10000",  # let scripts (vega) finish before the shot
            f"--screenshot={png}",
            f"--window-size=1400,{height}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    print(f"screenshot: {png}")
    return np.asarray(Image.open(png).convert("RGB"))


def near(pixels: np.ndarray, rgb: tuple[int, int, int], tolerance: int = 6) -> int:
    """How many pixels are within ``tolerance`` of ``rgb`` in every channel."""
    return int((np.abs(pixels.astype(int) - rgb) <= tolerance).all(axis=-1).sum())


def non_white(pixels: np.ndarray) -> int:
    return int((pixels < 245).any(axis=-1).sum())


def distinct_colours(pixels: np.ndarray) -> int:
    return len(np.unique(pixels.reshape(-1, 3), axis=0))


def test_report_figures_are_drawn_and_the_main_result_is_above_the_fold(chromium, tmp_path):
    write_fake_artifacts(tmp_path)
    _, out = build_report(tmp_path)
    pixels = screenshot(chromium, out / "index.html", tmp_path / "report.png", 6000)
    first_screen = pixels[:900]
    assert near(first_screen, VERDICT_GREEN) > 300, "the headline table is not on the first screen"
    figures = pixels[900:]
    assert near(figures, TRAINED_BLUE) > 20_000, "no trained-encoder bars drawn"
    # the fake artifacts' chunk and deplabel are significantly better on layer 1: two wide bars
    assert near(figures, LAYER1_GREEN) > 5_000, "the layer panel's bars are not drawn"
    assert distinct_colours(figures) > 2_000, "the figure area looks blank"
    assert non_white(figures) > 300_000


def offline_template(tmp_path: Path) -> Path:
    if BUILT_TEMPLATE.is_file():
        return BUILT_TEMPLATE
    template = tmp_path / "dvc-plots.html"
    built = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "vega_template.py"), str(template)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if built.returncode != 0:
        pytest.skip(f"cannot build the offline vega template (npm): {built.stderr.strip()}")
    return template


def test_dvc_plots_render_offline_with_the_inlined_vega(chromium, tmp_path):
    write_fake_artifacts(tmp_path, model=False)
    _, report = build_report(tmp_path, polysemy=False)
    repo = tmp_path / "repo"
    shutil.copytree(report / "plots", repo / "artifacts" / "report" / "plots")
    (repo / "dvc.yaml").write_text(
        "plots:\n"
        "  - Validation perplexity:\n"
        "      template: linear\n"
        "      x: tokens\n"
        "      y:\n"
        "        artifacts/report/plots/validation_perplexity.csv: [val_ppl, val_ppl_fwd]\n"
        "  - artifacts/report/plots/probes/upos.csv:\n"
        "      template: bar_horizontal_sorted\n"
        "      x: mean\n"
        "      y: label\n",
        encoding="utf-8",
    )
    dvc = [sys.executable, "-m", "dvc"]
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=repo, check=True, env=env, timeout=300)
    template = str(offline_template(tmp_path))
    subprocess.run(  # as `make plots` runs it
        [*dvc, "plots", "show", "-o", "plots-html", "--html-template", template],
        cwd=repo,
        check=True,
        env=env,
        timeout=300,
    )
    page = repo / "plots-html" / "index.html"
    html = page.read_text(encoding="utf-8")
    assert "<script src=" not in html and "cdn.jsdelivr" not in html
    assert html.count("vegaEmbed(") == 2
    pixels = screenshot(chromium, page, tmp_path / "dvc-plots.png", 900)
    assert non_white(pixels) > 40_000, "vega drew nothing (blank page)"
    assert distinct_colours(pixels) > 200
