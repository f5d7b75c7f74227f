"""How a stage gets its configuration, and how bad configuration is reported.

There is one composition path, Hydra's, and a stage runs in one of two ways with ``conf/`` behind
both:

- under DVC, ``python pipelines/<stage>.py --params params.yaml [key=value ...]``: the config is
  ``params.yaml`` (which DVC composed from ``conf/``) with the overrides of a matrix cell applied
  as ``dvc exp run -S key=value`` applies them (Hydra's override grammar, onto keys that exist):
  ``task=upos`` names the probe stage's task (a key of ``grid.tasks``),
  ``extract.dataset=conll2003`` the extract stage's dataset. A config group cannot be chosen on a
  composed file: compose another
  (``python -m elmolab.core.params experiment=smoke --out other.yaml``) or run the stage ad hoc.
- ad hoc or as a sweep, ``python pipelines/<stage>.py [-m] key=value ...``: Hydra composes
  ``conf/`` itself, and the stage writes into Hydra's run folder instead of ``artifacts/``.
- under DVC for a bilm-tf model from elsewhere (``extract.external.<name>``, e.g. a published
  ELMo), ``--external <name>`` after the params file: the same config, rewritten by
  :func:`external_study` into that model's own study, which reads and writes
  ``artifacts/external/<name>/`` only and needs no pretraining.

Composition checks every section against its schema (:mod:`elmolab.core.schema`, through
:func:`check_config`) before anything is written or run, wherever it composes (``dvc exp run -S``,
``make params``, the ad-hoc entry points: ``hydra_plugins/elmolab_schema.py``); each stage checks
its own sections again (:func:`section`), since ``params.yaml`` may have been edited by hand. A
misspelled key or a value of the wrong type fails with one line naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import (
    BooleanNode,
    DictConfig,
    FloatNode,
    IntegerNode,
    ListConfig,
    OmegaConf,
    StringNode,
    flag_override,
)
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from elmolab.core.errors import ElmolabError, resource_errors_named
from elmolab.core.schema import (
    SECTIONS,
    ControlsConfig,
    ExtractConfig,
    FeaturesConfig,
    PathsConfig,
)

T = TypeVar("T")
StageFn = Callable[[DictConfig, Path], Any]


def load_params(path: str | os.PathLike[str]) -> DictConfig:
    """``params.yaml`` as it stands; an :class:`ElmolabError` names a missing or broken file."""
    path = Path(path)
    if not path.is_file():
        raise ElmolabError("no such params file (run `dvc exp run` or `make params`)", path)
    try:
        cfg = OmegaConf.load(path)
    except yaml.MarkedYAMLError as err:  # its str() spans lines; the message must fit on one
        mark = err.problem_mark or err.context_mark
        problem = err.problem or err.context
        line = None if mark is None else mark.line + 1
        column = "" if mark is None else f" (column {mark.column + 1})"
        raise ElmolabError(f"not valid YAML: {problem}{column}", path, line) from err
    except Exception as err:
        raise ElmolabError(f"not valid YAML: {err}", path) from err
    if not isinstance(cfg, DictConfig):
        raise ElmolabError("expected a mapping at the top level", path)
    return cfg


EXTERNAL_DIR = "external"  # <paths.artifacts>/external/<name>/: an external encoder's study


def external_study(cfg: DictConfig, name: str) -> DictConfig:
    """``cfg`` for the study of ``extract.external.<name>`` alone: its features, probes and report
    under ``<paths.artifacts>/external/<name>/`` (``features/<name>/<dataset>/``,
    ``probes/<task>/``, ``report/``), every stage reading that folder only. Nothing of the
    pretrain stages is read: the report finds no pretrained biLM there and says so."""
    external = OmegaConf.select(cfg, "extract.external", default=None) or {}
    if name not in external:
        raise ElmolabError(
            f"--external {name}: no extract.external.{name} in the config"
            f" (external encoders: {', '.join(external) or 'none'})"
        )
    root = f"{cfg.paths.artifacts}/{EXTERNAL_DIR}/{name}"
    study = {
        "paths": {"artifacts": root},
        "extract": {"encoder": name},
        "probe": {"features_dir": f"{root}/features", "encoders": [name]},
        "report": {
            "inputs": {
                "bilm": f"{root}/bilm",
                "bilm_random": f"{root}/bilm_random",
                "probes": f"{root}/probes",
                "polysemy": f"{root}/polysemy",  # none: an external study has no polysemy stage
                "taskmodel": f"{root}/taskmodel",  # none: an external study has no task model
                "sources": [],
            }
        },
    }
    merged = OmegaConf.merge(cfg, study)
    assert isinstance(merged, DictConfig)
    return merged


# What the running stage's config came from, for error messages: the params file, or conf/.
_config_source = "params.yaml"


def section(cfg: DictConfig, key: str, schema: type[T], where: str | None = None) -> T:
    """The config section ``key`` as an instance of the dataclass ``schema``.

    Unknown keys, missing keys and values of the wrong type are errors naming ``where`` (by default
    the file the running stage's config came from) and the offending key. Nested dataclasses and
    dicts of them are validated the same way.
    """
    where = where or _config_source
    node = OmegaConf.select(cfg, key)
    if node is None:
        raise ElmolabError(f"no section {key!r} in the config", where)
    try:
        if isinstance(node, DictConfig):  # resolve ${...} against the whole config first
            node = OmegaConf.to_container(node, resolve=True)
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        full_key = f"{key}.{err.full_key}" if getattr(err, "full_key", None) else key
        raise ElmolabError(f"{full_key}: {setting_problem(err)}", where) from err


def feature_modes(conf_dir: Path, names: Sequence[str]) -> list[str]:
    """The feature mode of each ``conf/features/<name>.yaml`` of ``names`` (``grid.features``);
    an ElmolabError names a missing file and the choices."""
    modes = []
    for name in names:
        path = Path(conf_dir) / "features" / f"{name}.yaml"
        if not path.is_file():
            choices = sorted(p.stem for p in path.parent.glob("*.yaml"))
            raise ElmolabError(f"grid.features: no {path} (choices: {', '.join(choices)})")
        modes.append(section(OmegaConf.load(path), "", FeaturesConfig, where=str(path)).mode)
    return modes


def check_config(cfg: DictConfig, where: str) -> None:
    """Check a composed config as the stages will read it: every top-level key is a section of
    :data:`~elmolab.core.schema.SECTIONS` and none is missing, each section passes
    :func:`section` and its own ``check()`` where it has one, each plain value has its type. The
    first problem is an :class:`ElmolabError` naming ``where`` and the key."""
    for key in cfg:
        if key != "hydra" and key not in SECTIONS:  # Hydra's own node, there while it composes
            raise ElmolabError(f"{key}: not a section of the configuration", where)
    for key, schema in SECTIONS.items():
        if key not in cfg:
            raise ElmolabError(f"{key}: missing", where)
        if not dataclasses.is_dataclass(schema):
            value = cfg[key]
            if type(value) is not schema:  # type(): True is an int to isinstance
                raise ElmolabError(f"{key}: expected {_KINDS[schema]}, got {value!r}", where)
            continue
        settings = section(cfg, key, schema, where)
        if hasattr(settings, "check"):
            try:
                settings.check()
            except ElmolabError as err:
                raise ElmolabError(err.problem, where) from err
    # across sections: the controls' instances are encoders, in the folders their stages write
    extract = section(cfg, "extract", ExtractConfig, where)
    try:
        section(cfg, "controls", ControlsConfig, where).check_encoders(
            extract.encoders, section(cfg, "paths", PathsConfig, where).artifacts
        )
    except ElmolabError as err:
        raise ElmolabError(err.problem, where) from err


# A value of each plain type in words, and of each of OmegaConf's typed nodes.
_KINDS: dict[type, str] = {
    int: "an integer",
    float: "a float",
    bool: "true or false",
    str: "a string",
}
_NODE_KINDS: dict[type, str] = {
    IntegerNode: _KINDS[int],
    FloatNode: _KINDS[float],
    BooleanNode: _KINDS[bool],
    StringNode: _KINDS[str],
    ListConfig: "a list",
    DictConfig: "a mapping",
}


def setting_problem(err: OmegaConfBaseException) -> str:
    """What OmegaConf found wrong with one setting, in a few words (its key aside): what was
    expected and what came, where OmegaConf says; else its own first line."""
    if isinstance(err, MissingMandatoryValue):
        return "missing (no value given)"
    if isinstance(err, ConfigKeyError | ConfigAttributeError):
        return "unknown key (elmolab/core/schema.py has no such setting)"
    node = getattr(err, "child_node", None)
    kind = next((words for cls, words in _NODE_KINDS.items() if isinstance(node, cls)), None)
    if isinstance(err, ValidationError) and kind is not None:
        return f"expected {kind}, got {err.value!r}"
    return str(err).splitlines()[0]


def apply_overrides(cfg: DictConfig, overrides: list[str], where: str | os.PathLike[str]) -> None:
    """Apply Hydra ``overrides`` (``key=value``, ``+key=value``, ``~key``) to ``cfg`` in place, as
    ``dvc exp run -S`` applies them to ``params.yaml``: a value override needs an existing key.
    An :class:`ElmolabError` names ``where`` and the override."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException, OverrideParseException

    for line in overrides:
        try:
            parsed = OverridesParser.create().parse_overrides([line])
            override = parsed[0]
            if not (override.is_add() or override.is_force_add() or override.is_delete()):
                key = override.key_or_group
                node = OmegaConf.select(cfg, key, default=_MISSING)
                if node is _MISSING:
                    raise ElmolabError(f"override {line!r}: no key {key!r} in the config", where)
                if isinstance(node, DictConfig) and isinstance(override.value(), str):
                    raise ElmolabError(
                        f"override {line!r}: {key!r} is a section, composed into this file; to"
                        f" choose a config group, compose another file"
                        f" (python -m elmolab.core.params {line} --out FILE) or run the stage"
                        " ad hoc",
                        where,
                    )
            with flag_override(cfg, "struct", True):
                ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
        except (ConfigCompositionException, OverrideParseException) as err:
            cause = err.__cause__
            reason = str(cause if isinstance(cause, OmegaConfBaseException) else err)
            raise ElmolabError(f"override {line!r}: {reason.splitlines()[0]}", where) from err


_MISSING = object()


def take_option(argv: list[str], flag: str) -> tuple[str | None, list[str]]:
    """The value after ``flag`` in ``argv`` (None without ``flag``; "" where it ends ``argv``) and
    ``argv`` without the two: a stage's own option, such as the control instance it writes."""
    if flag not in argv:
        return None, argv
    at = argv.index(flag)
    return (argv[at + 1] if at + 1 < len(argv) else ""), argv[:at] + argv[at + 2 :]


def run_stage(fn: StageFn, stage: str, conf_dir: Path, argv: list[str] | None = None) -> None:
    """Entry point of a stage (``elmolab.stages.<stage>.main``): load the config, run
    ``fn(cfg, out_dir)``.

    Under DVC (``--params FILE [--external NAME] [key=value ...]``) the output folder is
    ``<paths.artifacts>/<stage>``; otherwise it is the Hydra run (or multirun job) folder. An
    :class:`ElmolabError` becomes one line on stderr and exit status 2 (set ``ELMOLAB_DEBUG=1``
    for the traceback), and so does a full disk or exhausted memory (:func:`_run_guarded`): the
    line names the stage, the file and the free space, or how much memory was asked for.
    """
    argv = sys.argv[1:] if argv is None else argv
    _configure_logging()
    if argv[:1] == ["--params"]:
        global _config_source
        try:
            if len(argv) < 2 or argv[1].startswith("--"):
                raise ElmolabError("--params needs a file (params.yaml)")
            _config_source = argv[1]
            overrides, external = argv[2:], None
            if overrides[:1] == ["--external"]:
                if len(overrides) < 2 or "=" in overrides[1]:
                    raise ElmolabError("--external needs the name of one of extract.external")
                overrides, external = overrides[2:], overrides[1]
            cfg = load_params(argv[1])
            apply_overrides(cfg, overrides, argv[1])
            if external is not None:
                cfg = external_study(cfg, external)
            out_dir = Path(cfg.paths.artifacts) / stage
            _run_guarded(fn, cfg, out_dir)
        except ElmolabError as err:
            _fail(err)
        return

    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(config_path=str(conf_dir.resolve()), config_name="config", version_base="1.3")
    def _hydra_main(cfg: DictConfig) -> Any:
        global _config_source
        _config_source = f"{conf_dir}/config.yaml (with overrides)"
        try:
            return _run_guarded(fn, cfg, Path(HydraConfig.get().runtime.output_dir) / stage)
        except ElmolabError as err:
            _fail(err)

    sys.argv = [sys.argv[0], *argv]
    _hydra_main()


def _run_guarded(fn: StageFn, cfg: DictConfig, out_dir: Path) -> Any:
    """``fn(cfg, out_dir)``, with a full disk or exhausted memory turned into one ElmolabError
    (see :func:`elmolab.core.errors.resource_error`) that names the stage: the script's name."""
    script = Path(sys.argv[0])
    name = script.stem if script.suffix == ".py" else out_dir.name
    with resource_errors_named(name, out_dir):
        return fn(cfg, out_dir)


def _fail(err: ElmolabError) -> None:
    if os.environ.get("ELMOLAB_DEBUG"):
        raise err
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)


def _configure_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
