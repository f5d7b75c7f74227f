"""Failpoints: named places where a test can make this process die as if it had been killed.

With ``ELMOLAB_FAILPOINT="<name>:<n>"`` in the environment, the process sends itself SIGKILL the
n-th time (1-based; ``<name>`` alone means the first) execution reaches ``failpoint("<name>")``.
Unset, a failpoint costs one environment lookup. The fault-injection tests
(``tests/stages/test_pipeline_e2e.py``) kill stages at exact moments with them: mid-epoch, between a
checkpoint's temporary file and its rename, mid-validation, between two extracted splits.
"""

from __future__ import annotations

import collections
import os
import signal

ENV = "ELMOLAB_FAILPOINT"
_hits: collections.Counter[str] = collections.Counter()


def failpoint(name: str) -> None:
    """SIGKILL this process if ``ELMOLAB_FAILPOINT`` names this place and this hit."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    target, _, nth = spec.partition(":")
    if target != name:
        return
    _hits[name] += 1
    if _hits[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
