"""elmolab's Hydra plugin: every composition of ``conf/`` is checked against the schema
(:func:`elmolab.core.params.install_checks`).

Hydra imports each module of the ``hydra_plugins`` namespace package before it first composes, in
whichever process composes (DVC's for ``dvc exp run -S``); this one defines no plugin class, it
only installs the check.
"""

from elmolab.core.params import install_checks

install_checks()
