"""Claims that hold across seeds: bootstrap confidence intervals for the book's experiments.

An experiment in the book trains an *arm* (the method a claim is about) and its *control*
(what the claim rules out) on ``n >= 10`` seeds each. Each seed gives one number per arm
(a final return, a final KL, a win rate), so an arm is a 1-D sample ``x_1, ..., x_n``.
This module turns such samples into estimates with confidence intervals (CIs) and into the
asserts a chapter writes:

    mean_ci(x)                  mean of x with its CI
    iqm_ci(x)                   interquartile mean (the mean of the middle 50 %) with its CI
    prob_improvement(a, b)      P(X_a > X_b) (+ half the ties) with its CI
    diff_ci(arm, control)       mean(arm) - mean(control) with its CI (paired or not)
    assert_better(arm, control)         the CI of the difference excludes zero, in the
                                        claimed direction
    assert_no_difference(arm, control, margin=m)   the CI of the difference lies in [-m, m]

The intervals come from ``scipy.stats.bootstrap`` (checked with scipy 1.17.1): by default
the *expanded percentile* interval (Hesterberg 2014, arXiv:1411.5279), i.e. the percentile
method at a level widened for the sample size (:func:`expanded_level`), because with ten
seeds a plain bootstrap interval is too narrow. ``method="BCa"`` (bias-corrected and
accelerated, Efron 1987) or ``"basic"`` can be asked for; at ``n = 10`` and the expanded
level BCa's end points swing with the sample's skewness (on one of 20 normal samples of 10,
by 1.3 standard errors from the t interval), which is why it is not the default. Resampling is deterministic: every function takes ``seed``
and draws from ``np.random.default_rng(seed)``. Two samples that are not paired are resampled
independently of each other (each arm keeps its own size), as in the stratified bootstrap of
Agarwal et al. (2021, "Deep RL at the edge of the statistical precipice"), whose IQM and
probability of improvement are implemented here on top of scipy (rliable is not a dependency).

A bootstrap interval is only as good as the sample: with ``n = 10`` a plain nominal 95 %
interval of the mean covers the true mean about 90 % of the time (it uses the plug-in spread
and normal quantiles, where the t interval has Student quantiles); with the expansion
(``expand=True``, the default) it covers about 95 %; ``tests/test_stats.py`` measures both.
When every resample gives the same value (e.g. constant data, or complete separation in
``prob_improvement``) the interval collapses to that value and ``Estimate.method`` says
``"degenerate"``: read it as "the bootstrap cannot tell", not as certainty.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats as _sps

ArrayLike = Sequence[float] | np.ndarray

_METHODS = ("BCa", "percentile", "basic")


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its confidence interval ``[low, high]`` at ``level``.

    ``n`` is the number of seeds (an int), or ``(n_arm, n_control)`` for two unpaired samples.
    ``method`` names the bootstrap interval ("BCa", "percentile", "basic", "degenerate").
    """

    value: float
    low: float
    high: float
    n: int | tuple[int, int]
    level: float
    method: str

    def __str__(self) -> str:
        n = f"{self.n[0]} vs {self.n[1]}" if isinstance(self.n, tuple) else str(self.n)
        pct = f"{100 * self.level:g}"
        return (f"{_fmt(self.value)} [{_fmt(self.low)}, {_fmt(self.high)}] "
                f"({pct} % CI, n = {n})")

    @property
    def half_width(self) -> float:
        """Half the width of the interval, ``(high - low) / 2``."""
        return (self.high - self.low) / 2

    def excludes(self, value: float = 0.0) -> bool:
        """True if ``value`` lies outside ``[low, high]``."""
        return value < self.low or value > self.high


def _fmt(v: float) -> str:
    """Three decimals for ordinary magnitudes, three significant digits otherwise."""
    return f"{v:.3f}" if v == 0 or 0.01 <= abs(v) < 1e4 else f"{v:.3g}"


