"""klbook_lib.stats against independent references: the t interval, simulated coverage,
scipy's Mann-Whitney U, sorting by hand, and effects that are there or are not."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats as sps

from klbook_lib import stats as S


def _t_interval(x: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    m, se = x.mean(), x.std(ddof=1) / math.sqrt(x.size)
    t = sps.t.ppf((1 + level) / 2, df=x.size - 1)
    return m - t * se, m + t * se


# ----------------------------------------------------------------------------- Estimate

def test_estimate_str_and_fields():
    est = S.Estimate(0.123, 0.1, 0.15, 10, 0.95, "BCa")
    assert str(est) == "0.123 [0.100, 0.150] (95 % CI, n = 10)"
    assert str(S.Estimate(1.0, 0.5, 2.0, (10, 12), 0.9, "BCa")).endswith(
        "(90 % CI, n = 10 vs 12)")
    assert est.excludes(0.0) and not est.excludes(0.12)
    with pytest.raises(Exception):
        est.value = 1.0   # frozen


# ----------------------------------------------------------------------------- the mean

@pytest.mark.parametrize("n", [10, 40])
def test_mean_ci_close_to_t_interval(n):
    # For normal data the expanded bootstrap interval is built to match the t interval.
    # The bootstrap distribution of the mean carries the sample's skewness, which moves the
    # end points by O(se / sqrt(n)) per data set: each end point within 1.5 se / sqrt(n);
    # and over 20 data sets the mean width ratio
    # within 0.05 of 1 (the plain interval's ratio is 0.82 at n = 10, 0.95 at n = 40, so
    # the n = 10 case fails without the expansion).
    rng = np.random.default_rng(n)
    ratios = []
    for rep in range(20):
        x = rng.normal(2.0, 3.0, n)
        est = S.mean_ci(x, seed=rep)
        lo, hi = _t_interval(x)
        se = x.std(ddof=1) / math.sqrt(n)
        tol = 1.5 * se / math.sqrt(n)
        assert est.value == pytest.approx(x.mean())
        assert abs(est.low - lo) < tol and abs(est.high - hi) < tol, (est, lo, hi, tol)
        assert est.n == n and est.level == 0.95 and est.method == "percentile, expanded"
        ratios.append((est.high - est.low) / (hi - lo))
    assert abs(np.mean(ratios) - 1.0) < 0.05, np.mean(ratios)


def test_plain_bootstrap_is_narrower_than_t_at_ten_seeds():
    # without the expansion the interval is about sqrt((n-1)/n) z / t_{n-1} = 0.82 of the t
    # interval's width at n = 10 (z = 1.96, t_9 = 2.262): the reason expand=True is the default
    rng = np.random.default_rng(3)
    ratios = []
    for rep in range(20):
        x = rng.normal(0.0, 1.0, 10)
        e = S.mean_ci(x, seed=rep, expand=False, method="percentile")
        lo, hi = _t_interval(x)
        ratios.append((e.high - e.low) / (hi - lo))
    expected = math.sqrt(0.9) * sps.norm.ppf(0.975) / sps.t.ppf(0.975, 9)
    # the bootstrap of a normal sample of 10 has a slightly short-tailed distribution of the
    # mean (it is discrete), so the ratio is a little below the closed form; 20 reps -> SE ~0.01
    assert abs(np.mean(ratios) - expected) < 0.05, (np.mean(ratios), expected)


def test_expanded_level_closed_form():
    # z_{level'} sqrt((n-1)/n) = t_{level, n-1}
    for n in (3, 10, 50):
        lv = S.expanded_level(0.95, n)
        z = sps.norm.ppf((1 + lv) / 2)
        assert z * math.sqrt((n - 1) / n) == pytest.approx(sps.t.ppf(0.975, n - 1))
    assert S.expanded_level(0.95, 10) > 0.95
    assert S.expanded_level(0.95, 10_000) == pytest.approx(0.95, abs=1e-3)


@pytest.mark.parametrize("expand,n,lo,hi", [
    # 400 data sets: binomial SE of the coverage sqrt(0.95 * 0.05 / 400) = 0.011;
    # the band is the target +- 2.5 SE (0.027), so a correct interval fails ~1 % of the time
    # over random seeds; the seeds here are fixed.
    (True, 10, 0.95 - 0.027, 0.95 + 0.027),
    (True, 40, 0.95 - 0.027, 0.95 + 0.027),
    # the plain interval at n = 10: the closed form P(|T_9| < 1.96 sqrt(0.9)) = 0.904
    # (see expanded_level), +- 2.5 SE (SE = sqrt(0.904 * 0.096 / 400) = 0.015)
    (False, 10, 0.904 - 0.037, 0.904 + 0.037),
])
def test_mean_ci_coverage(expand, n, lo, hi):
    rng = np.random.default_rng(100 + n)
    hits = 0
    for i in range(400):
        x = rng.normal(1.0, 2.0, n)
        e = S.mean_ci(x, seed=i, expand=expand, n_resamples=2000)
        hits += e.low <= 1.0 <= e.high
    assert lo <= hits / 400 <= hi, hits / 400


def test_plain_coverage_closed_form_is_what_the_test_uses():
    assert sps.t.cdf(1.96 * math.sqrt(0.9), 9) * 2 - 1 == pytest.approx(0.904, abs=2e-3)


def test_mean_ci_is_deterministic_and_seed_matters():
    x = np.random.default_rng(0).normal(size=12)
    assert S.mean_ci(x, seed=5) == S.mean_ci(x, seed=5)
    assert S.mean_ci(x, seed=5).low != S.mean_ci(x, seed=6).low


def test_mean_ci_paired_is_the_ci_of_the_differences():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=10), rng.normal(size=10)
    assert S.mean_ci(x, paired=y, seed=2) == S.mean_ci(x - y, seed=2)


def test_constant_data_is_degenerate_not_nan():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = S.mean_ci(np.full(10, 0.5))
    assert (e.value, e.low, e.high, e.method) == (0.5, 0.5, 0.5, "degenerate")


# ----------------------------------------------------------------------------- IQM

def test_iqm_is_the_mean_of_the_middle_half():
    rng = np.random.default_rng(4)
    x = rng.normal(size=12)
    middle = np.sort(x)[3:9]                      # 12 / 4 = 3 cut at each end, by hand
    e = S.iqm_ci(x)
    assert e.value == pytest.approx(middle.mean())
    assert e.low < e.value < e.high


def test_iqm_resists_one_diverged_run():
    x = np.r_[np.random.default_rng(5).normal(1.0, 0.1, 11), 1000.0]
    assert abs(S.iqm_ci(x).value - 1.0) < 0.1
    assert S.mean_ci(x).value > 80


# ----------------------------------------------------------------------------- P(improvement)

def test_prob_improvement_equals_mann_whitney_u():
    rng = np.random.default_rng(6)
    a, b = rng.normal(0.5, 1, 10), rng.normal(0, 1, 13)
    a[0] = b[0]                                   # one tie, which U counts one half
    u = sps.mannwhitneyu(a, b, alternative="two-sided").statistic
    e = S.prob_improvement(a, b)
    assert e.value == pytest.approx(u / (10 * 13))
    assert e.low <= e.value <= e.high and e.n == (10, 13)


def test_prob_improvement_coverage_of_a_known_shift():
    # X_a ~ N(d, 1), X_b ~ N(0, 1): P(X_a > X_b) = Phi(d / sqrt 2). 200 sets of 10 vs 10;
    # the statistic is discrete, so the interval is conservative: require >= 0.95 - 2.5 SE
    # (SE = sqrt(0.95 * 0.05 / 200) = 0.015) and not trivially wide (mean width < 0.6).
    d = 0.5
    truth = sps.norm.cdf(d / math.sqrt(2))
    rng = np.random.default_rng(7)
    hits, widths = 0, []
    for i in range(200):
        e = S.prob_improvement(rng.normal(d, 1, 10), rng.normal(0, 1, 10), seed=i,
                               n_resamples=2000)
        hits += e.low <= truth <= e.high
        widths.append(e.high - e.low)
    assert hits / 200 >= 0.95 - 0.038, hits / 200
    assert np.mean(widths) < 0.6, np.mean(widths)


# ----------------------------------------------------------------------------- differences

def test_diff_ci_unpaired_and_paired():
    rng = np.random.default_rng(8)
    common = rng.normal(0, 5, 10)                 # seed-to-seed variation shared by the arms
    arm = common + 1.0 + rng.normal(0, 0.3, 10)
    control = common + rng.normal(0, 0.3, 10)
    un = S.diff_ci(arm, control)
    pa = S.diff_ci(arm, control, paired=True)
    assert un.value == pytest.approx(arm.mean() - control.mean())
    assert pa.value == pytest.approx(un.value)
    # pairing removes the shared variation: the paired CI excludes 0, the unpaired does not
    assert pa.low > 0 and un.low < 0
    assert pa.high - pa.low < 0.2 * (un.high - un.low)


def test_diff_ci_unpaired_matches_welch_interval():
    # for normal data the expanded bootstrap of a difference of means is close to Welch's t
    # interval; it uses the smaller n's t quantile, so it is a little wider (conservative):
    # tolerance 25 % of Welch's half-width.
    rng = np.random.default_rng(9)
    a, b = rng.normal(1, 1, 20), rng.normal(0, 2, 20)
    w = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    e = S.diff_ci(a, b)
    half = (w.high - w.low) / 2
    assert abs(e.low - w.low) < 0.25 * half and abs(e.high - w.high) < 0.25 * half, (e, w)


# ----------------------------------------------------------------------------- asserts

def test_assert_better_passes_on_a_clear_effect_and_returns_the_estimate():
    rng = np.random.default_rng(10)
    arm, control = rng.normal(1.0, 0.5, 10), rng.normal(0.0, 0.5, 10)
    est = S.assert_better(arm, control, label="penalty")
    assert est.low > 0 and isinstance(est, S.Estimate)
    # smaller is better: control - arm direction
    assert S.assert_better(control, arm, larger_is_better=False).high < 0


def test_assert_better_fails_on_a_null_effect_and_on_the_wrong_direction():
    rng = np.random.default_rng(11)
    arm, control = rng.normal(0.0, 1.0, 10), rng.normal(0.0, 1.0, 10)
    with pytest.raises(AssertionError, match="penalty: mean\\(arm\\) - mean\\(control\\)"):
        S.assert_better(arm, control, label="penalty")
    clear = rng.normal(1.0, 0.5, 10)
    with pytest.raises(AssertionError, match="below zero"):
        S.assert_better(clear, control, larger_is_better=False)


def test_assert_better_null_rejection_rate_is_small():
    # under the null (same distribution) the one-sided claim should pass at most ~2.5 % of
    # the time; 200 null experiments -> expect ~5; allow up to 14 (binomial(200, 0.025):
    # mean 5, SD 2.2, 14 is 4 SD above)
    rng = np.random.default_rng(12)
    passed = 0
    for i in range(200):
        try:
            S.assert_better(rng.normal(size=10), rng.normal(size=10), seed=i,
                            n_resamples=1000)
            passed += 1
        except AssertionError:
            pass
    assert passed <= 14, passed


def test_assert_better_refuses_too_few_seeds():
    arm, control = np.arange(5.0) + 10, np.arange(5.0)
    with pytest.raises(ValueError, match="arm: the book's seed standard needs at least 10"):
        S.assert_better(arm, control)
    assert S.assert_better(arm, control, min_seeds=5).low > 0
    with pytest.raises(ValueError, match="min_seeds"):
        S.assert_better(arm, control, min_seeds=1)


def test_assert_no_difference():
    rng = np.random.default_rng(13)
    a, b = rng.normal(0, 0.1, 20), rng.normal(0, 0.1, 20)
    est = S.assert_no_difference(a, b, margin=0.2)
    assert -0.2 <= est.low and est.high <= 0.2
    # an interval that includes zero but is wider than the margin is no evidence of "none"
    noisy_a, noisy_b = rng.normal(0, 3, 10), rng.normal(0, 3, 10)
    with pytest.raises(AssertionError, match="cannot rule out"):
        S.assert_no_difference(noisy_a, noisy_b, margin=0.2)
    # a real difference fails too
    with pytest.raises(AssertionError):
        S.assert_no_difference(a + 1.0, b, margin=0.2)
    with pytest.raises(ValueError, match="margin"):
        S.assert_no_difference(a, b, margin=0.0)


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("call,match", [
    (lambda: S.mean_ci([1.0]), "x: need at least 2 seeds"),
    (lambda: S.mean_ci([1.0, float("nan"), 2.0]), "x: values must be finite"),
    (lambda: S.mean_ci([[1.0, 2.0]]), "x: expected a 1-D sample"),
    (lambda: S.mean_ci([1.0, 2.0, 3.0], paired=[1.0, 2.0]), "paired: a paired sample"),
    (lambda: S.mean_ci([1.0, 2.0], level=1.0), "level: must lie strictly between 0 and 1"),
    (lambda: S.mean_ci([1.0, 2.0], level=0.0), "level"),
    (lambda: S.mean_ci([1.0, 2.0], method="studentized"), "method"),
    (lambda: S.diff_ci([1.0, 2.0, 3.0], [1.0, 2.0], paired=True), "control: a paired sample"),
    (lambda: S.diff_ci([1.0, 2.0], [1.0, 2.0], paired="yes"), "paired: must be True or False"),
    (lambda: S.prob_improvement([1.0, 2.0], [float("inf"), 1.0]), "b: values must be finite"),
    (lambda: S.iqm_ci([1.0, 2.0, 3.0]), "x: need at least 4 seeds"),
    (lambda: S.assert_better([1.0] * 10, [np.nan] * 10), "control: values must be finite"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_ci_errorbar_draws_one_bar_per_x():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    rng = np.random.default_rng(14)
    samples = [rng.normal(m, 1, 10) for m in (0, 1, 2)]
    ests = S.ci_errorbar(ax, [1, 2, 3], samples)
    assert [e.value for e in ests] == pytest.approx([s.mean() for s in samples])
    assert len(ax.containers) == 1
    with pytest.raises(ValueError, match="samples"):
        S.ci_errorbar(ax, [1, 2], samples)
    plt.close(fig)


def test_verdict_names_the_side_of_zero_the_interval_lies_on():
    up = S.Estimate(0.39, 0.06, 0.76, 10, 0.95, "percentile")
    down = S.Estimate(-0.5, -0.9, -0.1, 10, 0.95, "percentile")
    null = S.Estimate(0.16, -0.05, 0.36, (10, 10), 0.95, "percentile")
    assert S.verdict(up) == "higher (+0.39, 95 % CI [+0.06, +0.76])"
    assert S.verdict(down, unit=" nats", digits=1) == "lower (-0.5 nats, 95 % CI [-0.9, -0.1])"
    assert S.verdict(null).startswith("no detectable difference (+0.16")
    assert S.verdict(up, words=("less", "more")).startswith("more (")
    # an interval that touches zero does not exclude it
    assert S.verdict(S.Estimate(0.2, 0.0, 0.4, 10, 0.95, "percentile")).startswith("no detectable")
    with pytest.raises(TypeError, match="est"):
        S.verdict(0.3)
    with pytest.raises(ValueError, match="words"):
        S.verdict(up, words=("only one",))


def test_assert_prob_better_survives_one_diverged_run_that_breaks_the_mean():
    rng = np.random.default_rng(3)
    control = rng.normal(0.0, 0.1, 10)
    arm = rng.normal(1.0, 0.1, 10)
    control[4] = 60.0                  # one control run diverged upwards
    with pytest.raises(AssertionError):
        S.assert_better(arm, control, label="mean")       # the mean difference no longer shows it
    est = S.assert_prob_better(arm, control, label="prob")
    # nine of the ten control runs lose to every arm run, the diverged one wins against all
    assert est.value == pytest.approx(0.9) and 0.5 < est.low <= est.value <= est.high <= 1.0
    smaller = S.assert_prob_better(-arm, -control, larger_is_better=False)
    assert smaller.value == pytest.approx(est.value)


def test_assert_prob_better_fails_without_a_tendency_and_checks_its_input():
    rng = np.random.default_rng(4)
    with pytest.raises(AssertionError, match="above 0.5"):
        S.assert_prob_better(rng.normal(size=10), rng.normal(size=10))
    with pytest.raises(AssertionError):
        S.assert_prob_better(np.arange(10.0), np.arange(10.0) + 20)    # the other way
    with pytest.raises(ValueError, match="seed standard"):
        S.assert_prob_better(np.arange(5.0), np.arange(5.0))
    with pytest.raises(ValueError, match="larger_is_better"):
        S.assert_prob_better(np.arange(10.0), np.arange(10.0), larger_is_better="yes")
