"""The claims: the pooled effect of several tasks by hand, the verdicts, and the claims of a
report's data adjusted over the claims (Holm); the families' correction of the comparisons."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from fixtures.report.fake_artifacts import FAMILIES, report_data, write_probe_runs
from scipy import stats
from statsmodels.stats.multitest import multipletests

from elmolab.report.claims import Claim, claims, pooled
from elmolab.report.collect import read_probe_runs
from elmolab.report.significance import Effect
from elmolab.report.stats import correct


def _effect(effect: float, se: float, df: float) -> Effect:
    half = stats.t.ppf(0.975, df) * se
    p = 2 * stats.t.sf(abs(effect) / se, df)
    return Effect(effect, effect - half, effect + half, p, se, 0.0, df, 5, 5, 100, "m")


def test_pooled_tasks_are_the_mean_with_the_summed_variance_by_hand() -> None:
    a, b = _effect(0.02, 0.005, 4.0), _effect(-0.01, 0.010, 30.0)
    got = pooled([a, b], [1.0, -1.0])  # (2 - (-1)) / 2 = 1.5 points
    variance = (100 * 0.005 / 2) ** 2 + (100 * 0.010 / 2) ** 2
    df = variance**2 / ((100 * 0.005 / 2) ** 4 / 4.0 + (100 * 0.010 / 2) ** 4 / 30.0)
    assert got.effect == pytest.approx(1.5)
    assert got.standard_error == pytest.approx(math.sqrt(variance))
    assert got.df == pytest.approx(df)
    half = stats.t.ppf(0.975, df) * math.sqrt(variance)
    assert (got.low, got.high) == pytest.approx((1.5 - half, 1.5 + half))
    assert got.p_value == pytest.approx(2 * stats.t.sf(1.5 / math.sqrt(variance), df))


def test_verdicts_follow_the_adjusted_p_and_the_sign() -> None:
    up, down = _effect(1.0, 0.2, 10), _effect(-1.0, 0.2, 10)
    weak = Effect(0.1, -0.3, 0.5, 0.6, 0.2, 0.57, 10, 5, 5, 100, "m")
    assert Claim("c", "m", "higher", up, "", 0.01).verdict() == "supported"
    assert Claim("c", "m", "higher", down, "", 0.01).verdict() == "contradicted"
    assert Claim("c", "m", "higher", up, "", 0.2).verdict() == (
        "inconclusive (smallest detectable effect 0.00)"
    )
    assert Claim("c", "m", "at least", weak, "", 0.6).verdict() == (
        "inconclusive (smallest detectable effect 0.57); losses beyond 0.30 excluded"
    )
    assert Claim("c", "m", "higher", None, "").verdict() == "not testable"


def test_the_claims_of_a_report_are_adjusted_over_the_claims(tmp_path) -> None:
    write_probe_runs(tmp_path, encoders=("trained", "random"))
    data = report_data(read_probe_runs(tmp_path), families=FAMILIES)
    found = claims(data)
    texts = [c.text for c in found]
    assert texts[:2] == [
        "layer 1 holds more syntax than layer 2",
        "layer 2 holds more word sense and semantics than layer 1",
    ]
    assert "the trained biLM beats the random init control" in texts
    raw = [c.effect.p_value for c in found if c.effect is not None]
    adjusted = [c.p_adjusted for c in found if c.effect is not None]
    assert adjusted == pytest.approx(list(multipletests(raw, method="holm")[1]))
    syntax = found[0]
    gaps = [
        g
        for g in data.layer_gaps
        if g.encoder == "trained" and FAMILIES[g.task] == "syntactic" and g.effect is not None
    ]
    assert syntax.effect.effect == pytest.approx(-100 * np.mean([g.effect.effect for g in gaps]))
    versus = next(c for c in found if c.text.endswith("random init control"))
    assert versus.verdict() == "supported"  # the fake random encoder is far worse
    assert versus.evidence.endswith("; 1 instance(s) of the control")
    assert "tasks favour the trained biLM on their own (Holm), 0 the control" in versus.agreement


@dataclass(frozen=True)
class _Item:
    group: str
    p: float | None
    p_value: float | None = None
    method: str = "m"
    family: str = ""
    family_size: int = 0

    @property
    def p_raw(self) -> float | None:
        return self.p


def test_each_family_is_corrected_on_its_own() -> None:
    items = [_Item("a", 0.01), _Item("b", 0.04), _Item("a", 0.03), _Item("a", None)]
    done = correct(items, lambda item: item.group)
    # family a: 0.01 x 2 = 0.02, then max(0.02, 0.03 x 1); family b: one test
    assert [d.p_value for d in done] == pytest.approx([0.02, 0.04, 0.03, None])
    assert [d.family_size for d in done] == [2, 1, 2, 0]
    assert done[0].method == "m; Holm over the 2 tests of a" and done[3].method == "m"


def test_the_task_model_claim_is_the_stages_own_test(tmp_path) -> None:
    write_probe_runs(tmp_path, encoders=("trained", "random"))
    data = report_data(read_probe_runs(tmp_path), families=FAMILIES)
    versus = {"effect": 1.0, "standard_error": 0.4, "df": 10.0, "method": "m", "p_adjusted": 0.1}
    data.taskmodel = {
        "task": "ner",
        "vs_baseline": {"elmo_trained": versus},
        "family": {"tests": 3},
    }
    (claim,) = [c for c in claims(data) if c.text == "ELMo adds to a task model"]
    half = stats.t.ppf(0.975, 10) * 0.4
    assert (claim.effect.low, claim.effect.high) == pytest.approx((1 - half, 1 + half))
    assert claim.effect.p_value == pytest.approx(2 * stats.t.sf(2.5, 10))
    assert "Holm over its 3 inputs" in claim.evidence
    data.taskmodel["vs_baseline"]["elmo_trained"]["standard_error"] = None  # one seed a side
    (claim,) = [c for c in claims(data) if c.text == "ELMo adds to a task model"]
    assert claim.effect is None and claim.verdict() == "not testable"
