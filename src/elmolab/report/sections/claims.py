"""The claims: the ELMo paper's findings this study checks, one row each with its effect, 95%
interval, Holm-adjusted p over the claims and verdict (:mod:`elmolab.report.claims`), at the top
of the report, and its block of ``summary.json``."""

from __future__ import annotations

from typing import Any

from elmolab.report.claims import CLAIMS_FAMILY, Claim, claims
from elmolab.report.data import ReportData
from elmolab.report.format import NO_VERDICT, interval_text, p_text
from elmolab.report.layout import Table, TableCell, columns_of, number

CLAIMS_NOTE = (
    "Each claim's effect: a task's two-level test (runs and test sentences resampled), or the"
    " mean of its tasks' effects with their pooled standard error; p: two-sided, Holm-adjusted"
    " over the claims tested here; supported or contradicted where the adjusted p < {alpha}, by"
    " the effect's sign, else inconclusive with the smallest effect this run could have"
    " detected (power 0.8). The trained biLM is one pretraining run: the claims are about it,"
    " not about every biLM its recipe could train."
)
BADGES = {"supported": "good", "contradicted": "bad"}


def _badge(verdict: str) -> str:
    return BADGES.get(verdict.split(" ")[0], "neutral")


def _effect_text(claim: Claim) -> str:
    if claim.effect is None:
        return "–"
    return interval_text(claim.effect.effect, (claim.effect.low, claim.effect.high))


def table(data: ReportData) -> Table | None:
    found = claims(data)
    if not found:
        return None
    alpha = data.significance.alpha
    rows = []
    for claim in found:
        verdict = NO_VERDICT if data.no_verdicts else claim.verdict(alpha)
        rows.append(
            [
                TableCell(claim.text, bold=True, detail=claim.measure),
                number(_effect_text(claim), "" if claim.effect is None else claim.effect.method),
                number(p_text(claim.p_adjusted)),
                TableCell(verdict, badge=_badge(verdict)),
                TableCell(
                    claim.evidence
                    if data.no_verdicts or not claim.agreement
                    else f"{claim.evidence}; {claim.agreement}"
                ),
            ]
        )
    tested = sum(claim.p_adjusted is not None for claim in found)
    return Table(
        columns_of(
            ("claim", "what is measured"),
            ("effect", "[95% CI]"),
            ("p", f"Holm over {tested}"),
            "verdict",
            "evidence",
        ),
        rows,
        [False] * len(rows),
        note=CLAIMS_NOTE.format(alpha=alpha),
    )


def summary(data: ReportData) -> dict[str, Any]:
    alpha = data.significance.alpha
    return {
        "family": CLAIMS_FAMILY,
        "correction": "holm",
        "note": CLAIMS_NOTE.format(alpha=alpha),
        "claims": [
            {
                "claim": c.text,
                "measure": c.measure,
                "effect": None if c.effect is None else c.effect.effect,
                "low": None if c.effect is None else c.effect.low,
                "high": None if c.effect is None else c.effect.high,
                "p_unadjusted": None if c.effect is None else c.effect.p_value,
                "p_value": c.p_adjusted,
                "detectable": None if c.effect is None else c.effect.detectable,
                "verdict": c.verdict(alpha),
                "evidence": c.evidence,
                "agreement": c.agreement,
                "method": None if c.effect is None else c.effect.method,
            }
            for c in claims(data)
        ],
    }
