"""Compose ``conf/`` into ``params.yaml`` exactly as ``dvc exp run`` does, checked as it composes.

``dvc repro`` reads ``params.yaml`` without recomposing it, so the committed file must equal the
composition of ``conf/`` (a test checks it). ``make params`` rewrites it after editing ``conf/``.

Every composition of ``conf/`` is checked against the schema before anything is written or run
(:func:`elmolab.core.config.check_config`), wherever Hydra composes it: in DVC's process for
``dvc exp run -S key=value``, in ``make params``, in the stages' Hydra entry points. Hydra imports
the modules of the ``hydra_plugins`` package before it first composes; ours
(``hydra_plugins/elmolab_schema.py``) calls :func:`install_checks`. A composition that fails, or
that the check rejects, raises :class:`CompositionError`: one line naming ``conf/config.yaml``, the
overrides and the key.

``make run`` first checks that ``params.yaml`` is that composition (``--check``): one left by
``dvc exp run -S ...``, or edited by hand, would make ``dvc repro`` run its settings, or find their
results up to date, in the study's place.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from dvc.exceptions import DvcException
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.config_store import ConfigStore
from hydra.core.default_element import GroupDefault
from hydra.errors import ConfigCompositionException, HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from elmolab.core.config import check_config, load_params, setting_problem
from elmolab.core.errors import ElmolabError

# The defaults-list entry that asks for the check (conf/config.yaml: `- schema: elmolab`): an
# empty config, so selecting it adds nothing to the composition, and composing fails where the
# plugin that registers it is missing instead of going unchecked.
SCHEMA_GROUP, SCHEMA_OPTION = "schema", "elmolab"
# How many differing keys the check of params.yaml names before "and N more".
NAMED_KEYS = 3
_ABSENT = object()


class CompositionError(ElmolabError, ConfigCompositionException, DvcException):
    """A composition of ``conf/`` that failed, in one line. Each caller prints that line alone:
    Hydra's entry points as a CompactHydraException, DVC as a DvcException (not as an "unexpected
    error" with a plea to report it), ``make params`` as an ElmolabError."""


def compose_params(conf_dir: Path, overrides: list[str] | None = None) -> str:
    """The text of ``params.yaml`` composed from ``conf_dir`` with Hydra ``overrides``."""
    from dvc.utils.hydra import compose_and_dump

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "params.yaml"
        compose_and_dump(out, str(conf_dir.resolve()), None, "config", "", overrides or [])
        return out.read_text(encoding="utf-8")


def install_checks() -> None:
    """Register the ``schema: elmolab`` option with Hydra and check every composition whose
    primary config selects it. Hydra 1.3 has no hook after composition, so this wraps the step
    every composition goes through, ``ConfigLoaderImpl.load_configuration``; other configurations
    pass through it untouched. Idempotent: Hydra may execute the plugin module more than once."""
    ConfigStore.instance().store(
        group=SCHEMA_GROUP, name=SCHEMA_OPTION, node={}, package="_global_"
    )
    load = ConfigLoaderImpl.load_configuration
    if not getattr(load, "checks_schema", False):
        ConfigLoaderImpl.load_configuration = _checked(load)  # type: ignore[method-assign]


def _checked(load: Callable[..., DictConfig]) -> Callable[..., DictConfig]:
    @functools.wraps(load)
    def load_configuration(
        loader: ConfigLoaderImpl,
        config_name: str | None,
        overrides: list[str],
        *args: Any,
        **kw: Any,
    ) -> DictConfig:
        if not _selects_schema(loader, config_name):
            return load(loader, config_name, overrides, *args, **kw)
        where = _where(loader, config_name, overrides)
        try:
            cfg = load(loader, config_name, overrides, *args, **kw)
            check_config(cfg, where)
        except ElmolabError as err:
            raise CompositionError(err.problem, err.path) from None
        except (HydraException, OmegaConfBaseException) as err:
            raise CompositionError(_one_line(err), where) from None
        return cfg

    load_configuration.checks_schema = True  # type: ignore[attr-defined]
    return load_configuration