# ----------------------------------------------------------------------------- input checks

def _sample(x: ArrayLike, name: str, min_n: int = 2) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name}: expected a 1-D sequence of numbers ({err})") from None
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sample (one number per seed), "
                         f"got shape {a.shape}")
    if a.size < min_n:
        raise ValueError(f"{name}: need at least {min_n} seeds, got {a.size}")
    bad = ~np.isfinite(a)
    if bad.any():
        raise ValueError(f"{name}: values must be finite, found {a[bad][0]} "
                         f"at index {int(np.flatnonzero(bad)[0])}")
    return a


def _check_level(level: float) -> float:
    if not isinstance(level, (int, float)) or not (0.0 < float(level) < 1.0):
        raise ValueError(f"level: must lie strictly between 0 and 1, got {level!r}")
    return float(level)


def _check_method(method: str) -> str:
    if method not in _METHODS:
        raise ValueError(f"method: must be one of {_METHODS}, got {method!r}")
    return method


def _check_pair(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_b}: a paired sample must have one value per seed of "
                         f"{name_a} ({a.size}), got {b.size}")


# ----------------------------------------------------------------------------- the bootstrap

def _boot(samples: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], *,
          paired: bool, level: float, seed: int, method: str,
          n_resamples: int, expand: bool) -> tuple[float, float, float, str]:
    """Point estimate and bootstrap CI of a vectorised ``statistic(*samples, axis=-1)``."""
    value = float(statistic(*samples, axis=-1))
    if n_resamples < 100:
        raise ValueError(f"n_resamples: need at least 100 resamples, got {n_resamples}")
    boot_level = expanded_level(level, min(s.size for s in samples)) if expand else level
    res = _sps.bootstrap(samples, statistic, n_resamples=n_resamples, vectorized=True,
                         paired=paired, axis=-1, confidence_level=boot_level,
                         method=method, rng=np.random.default_rng(seed))
    dist = res.bootstrap_distribution
    if np.ptp(dist) == 0.0:
        return value, value, value, "degenerate"
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"method: the {method} interval is undefined for this sample "
                         f"(bootstrap distribution {np.min(dist):.3g}..{np.max(dist):.3g}); "
                         "try method='percentile'")
    return value, low, high, f"{method}, expanded" if expand else method


