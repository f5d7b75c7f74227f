"""The package's layers import one way, downwards (docs/architecture.md, "Package layers").

A module may import from its own layer and the layers below it; an import that runs up a layer
(e.g. ``elmolab.io`` importing ``elmolab.models``) fails here with the module and line.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Bottom to top; a package name covers its modules.
LAYERS = (
    # infrastructure (elmolab.core): errors, files, the hardware, the configuration, its schema
    # and composition, run tracking; the native kernels
    ("elmolab.core", "elmolab.native"),
    # data formats: corpora, characters, vocabularies, feature files, the labelled datasets (their
    # catalogue, formats, tasks and labels)
    ("elmolab.text", "elmolab.io", "elmolab.data"),
    # the network, and its weight files
    ("elmolab.models",),
    # what is done with it: pretraining, features, nearest neighbours, probes
    (
        "elmolab.training",
        "elmolab.embed",
        "elmolab.extraction",
        "elmolab.elmo",
        "elmolab.polysemy",
        "elmolab.probing",
    ),
    # the report and the task model: libraries the stages use
    ("elmolab.report", "elmolab.taskmodel"),
    # the stages (one module each), the command line, and what make runs around dvc repro
    ("elmolab.stages", "elmolab.cli", "elmolab.launch"),
)


# Inside ``elmolab.probing``, bottom to top: what every reference probe is reads nothing of the
# batched heads, the heads nothing of the kinds, the kinds nothing of the engine that trains them,
# the engine nothing of how a cell schedules and writes its jobs.
PROBING_LAYERS = (
    # data, metrics and settings, and a cell's data loaded
    (
        "elmolab.probing.settings",
        "elmolab.probing.datasets",
        "elmolab.probing.metrics",
        "elmolab.probing.trees",
        "elmolab.probing.wsd",
        "elmolab.probing.cell_data",
        "elmolab.probing.modes",
    ),
    ("elmolab.probing.probes",),  # the reference: what a probe is, and fit()
    ("elmolab.probing.heads",),  # the batched path's shared parts: many heads at once
    ("elmolab.probing.kinds",),  # one module per kind (reference and batched), their registry
    ("elmolab.probing.engine",),  # the batched heads' optimizer, loop and entry points
    ("elmolab.probing.jobs", "elmolab.probing.writing"),  # a cell's jobs and its result files
    ("elmolab.probing.runner",),  # one cell of the grid
)

# Inside ``elmolab.report``, bottom to top: the sections read the data model, never the renderers;
# a section module may read another (the headline's findings read the layer panel's).
SECTIONS = SRC / "elmolab" / "report" / "sections"
REPORT_LAYERS = (
    # reading the inputs, and the statistics over them
    (
        "elmolab.report.collect",
        "elmolab.report.stats",
        "elmolab.report.significance",
        "elmolab.report.information",
    ),
    ("elmolab.report.data",),  # the data model
    # numbers as text, the table model, the claims tested over the data
    ("elmolab.report.format", "elmolab.report.layout", "elmolab.report.claims"),
    # one module per section: its rows, its table, its block of summary.json
    tuple(
        f"elmolab.report.sections.{p.stem}" for p in SECTIONS.glob("*.py") if p.stem != "__init__"
    ),
    ("elmolab.report.sections",),  # all the sections: what the templates render, summary.json
    ("elmolab.report.figures", "elmolab.report.writers"),  # the renderings
    ("elmolab.report.build",),  # gather the inputs, write every file
    ("elmolab.report.wandb_report",),  # the W&B workspace of a finished run
)


def layer_of(
    module: str, layers: tuple[tuple[str, ...], ...] = LAYERS, package: str = "elmolab"
) -> int:
    if module == package:  # the package itself, above every layer: it re-exports the public API
        return len(layers)
    # The most specific name decides: a module of a package may sit above its package's others.
    matches = [
        (len(m), number)
        for number, members in enumerate(layers)
        for m in members
        if module == m or module.startswith(m + ".")
    ]
    if matches:
        return max(matches)[1]
    raise KeyError(f"{module} is in no layer: add it to LAYERS (and docs/architecture.md)")


def project_sources() -> dict[str, str]:
    """Module name -> source of every module of the package."""
    sources = {}
    for path in sorted((SRC / "elmolab").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[name] = path.read_text(encoding="utf-8")
    return sources


def upward_imports(
    sources: dict[str, str], layers: tuple[tuple[str, ...], ...] = LAYERS, within: str = "elmolab"
) -> list[str]:
    """Every import of a module from a higher layer, as ``module:line imports target``; only the
    modules and targets under ``within``."""
    found = []
    for module, source in sources.items():
        if not (module == within or module.startswith(within + ".")):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                if target.startswith(within + ".") and layer_of(target, layers, within) > layer_of(
                    module, layers, within
                ):
                    found.append(f"{module}:{node.lineno} imports {target}")
    return found


def test_imports_run_down_the_layers() -> None:
    sources = project_sources()
    assert {layer_of(module) for module in sources if module != "elmolab"}  # every one placed
    assert upward_imports(sources) == []


def test_an_upward_import_is_caught() -> None:
    sources = project_sources()
    sources["elmolab.io.features"] += "\n\ndef late():\n    from elmolab.models.bilm import BiLM\n"
    sources["elmolab.models.lstm"] += "\nimport elmolab.probing.engine\n"
    found = upward_imports(sources)
    assert len(found) == 2
    assert found[0].startswith("elmolab.io.features:") and "imports elmolab.models.bilm" in found[0]
    assert found[1].endswith("imports elmolab.probing.engine")


def test_the_probing_package_imports_down_its_own_layers() -> None:
    """The reference probes, the batched engine, the cell's jobs and result files, the cell: each
    imports only from those before it."""
    sources = {m: s for m, s in project_sources().items() if m.startswith("elmolab.probing")}
    assert {layer_of(module, PROBING_LAYERS, "elmolab.probing") for module in sources}
    assert upward_imports(sources, PROBING_LAYERS, "elmolab.probing") == []
    sources["elmolab.probing.probes"] += "\nfrom elmolab.probing.engine import train_heads\n"
    (found,) = upward_imports(sources, PROBING_LAYERS, "elmolab.probing")
    assert found.startswith("elmolab.probing.probes:") and found.endswith("elmolab.probing.engine")


def test_the_report_package_imports_down_its_own_layers() -> None:
    """The data model, the number formats and table model, the section modules, the sections
    together, the renderings, the build: each imports only from those before it."""
    sources = {m: s for m, s in project_sources().items() if m.startswith("elmolab.report")}
    assert {layer_of(module, REPORT_LAYERS, "elmolab.report") for module in sources}
    assert upward_imports(sources, REPORT_LAYERS, "elmolab.report") == []
    sources["elmolab.report.sections.headline"] += (
        "\nfrom elmolab.report.sections import Sections\n"
    )
    (found,) = upward_imports(sources, REPORT_LAYERS, "elmolab.report")
    assert found.startswith("elmolab.report.sections.headline:")
    assert found.endswith("imports elmolab.report.sections")
