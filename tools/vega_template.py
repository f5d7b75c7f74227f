"""Build an HTML template for ``dvc plots show`` that works offline: vega, vega-lite and
vega-embed inlined from their npm packages instead of loaded from a CDN.

dvc-render puts its CDN ``<script src=...>`` tags into the template's ``{scripts}`` placeholder;
this template has no such placeholder, so they are dropped and the inlined copies serve
instead. The versions are the ones dvc-render 1.0 loads from the CDN (its templates use
vega-lite 5.2 features), and each npm tarball is checked against its pinned SHA-512 integrity.

    .venv/bin/python tools/vega_template.py build/dvc-plots.html          # runs `npm pack`
    .venv/bin/python tools/vega_template.py OUT --tarballs DIR            # tarballs already here
    .venv/bin/python tools/vega_template.py OUT --cdn-fallback            # for `make install`

With ``--cdn-fallback`` a failure to get the packages (no npm, no registry) is a warning, and the
template written keeps dvc-render's CDN scripts: ``dvc plots show`` then works when online.

``make plots`` passes the file to DVC: ``dvc plots show --html-template build/dvc-plots.html``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import NamedTuple

from elmolab.core.errors import ElmolabError
from elmolab.core.fsutil import atomic_path


class NpmPackage(NamedTuple):
    name: str
    version: str
    script: str  # the browser build inside the tarball
    integrity: str  # the registry's "sha512-<base64>" of the tarball

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def tarball(self) -> str:
        return f"{self.name}-{self.version}.tgz"


PACKAGES = (
    NpmPackage(
        "vega",
        "5.20.2",
        "package/build/vega.min.js",
        "sha512-qmH7aD9GGPpssVdxL1xgcdxTbQzyRUeRR16Os385ymvQhiwCYQNA6+eXUPAZDTVLfk0RXu6Jzj6kUE5jQ80EVw==",
    ),
    NpmPackage(
        "vega-lite",
        "5.2.0",
        "package/build/vega-lite.min.js",
        "sha512-Yxcg8MvYfxHcG6BbkaKT0oVCIMIcE19UvqIsEwBmyd/7h2nzW7oRnID81T8UrY7hpDrIr6wa2JADOT2dhGNErw==",
    ),
    NpmPackage(
        "vega-embed",
        "6.18.2",
        "package/build/vega-embed.min.js",
        "sha512-wcDyQPE4J5aiCDc3/suH5RQDvrKkjuLkhzUcbOLwEkNF8/+pp17tS0JghzEvAPNRg+5aG1/N2ydixq8Lk3dOlg==",
    ),
)

PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
{{refresh_tag}}
<title>DVC Plot</title>
<!-- vega, vega-lite and vega-embed inlined (no network): built by tools/vega_template.py -->
{inlined}
<style>
  body {{ font-family: -apple-system, "Segoe UI", Roboto, Arial, sans-serif; margin: 16px; }}
  table {{ border-spacing: 15px; }}
</style>
</head>
<body>
{{plot_divs}}
</body>
</html>
"""


def fetch_tarballs(folder: Path) -> None:
    """``npm pack`` every package into ``folder`` (needs npm and the registry)."""
    command = ["npm", "pack", "--silent", "--pack-destination", str(folder)]
    try:
        done = subprocess.run(
            [*command, *(p.spec for p in PACKAGES)], capture_output=True, text=True, timeout=600
        )
    except (OSError, subprocess.SubprocessError) as err:
        raise ElmolabError(f"npm pack failed ({err}); pass --tarballs DIR instead") from None
    if done.returncode != 0:
        raise ElmolabError(f"npm pack failed: {done.stderr.strip()}; pass --tarballs DIR instead")


def read_script(package: NpmPackage, folder: Path) -> str:
    """The package's browser build, after checking the tarball's integrity."""
    path = folder / package.tarball
    if not path.is_file():
        raise ElmolabError(f"no {package.tarball} (npm pack {package.spec})", folder)
    digest = base64.b64encode(hashlib.sha512(path.read_bytes()).digest()).decode("ascii")
    if f"sha512-{digest}" != package.integrity:
        raise ElmolabError(f"integrity mismatch: expected {package.integrity}", path)
    with tarfile.open(path, "r:gz") as tar:
        member = tar.extractfile(package.script)
        if member is None:
            raise ElmolabError(f"no {package.script} in the tarball", path)
        return member.read().decode("utf-8")


def build_template(tarballs: Path) -> str:
    scripts = []
    for package in PACKAGES:
        # A literal "</script" inside inlined code would end the element early.
        code = read_script(package, tarballs).replace("</script", "<\\/script")
        scripts.append(f"<script>/* {package.spec} */\n{code}\n</script>")
    return PAGE.format(inlined="\n".join(scripts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the template to write, e.g. build/dvc-plots.html")
    parser.add_argument(
        "--tarballs", type=Path, help="folder with the npm tarballs (else npm pack)"
    )
    parser.add_argument(
        "--cdn-fallback",
        action="store_true",
        help="when the packages cannot be had, write a template that loads them from the CDN",
    )
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = args.tarballs
            if folder is None:
                folder = Path(tmp)
                fetch_tarballs(folder)
            page = build_template(folder)
    except ElmolabError as err:
        if not args.cdn_fallback:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"warning: {err}; {args.out} loads vega from a CDN instead", file=sys.stderr)
        page = PAGE.format(inlined="<!-- vega not inlined: dvc-render's CDN scripts -->\n{scripts}")
    with atomic_path(args.out) as out:
        out.write_text(page, encoding="utf-8")
    print(f"wrote {args.out} ({len(page) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