def expanded_level(level: float, n: int) -> float:
    """The level handed to the bootstrap so that a ``level`` interval is not too narrow.

    A bootstrap percentile interval of a mean is about ``xbar +- z * s * sqrt((n-1)/n)/sqrt(n)``
    where the t interval is ``xbar +- t_{n-1} * s / sqrt(n)``: too narrow for small ``n``
    (a nominal 95 % interval covers about 90 % of the time at ``n = 10``). The expanded
    level ``1 - 2 Phi(-t_{(1+level)/2, n-1} sqrt(n/(n-1)))`` makes the two agree for
    symmetric data (Hesterberg 2014, arXiv:1411.5279; R package resample, ``ExpandProbs``).
    For two samples ``n`` is the smaller one.
    """
    level = _check_level(level)
    if n < 2:
        raise ValueError(f"n: need at least 2 observations, got {n}")
    t = _sps.t.ppf((1 + level) / 2, df=n - 1)
    return float(1 - 2 * _sps.norm.cdf(-t * math.sqrt(n / (n - 1))))


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _iqm(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return _sps.trim_mean(x, 0.25, axis=axis)


def _mean_diff(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def _p_improve(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    a = np.moveaxis(a, axis, -1)[..., :, None]
    b = np.moveaxis(b, axis, -1)[..., None, :]
    return np.mean((a > b) + 0.5 * (a == b), axis=(-2, -1))


# ----------------------------------------------------------------------------- estimates

def mean_ci(x: ArrayLike, level: float = 0.95, seed: int = 0,
            paired: ArrayLike | None = None, *, method: str = "percentile",
            n_resamples: int = 9999, expand: bool = True) -> Estimate:
    """Mean of ``x`` (one value per seed) with a bootstrap CI at ``level``.

    With ``paired=y`` (one value per seed, same seeds as ``x``) the estimate is the mean of
    the per-seed differences ``x_i - y_i``.
    """
    level, method = _check_level(level), _check_method(method)
    a = _sample(x, "x")
    if paired is not None:
        b = _sample(paired, "paired")
        _check_pair(a, b, "x", "paired")
        a = a - b
    value, low, high, how = _boot((a,), _mean, paired=False, level=level, seed=seed,
                                  method=method, n_resamples=n_resamples, expand=expand)
    return Estimate(value, low, high, int(a.size), level, how)


def iqm_ci(x: ArrayLike, level: float = 0.95, seed: int = 0, *, method: str = "percentile",
           n_resamples: int = 9999, expand: bool = True) -> Estimate:
    """Interquartile mean of ``x`` with a bootstrap CI (Agarwal et al. 2021).

    The IQM drops the lowest and the highest quarter of the values and averages the rest
    (``scipy.stats.trim_mean(x, 0.25)``, which cuts ``floor(n / 4)`` values at each end):
    less sensitive to one run that diverged than the mean, less wasteful than the median.
    """
    level, method = _check_level(level), _check_method(method)
    a = _sample(x, "x", min_n=4)
    value, low, high, how = _boot((a,), _iqm, paired=False, level=level, seed=seed,
                                  method=method, n_resamples=n_resamples, expand=expand)
    return Estimate(value, low, high, int(a.size), level, how)


def prob_improvement(a: ArrayLike, b: ArrayLike, level: float = 0.95, seed: int = 0, *,
                     method: str = "percentile", n_resamples: int = 9999,
                     expand: bool = True) -> Estimate:
    """Probability of improvement ``P(X_a > X_b) + P(X_a = X_b) / 2`` with a bootstrap CI.

    ``X_a`` and ``X_b`` are the results of one random seed of each arm; the estimate is the
    fraction of the ``n_a * n_b`` pairs in which ``a`` wins (ties count half), which is the
    Mann-Whitney ``U`` statistic of ``a`` divided by ``n_a * n_b``. 0.5 means no tendency.
    The two samples are resampled independently.
    """
    level, method = _check_level(level), _check_method(method)
    xa, xb = _sample(a, "a"), _sample(b, "b")
    value, low, high, how = _boot((xa, xb), _p_improve, paired=False, level=level,
                                  seed=seed, method=method, n_resamples=n_resamples, expand=expand)
    return Estimate(value, low, high, (int(xa.size), int(xb.size)), level, how)


def diff_ci(arm: ArrayLike, control: ArrayLike, paired: bool = False, level: float = 0.95,
            seed: int = 0, *, method: str = "percentile", n_resamples: int = 9999,
            expand: bool = True) -> Estimate:
    """``mean(arm) - mean(control)`` with a bootstrap CI.

    ``paired=True`` when seed ``i`` of the arm and seed ``i`` of the control share their
    randomness (same seed, same data): the CI is that of the mean per-seed difference, which
    is narrower when the two runs are positively correlated. ``paired=False`` resamples each
    arm on its own (valid in either case; the arms may have different sizes).
    """
    level, method = _check_level(level), _check_method(method)
    if not isinstance(paired, bool):
        raise ValueError(f"paired: must be True or False, got {paired!r}")
    xa, xc = _sample(arm, "arm"), _sample(control, "control")
    if paired:
        _check_pair(xa, xc, "arm", "control")
        return mean_ci(xa, level, seed, paired=xc, method=method, n_resamples=n_resamples,
                       expand=expand)
    value, low, high, how = _boot((xa, xc), _mean_diff, paired=False, level=level,
                                  seed=seed, method=method, n_resamples=n_resamples, expand=expand)
    return Estimate(value, low, high, (int(xa.size), int(xc.size)), level, how)


def verdict(est: Estimate, *, unit: str = "", digits: int = 2,
            words: tuple[str, str] = ("lower", "higher")) -> str:
    """The words a page prints for a difference ``est`` whose sign the experiment may not settle.

    ``"higher (+0.39, 95 % CI [+0.06, +0.76])"`` when the CI lies above zero, ``words[0]``
    when it lies below, ``"no detectable difference (...)"`` when it contains zero. For
    claims at the edge of their evidence, whose CI ends near zero: rerun on another CPU,
    float rounding alone can move such an end across zero, so the page reports the verdict
    in words computed here and asserts only what holds with a margin.
    """
    if not isinstance(est, Estimate):
        raise TypeError(f"est: must be an Estimate, got {type(est).__name__}")
    if not isinstance(digits, int) or digits < 0:
        raise ValueError(f"digits: must be a non-negative integer, got {digits!r}")
    if len(words) != 2 or not all(isinstance(w, str) and w for w in words):
        raise ValueError(f"words: must be two non-empty strings (below, above zero), got {words!r}")
    f = lambda v: f"{v:+.{digits}f}"
    ci = f"{f(est.value)}{unit}, {100 * est.level:g} % CI [{f(est.low)}, {f(est.high)}]"
    if est.low > 0:
        return f"{words[1]} ({ci})"
    if est.high < 0:
        return f"{words[0]} ({ci})"
    return f"no detectable difference ({ci})"


# ----------------------------------------------------------------------------- asserts

def _check_seeds(xa: np.ndarray, xc: np.ndarray, min_seeds: int) -> None:
    if not isinstance(min_seeds, int) or min_seeds < 2:
        raise ValueError(f"min_seeds: must be an integer >= 2, got {min_seeds!r}")
    for name, x in (("arm", xa), ("control", xc)):
        if x.size < min_seeds:
            raise ValueError(f"{name}: the book's seed standard needs at least {min_seeds} "
                             f"seeds per arm, got {x.size} (lower min_seeds= explicitly "
                             "only for a demonstration that asserts nothing general)")


def assert_better(arm: ArrayLike, control: ArrayLike, *, larger_is_better: bool = True,
                  paired: bool = False, label: str = "arm vs control", level: float = 0.95,
                  seed: int = 0, min_seeds: int = 10, method: str = "percentile",
                  n_resamples: int = 9999, expand: bool = True) -> Estimate:
    """Assert that ``arm`` beats ``control``: the CI of ``mean(arm) - mean(control)`` lies
    entirely above zero (below zero with ``larger_is_better=False``).

    Returns the :class:`Estimate` of the difference so the page can print and glue it.
    Raises ``AssertionError`` with a readable message when the CI touches or crosses zero
    or points the other way, and ``ValueError`` for fewer than ``min_seeds`` seeds per arm
    (the book's standard is 10).
    """
    xa, xc = _sample(arm, "arm"), _sample(control, "control")
    _check_seeds(xa, xc, min_seeds)
    est = diff_ci(xa, xc, paired=paired, level=level, seed=seed, method=method,
                  n_resamples=n_resamples, expand=expand)
    ok = est.low > 0 if larger_is_better else est.high < 0
    if not ok:
        want = "above" if larger_is_better else "below"
        raise AssertionError(
            f"{label}: mean(arm) - mean(control) = {est}; the claim needs the whole CI "
            f"{want} zero (arm mean {xa.mean():.4g}, control mean {xc.mean():.4g}, "
            f"{'paired' if paired else 'unpaired'})")
    return est


def assert_prob_better(arm: ArrayLike, control: ArrayLike, *, larger_is_better: bool = True,
                       label: str = "arm vs control", level: float = 0.95, seed: int = 0,
                       min_seeds: int = 10, method: str = "percentile", n_resamples: int = 9999,
                       expand: bool = True) -> Estimate:
    """Assert that a run of ``arm`` beats a run of ``control`` more often than not: the CI of
    the probability of improvement (:func:`prob_improvement`) lies entirely above 0.5.

    The claim for arms in which one run in ten may diverge (a learning rate near the edge of
    stability, on some CPUs and not others): one diverged run can drag a mean difference
    across zero, but it moves the probability of improvement by at most ``1 / n`` of the
    pairs. With ``larger_is_better=False`` "beats" means "ends lower". Returns the
    :class:`Estimate` of the probability; ``AssertionError`` when its CI reaches 0.5,
    ``ValueError`` for fewer than ``min_seeds`` seeds per arm.
    """
    if not isinstance(larger_is_better, bool):
        raise ValueError(f"larger_is_better: must be True or False, got {larger_is_better!r}")
    xa, xc = _sample(arm, "arm"), _sample(control, "control")
    _check_seeds(xa, xc, min_seeds)
    a, c = (xa, xc) if larger_is_better else (-xa, -xc)
    est = prob_improvement(a, c, level=level, seed=seed, method=method, n_resamples=n_resamples,
                           expand=expand)
    if not est.low > 0.5:
        raise AssertionError(
            f"{label}: P(a run of the arm beats a run of the control) = {est}; the claim needs "
            f"the whole CI above 0.5 (arm median {np.median(xa):.4g}, control median "
            f"{np.median(xc):.4g}, {'larger' if larger_is_better else 'smaller'} is better)")
    return est


def assert_no_difference(arm: ArrayLike, control: ArrayLike, *, margin: float,
                         paired: bool = False, label: str = "arm vs control",
                         level: float = 0.95, seed: int = 0, min_seeds: int = 10,
                         method: str = "percentile", n_resamples: int = 9999,
                     expand: bool = True) -> Estimate:
    """Assert "no detectable difference that matters": the CI of
    ``mean(arm) - mean(control)`` lies inside ``[-margin, margin]``.

    ``margin`` is the smallest difference that would matter, fixed before looking at the
    results. A CI that includes zero but is wider than the margin proves nothing and fails
    this assert (too few seeds, or too noisy an experiment, to say "no difference").
    """
    if not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin <= 0:
        raise ValueError(f"margin: must be a positive finite number, got {margin!r}")
    xa, xc = _sample(arm, "arm"), _sample(control, "control")
    _check_seeds(xa, xc, min_seeds)
    est = diff_ci(xa, xc, paired=paired, level=level, seed=seed, method=method,
                  n_resamples=n_resamples, expand=expand)
    if not (-margin <= est.low and est.high <= margin):
        raise AssertionError(
            f"{label}: mean(arm) - mean(control) = {est} is not inside "
            f"[-{margin:g}, {margin:g}]: the experiment cannot rule out a difference "
            "of that size")
    return est


# ----------------------------------------------------------------------------- plotting

def ci_errorbar(ax, xs: ArrayLike, samples: Sequence[ArrayLike], *, level: float = 0.95,
                seed: int = 0, label: str | None = None, **kwargs) -> list[Estimate]:
    """Plot the mean of each sample in ``samples`` at ``xs`` with its bootstrap CI as error
    bars on the matplotlib axes ``ax``; returns the estimates (one per x)."""
    xs = np.asarray(xs, dtype=float)
    if xs.ndim != 1 or xs.size != len(samples):
        raise ValueError(f"samples: need one sample per x ({xs.size}), got {len(samples)}")
    ests = [mean_ci(s, level=level, seed=seed) for s in samples]
    vals = np.array([e.value for e in ests])
    err = np.array([[e.value - e.low for e in ests], [e.high - e.value for e in ests]])
    kwargs.setdefault("capsize", 3)
    kwargs.setdefault("marker", "o")
    ax.errorbar(xs, vals, yerr=err, label=label, **kwargs)
    return ests