def _selects_schema(loader: ConfigLoaderImpl, config_name: str | None) -> bool:
    primary = loader.repository.load_config(config_name) if config_name else None
    return primary is not None and any(
        isinstance(entry, GroupDefault)
        and entry.group == SCHEMA_GROUP
        and entry.value == SCHEMA_OPTION
        for entry in primary.defaults_list or ()
    )


def _where(loader: ConfigLoaderImpl, config_name: str | None, overrides: Sequence[str]) -> str:
    """``conf/config.yaml with key=value ...``: the primary config (relative to the working
    directory where it lies below it) and the overrides of the configuration, not Hydra's own
    (``hydra.mode=RUN``, which Hydra adds)."""
    folder = next((s.path for s in loader.get_sources() if s.provider == "main"), "")
    if Path(folder).is_relative_to(Path.cwd()):
        folder = str(Path(folder).relative_to(Path.cwd()))
    primary = str(Path(folder) / f"{config_name}.yaml")
    ours = [o for o in overrides if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    return f"{primary} with {' '.join(ours)}" if ours else primary


def _one_line(err: HydraException | OmegaConfBaseException) -> str:
    """Hydra's error, several lines with OmegaConf's below it, as one line: the key and what is
    wrong with it where OmegaConf names a key, else Hydra's lines joined (up to the config search
    path, which Hydra lists after a missing config)."""
    cause = err if isinstance(err, OmegaConfBaseException) else err.__cause__
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        return f"{cause.full_key}: {setting_problem(cause)}"
    line = ""
    for part in filter(None, (part.strip() for part in str(err).splitlines())):
        if part.startswith("Config search path"):
            break
        line += part if not line else (" " if line.endswith(":") else "; ") + part
    return line


def differing_keys(written: Any, composed: Any, key: str = "") -> list[str]:
    """The dotted keys whose values differ between two parsed YAML documents, a key present in
    one of them only included: ``composed``'s keys in its order, then ``written``'s others. A
    list is one value."""
    if not (isinstance(written, dict) and isinstance(composed, dict)):
        return [] if written == composed else [key]
    names = [*composed, *(name for name in written if name not in composed)]
    return [
        differing
        for name in names
        for differing in differing_keys(
            written.get(name, _ABSENT),
            composed.get(name, _ABSENT),
            f"{key}.{name}" if key else str(name),
        )
    ]


def check_params(params: Path, conf_dir: Path, overrides: list[str] | None = None) -> None:
    """Raise an :class:`ElmolabError` of one line, naming the first differing keys and the fix,
    if the values of ``params`` differ from the composition of ``conf_dir`` with ``overrides``
    (comments and layout aside: the stages read the values)."""
    written = OmegaConf.to_container(load_params(params))
    composed = OmegaConf.to_container(OmegaConf.create(compose_params(conf_dir, overrides)))
    keys = differing_keys(written, composed)
    if not keys:
        return
    named = ", ".join(keys[:NAMED_KEYS])
    if len(keys) > NAMED_KEYS:
        named += f" and {len(keys) - NAMED_KEYS} more"
    composition = " ".join([f"{conf_dir}/", *(overrides or [])])
    raise ElmolabError(
        f"differs from the composition of {composition} in {named}: `make params` returns it to "
        f"{conf_dir}/'s composition (a DVC experiment's results stay in `dvc exp show`); "
        f"`make run EXPERIMENT=<preset>` runs a preset of {conf_dir}/experiment/",
        params,
    )


def exit_with_error(err: ElmolabError) -> NoReturn:
    """End the program as a stage ends on bad input: ``err`` as one line on stderr, status 2."""
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=smoke")
    parser.add_argument("--conf", default="conf", type=Path, help="config folder (conf)")
    parser.add_argument("--out", default="params.yaml", type=Path, help="output (params.yaml)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; fail with one line if --out differs from the composition",
    )
    args = parser.parse_args()
    from elmolab.core.fsutil import atomic_path

    try:
        if args.check:
            check_params(args.out, args.conf, args.overrides)
            return
        text = compose_params(args.conf, args.overrides)
    except ElmolabError as err:
        exit_with_error(err)
    with atomic_path(args.out) as tmp:
        tmp.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
