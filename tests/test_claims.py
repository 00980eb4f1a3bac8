"""klbook_lib.claims against independent references: scipy's bootstrap called directly (not
through klbook_lib.stats), hand-made cases whose verdict is known, and bad input."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from klbook_lib import claims, stats

SAYS = {"supported": "A is better by {value:+.2f} ({ci}, n = {n})",
        "opposite": "A is worse: {abs:.2f} {metric}",
        "no_difference": "no difference beyond {margin}",
        "too_wide": "{n} seeds cannot tell {arm} from {control} ({low:.2f} to {high:.2f})"}
ZH = {"supported": "A 更好，高出 {value:+.2f}（{ci}）", "opposite": "A 更差：{abs:.2f}",
      "no_difference": "没有超过 {margin} 的差别", "too_wide": "{n} 个种子无法判断"}


def make(**kw):
    base = dict(id="t-1", statement="A beats B", arm="A", control="B", metric="return",
                better="higher", test_seeds=range(10), margin=0.5, says=SAYS, zh=ZH)
    base.update(kw)
    return claims.Claim(**base)


def expanded_percentile_ci(a, b, seed=0):
    """The reference: scipy.stats.bootstrap on the two samples, unpaired, percentile method at
    the level that stats.expanded_level gives for n = 10 (its formula is tested in test_stats)."""
    level = stats.expanded_level(0.95, min(len(a), len(b)))
    res = sps.bootstrap((a, b), lambda x, y, axis=-1: x.mean(axis) - y.mean(axis), vectorized=True,
                        paired=False, confidence_level=level, method="percentile",
                        n_resamples=9999, rng=np.random.default_rng(seed))
    return res.confidence_interval.low, res.confidence_interval.high


def test_estimate_matches_scipy_bootstrap():
    rng = np.random.default_rng(3)
    a, b = rng.normal(1.0, 1.0, 10), rng.normal(0.0, 1.0, 10)
    r = make().run({"B": b, "A": a, "C": b + 100})         # order of the dict does not matter
    lo, hi = expanded_percentile_ci(a, b)
    assert r.estimate.value == pytest.approx(a.mean() - b.mean(), abs=1e-12)
    assert (r.estimate.low, r.estimate.high) == pytest.approx((lo, hi), abs=1e-12)
    assert r.arm_mean == pytest.approx(a.mean()) and r.control_mean == pytest.approx(b.mean())


def test_arms_are_taken_by_name_not_position():
    rng = np.random.default_rng(0)
    hi, lo = rng.normal(5, 0.1, 10), rng.normal(0, 0.1, 10)
    c = make(arm="strong", control="weak")
    # the same numbers in two insertion orders give the same verdict
    assert c.run({"strong": hi, "weak": lo}).outcome == "supported"
    assert c.run({"weak": lo, "strong": hi}).outcome == "supported"
    # swapping the names' data reverses it
    assert c.run({"weak": hi, "strong": lo}).outcome == "opposite"


@pytest.mark.parametrize("shift, better, margin, want", [
    (+3.0, "higher", 0.5, "supported"),
    (-3.0, "higher", 0.5, "opposite"),
    (-3.0, "lower", 0.5, "supported"),
    (+3.0, "lower", 0.5, "opposite"),
    (0.0, "higher", 5.0, "no_difference"),     # CI about +-0.1 around 0, inside +-5
    (0.0, "higher", 0.01, "too_wide"),         # the same CI, wider than a margin of 0.01
])
def test_hand_cases(shift, better, margin, want):
    base = np.linspace(-0.15, 0.15, 10)         # a spread of 0.1 standard deviation
    arm, control = base[::-1] + shift, base.copy()
    r = make(better=better, margin=margin).run({"A": arm, "B": control})
    assert r.outcome == want, r.estimate
    assert r.sentence() == SAYS[want].format(**r.fields())
    assert r.sentence("zh_CN") == ZH[want].format(**r.fields())


def test_decide_at_the_edges():
    E = lambda lo, hi: stats.Estimate((lo + hi) / 2, lo, hi, 10, 0.95, "percentile")
    assert claims.decide(E(0.0, 1.0), "higher", 0.5) == "too_wide"     # touching zero is not excluding it
    assert claims.decide(E(1e-9, 1.0), "higher", 0.5) == "supported"
    assert claims.decide(E(-0.5, 0.5), "higher", 0.5) == "no_difference"   # the margin is inclusive
    assert claims.decide(E(-0.5, 0.50001), "higher", 0.5) == "too_wide"
    assert claims.decide(E(0.01, 0.02), "lower", 0.5) == "opposite"   # small but detectable


def test_paired_uses_per_seed_differences():
    rng = np.random.default_rng(1)
    common = rng.normal(0, 10, 10)             # a large shared seed effect
    a, b = common + 1.0 + rng.normal(0, 0.1, 10), common + rng.normal(0, 0.1, 10)
    assert make(paired=False).run({"A": a, "B": b}).outcome == "too_wide"
    r = make(paired=True).run({"A": a, "B": b})
    assert r.outcome == "supported"
    ref = sps.bootstrap((a - b,), np.mean, confidence_level=stats.expanded_level(0.95, 10),
                        method="percentile", n_resamples=9999, rng=np.random.default_rng(0))
    assert r.estimate.low == pytest.approx(ref.confidence_interval.low, abs=1e-12)


def test_sentences_fill_numbers():
    r = make(digits=1).run({"A": np.full(10, 2.0) + np.linspace(0, 0.1, 10),
                            "B": np.linspace(0, 0.1, 10)})
    assert r.outcome == "supported"
    assert r.sentence().startswith("A is better by +2.00 (+2.0 [+2.0, +2.0], n = 10)")


def test_glue_writes_both_languages(monkeypatch):
    got = {}
    import myst_nb
    monkeypatch.setattr(myst_nb, "glue", lambda k, v, display=True: got.__setitem__(k, v))
    r = make(id="c99-x").run({"A": np.arange(10.0) + 5, "B": np.arange(10.0)})
    r.glue()
    assert got["c99_x"] == r.sentence() and got["c99_x__zh_CN"] == r.sentence("zh_CN")
    assert got["c99_x_value"] == pytest.approx(5.0) and got["c99_x_n"] == 10
    assert got["c99_x_verdict"] == "supported" and got["c99_x_verdict__zh_CN"] == "成立"


def test_require():
    r = make().run({"A": np.arange(10.0) + 5, "B": np.arange(10.0)})
    assert r.require("supported", "too_wide") is r
    with pytest.raises(AssertionError, match="supported"):
        r.require("opposite")
    with pytest.raises(ValueError, match="outcomes"):
        r.require("bigger")


def test_finding_table():
    r = make().run({"A": np.arange(10.0) + 5, "B": np.arange(10.0)})
    df = claims.finding_table([r])
    assert list(df["verdict"]) == ["supported"] and list(df["seeds"]) == [10]
    assert "结论" in claims.finding_table([r], "zh_CN").columns
    with pytest.raises(ValueError, match="results"):
        claims.finding_table([])


@pytest.mark.parametrize("kw, arg", [
    (dict(id="1bad"), "id"), (dict(arm="B"), "control"), (dict(better="up"), "better"),
    (dict(margin=0), "margin"), (dict(margin=float("nan")), "margin"), (dict(margin=True), "margin"),
    (dict(test_seeds=[1]), "test_seeds"), (dict(test_seeds=[1, 1, 2]), "test_seeds"),
    (dict(select_seeds=range(3), test_seeds=range(2, 12)), "test_seeds"),
    (dict(says={k: v for k, v in SAYS.items() if k != "too_wide"}), "says"),
    (dict(says={**SAYS, "too_wide": "{nope}"}), "says"), (dict(zh={**ZH, "opposite": ""}), "zh"),
    (dict(statement=""), "statement"), (dict(paired=1), "paired"), (dict(digits=-1), "digits"),
])
def test_bad_declarations_name_the_argument(kw, arg):
    with pytest.raises(ValueError, match=f"^{arg}:"):
        make(**kw)


def test_bad_values_name_the_argument():
    c = make()
    with pytest.raises(ValueError, match="^values: .*by position"):
        c.run([np.zeros(10), np.ones(10)])
    with pytest.raises(ValueError, match="^values: no arm named 'B'"):
        c.run({"A": np.zeros(10), "b": np.ones(10)})
    with pytest.raises(ValueError, match="^values: arm 'A' needs one value per test seed"):
        c.run({"A": np.zeros(9), "B": np.ones(10)})
    with pytest.raises(ValueError, match="^values: arm 'B' has a non-finite"):
        c.run({"A": np.zeros(10), "B": np.r_[np.ones(9), np.nan]})
    r = c.run({"A": np.arange(10.0), "B": np.arange(10.0) + 0.1})
    with pytest.raises(ValueError, match="^lang:"):
        r.sentence("fr")
    with pytest.raises(ValueError, match="^est:"):
        claims.decide((0, 1), "higher", 1.0)
