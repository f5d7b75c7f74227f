"""The report stage: collect every stage's results, test them, draw them, write them.

``collect`` reads and validates the inputs, ``stats`` aggregates over seeds and tests the scalar
mix against the best single layer, ``information`` the information measures (online code,
information beyond layer 0); the polysemy table is the polysemy stage's, read with
:mod:`elmolab.io.polysemy`. ``data`` holds all of it (the data model every renderer reads);
``sections`` has a module per section of the report (its rows, its table in the model of
``layout``, its text in the number formats of ``format``, its block of ``summary.json``);
``figures`` and ``writers`` render them, and ``build`` ties them together.
"""

from elmolab.core.schema import ReportConfig
from elmolab.report.build import gather, write_report
from elmolab.report.data import ReportData

__all__ = ["ReportConfig", "ReportData", "gather", "write_report"]
