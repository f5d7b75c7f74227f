"""The report stage: collect every stage's results, test them, draw them, write them.

``collect`` reads and validates the inputs, ``stats`` aggregates over seeds and tests the scalar
mix against the best single layer, ``information`` the information measures (online code,
information beyond layer 0), ``polysemy`` finds nearest neighbours of polysemous words,
``figures``, ``tables`` and ``writers`` produce the files, and ``build`` ties them together.
"""

from elmolab.report.build import ReportConfig, ReportData, gather, write_report

__all__ = ["ReportConfig", "ReportData", "gather", "write_report"]
