"""The package's layers import one way, downwards (docs/architecture.md, "Package layers").

A module may import from its own layer and the layers below it; an import that runs up a layer
(e.g. ``elmolab.io`` importing ``elmolab.models``) fails here with the module and line.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Bottom to top; a package name covers its modules.
LAYERS = (
    # foundations: errors, files, configuration, run tracking
    (
        "elmolab.errors",
        "elmolab.fsutil",
        "elmolab.failpoints",
        "elmolab.hardware",
        "elmolab.openmp",
    ),
    ("elmolab.config", "elmolab.params", "elmolab.tracking"),
    # data formats: corpora, CoNLL, WSD, characters, vocabularies, feature files
    ("elmolab.text", "elmolab.io"),
    # the network, and its weight files
    ("elmolab.models",),
    # what is done with it: pretraining, features, probes
    ("elmolab.training", "elmolab.embed", "elmolab.elmo", "elmolab.probing"),
    # the stages and the command line
    (
        "elmolab.prepare",
        "elmolab.controls",
        "elmolab.extract",
        "elmolab.report",
        "elmolab.taskmodel",
        "elmolab.wandb_report",
        "elmolab.cli",
    ),
)


def layer_of(module: str) -> int:
    if module == "elmolab":  # the package itself, above every layer: it re-exports the public API
        return len(LAYERS)
    for number, members in enumerate(LAYERS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return number
    raise KeyError(f"{module} is in no layer: add it to LAYERS (and docs/architecture.md)")


def project_sources() -> dict[str, str]:
    """Module name -> source of every module of the package."""
    sources = {}
    for path in sorted((SRC / "elmolab").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[name] = path.read_text(encoding="utf-8")
    return sources


def upward_imports(sources: dict[str, str]) -> list[str]:
    """Every import of a module from a higher layer, as ``module:line imports target``."""
    found = []
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                if target.startswith("elmolab.") and layer_of(target) > layer_of(module):
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
