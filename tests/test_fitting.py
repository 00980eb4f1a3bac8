"""Tests for klbook_lib.fitting against closed forms and scipy.integrate.quad."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from klbook_lib import fitting as F


def mixture(weights, means, stds):
    return lambda x: F.gaussian_mixture_logpdf(x, weights, means, stds)


def mixture_pdf_scipy(x, weights, means, stds):
    return sum(w * stats.norm.pdf(x, m, s) for w, m, s in zip(weights, means, stds))


# ---------------------------------------------------------------- the mixture density
def test_mixture_logpdf_matches_scipy_and_is_finite_in_the_tails():
    w, m, s = [0.3, 0.7], [-1.0, 2.5], [0.5, 1.2]
    x = np.linspace(-8, 8, 101)
    np.testing.assert_allclose(np.exp(F.gaussian_mixture_logpdf(x, w, m, s)),
                               mixture_pdf_scipy(x, w, m, s), rtol=1e-12)
    # at x = 100 the density underflows to 0.0 in float64, the log density does not
    far = F.gaussian_mixture_logpdf(np.array([100.0]), w, m, s)
    assert mixture_pdf_scipy(100.0, w, m, s) == 0.0
    # closed form: the wider component dominates, log(0.7 N(100; 2.5, 1.2^2))
    assert far[0] == pytest.approx(math.log(0.7) + stats.norm.logpdf(100.0, 2.5, 1.2), rel=1e-12)


def test_mixture_logpdf_validation():
    with pytest.raises(ValueError, match="^weights:"):
        F.gaussian_mixture_logpdf(0.0, [0.5, 0.6], [0, 1], [1, 1])
    with pytest.raises(ValueError, match="^weights:"):
        F.gaussian_mixture_logpdf(0.0, [1.5, -0.5], [0, 1], [1, 1])
    with pytest.raises(ValueError, match="^stds:"):
        F.gaussian_mixture_logpdf(0.0, [0.5, 0.5], [0, 1], [1, 0])
    with pytest.raises(ValueError, match="^means:"):
        F.gaussian_mixture_logpdf(0.0, [0.5, 0.5], [0, 1, 2], [1, 1])
    with pytest.raises(ValueError, match="^means:"):
        F.gaussian_mixture_logpdf(0.0, [0.5, 0.5], [0, np.nan], [1, 1])


# ---------------------------------------------------------------- forward KL = moment matching
@pytest.mark.parametrize("w,m,s", [
    ([0.5, 0.5], [-2.0, 2.0], [0.8, 0.8]),
    ([0.3, 0.7], [-1.0, 2.5], [0.5, 1.2]),
    ([0.2, 0.5, 0.3], [-4.0, 0.0, 3.0], [0.4, 1.0, 0.6]),
])
def test_forward_fit_is_moment_matching(w, m, s):
    w, m, s = map(np.asarray, (w, m, s))
    mean = float(np.sum(w * m))  # closed form for a mixture
    var = float(np.sum(w * (s ** 2 + m ** 2)) - mean ** 2)
    fit = F.fit_gaussian(mixture(w, m, s), "forward", init=(1.0, 1.0))
    assert fit.success, fit
    assert fit.mu == pytest.approx(mean, abs=1e-6)
    assert fit.sigma == pytest.approx(math.sqrt(var), rel=1e-6)
    # the reported objective is the forward KL at the optimum: check it with quad
    ref = _quad_div("forward_kl", w, m, s, fit.mu, fit.sigma)
    assert fit.objective == pytest.approx(ref, rel=1e-6, abs=1e-9)


# ---------------------------------------------------------------- reverse KL
@pytest.mark.parametrize("direction", ["forward", "reverse", "js", "hellinger", "tv", "chi2",
                                       "symmetric_kl", "wasserstein1"])
def test_fit_of_a_gaussian_target_recovers_it(direction):
    # every divergence is zero exactly at Q = P, so every fit must recover the target
    fit = F.fit_gaussian(mixture([1.0], [1.3], [0.7]), direction, init=(0.0, 1.5))
    assert fit.mu == pytest.approx(1.3, abs=1e-4)
    assert fit.sigma == pytest.approx(0.7, abs=1e-4)
    assert abs(fit.objective) < 1e-6


def test_reverse_fit_of_separated_bimodal_lands_on_one_component():
    lt = mixture([0.5, 0.5], [-4.0, 4.0], [0.7, 0.7])
    grid = F.make_grid(-25, 25, 10001)  # the forward fit is wide (sigma ~ 4)
    right = F.fit_gaussian(lt, "reverse", init=(2.0, 1.0), grid=grid)
    left = F.fit_gaussian(lt, "reverse", init=(-1.0, 0.5), grid=grid)
    for fit, sign in ((right, 1), (left, -1)):
        assert fit.success, fit
        assert fit.mu == pytest.approx(sign * 4.0, abs=1e-3)
        assert fit.sigma == pytest.approx(0.7, abs=1e-3)
        # KL(N_1 || (N_1 + N_2)/2) -> log 2 as the components separate (overlap ~ e^-65 here)
        assert fit.objective == pytest.approx(math.log(2), abs=1e-6)
    fwd = F.fit_gaussian(lt, "forward", init=(2.0, 1.0), grid=grid)
    assert abs(fwd.mu) < 1e-6 and fwd.sigma == pytest.approx(math.sqrt(0.49 + 16), rel=1e-6)


# ---------------------------------------------------------------- objectives vs quad
def _quad_div(name, w, m, s, mu, sigma):
    p = lambda x: mixture_pdf_scipy(x, w, m, s)  # noqa: E731
    q = lambda x: stats.norm.pdf(x, mu, sigma)  # noqa: E731
    lo, hi = -15, 15
    kw = dict(limit=400, points=list(m) + [mu], epsabs=1e-12, epsrel=1e-10)
    if name == "forward_kl":
        g = lambda x: p(x) * math.log(p(x) / q(x)) if p(x) > 0 else 0.0  # noqa: E731
    elif name == "reverse_kl":
        g = lambda x: q(x) * math.log(q(x) / p(x)) if q(x) > 0 else 0.0  # noqa: E731
    elif name == "js":
        def g(x):
            a, b = p(x), q(x)
            mm = 0.5 * (a + b)
            return 0.5 * ((a * math.log(a / mm) if a > 0 else 0) + (b * math.log(b / mm) if b > 0 else 0))
    elif name == "tv":
        g = lambda x: 0.5 * abs(p(x) - q(x))  # noqa: E731
    elif name == "chi2":
        g = lambda x: (p(x) - q(x)) ** 2 / q(x)  # noqa: E731
    elif name == "hellinger":
        g = lambda x: (math.sqrt(p(x)) - math.sqrt(q(x))) ** 2  # noqa: E731
    elif name == "wasserstein1":
        cdf = lambda x: sum(wi * stats.norm.cdf(x, mi, si) for wi, mi, si in zip(w, m, s))  # noqa: E731
        g = lambda x: abs(cdf(x) - stats.norm.cdf(x, mu, sigma))  # noqa: E731
    else:
        raise AssertionError(name)
    return integrate.quad(g, lo, hi, **kw)[0]


@pytest.mark.parametrize("name", ["forward_kl", "reverse_kl", "js", "tv", "chi2", "hellinger",
                                  "wasserstein1"])
@pytest.mark.parametrize("mu,sigma", [(0.0, 2.0), (1.7, 0.9), (-0.5, 1.4)])
def test_grid_objectives_match_quad(name, mu, sigma):
    w, m, s = [0.5, 0.5], [-2.0, 2.0], [0.8, 0.8]
    ours = F.divergence_to_gaussian(mixture(w, m, s), mu, sigma, name)
    ref = _quad_div(name, w, m, s, mu, sigma)
    # |p - q| has kinks where p = q, which limit Simpson's rule to O(dx^2): looser for TV
    rel = 1e-5 if name == "tv" else 1e-6
    assert ours == pytest.approx(ref, rel=rel, abs=1e-9)


def test_symmetric_kl_objective_is_the_sum():
    lt = mixture([0.5, 0.5], [-2.0, 2.0], [0.8, 0.8])
    total = F.divergence_to_gaussian(lt, 0.4, 1.1, "symmetric_kl")
    parts = (_quad_div("forward_kl", [0.5, 0.5], [-2, 2], [0.8, 0.8], 0.4, 1.1)
             + _quad_div("reverse_kl", [0.5, 0.5], [-2, 2], [0.8, 0.8], 0.4, 1.1))
    assert total == pytest.approx(parts, rel=1e-6)


# ---------------------------------------------------------------- numerics
def test_underflowing_target_gives_no_nan():
    # N(0, 0.3^2): exp(log p) underflows to 0 beyond |x| ~ 11.6 on the default grid
    lt = mixture([1.0], [0.0], [0.3])
    assert (np.exp(lt(F.make_grid())) == 0).any()
    for direction in ("forward", "reverse", "js", "chi2"):
        fit = F.fit_gaussian(lt, direction, init=(2.0, 3.0))
        assert np.isfinite([fit.mu, fit.sigma, fit.objective]).all(), fit
        assert fit.mu == pytest.approx(0.0, abs=1e-4) and fit.sigma == pytest.approx(0.3, abs=1e-4)


def test_target_with_zero_density_regions_forward_fit():
    # uniform on [-1, 1]: log density -inf outside. Forward KL is moment matching:
    # mean 0, variance 1/3 (closed form); the grid resolves the edges to about one step.
    lt = lambda x: np.where(np.abs(x) <= 1, 0.0, -np.inf)  # noqa: E731
    fit = F.fit_gaussian(lt, "forward", init=(0.5, 1.0))
    assert np.isfinite(fit.objective)
    assert abs(fit.mu) < 1e-6 and fit.sigma == pytest.approx(math.sqrt(1 / 3), abs=5e-3)


def test_unnormalised_target_is_normalised():
    lt = mixture([0.3, 0.7], [-1.0, 2.5], [0.5, 1.2])
    a = F.fit_gaussian(lt, "reverse", init=(2.0, 1.0))
    b = F.fit_gaussian(lambda x: lt(x) + 7.0, "reverse", init=(2.0, 1.0))
    assert (a.mu, a.sigma) == pytest.approx((b.mu, b.sigma), abs=1e-7)
    assert a.objective == pytest.approx(b.objective, abs=1e-9)


# ---------------------------------------------------------------- bad input
def test_bad_arguments_raise():
    lt = mixture([1.0], [0.0], [1.0])
    with pytest.raises(ValueError, match="^direction:"):
        F.fit_gaussian(lt, "backward")
    with pytest.raises(ValueError, match="^direction:"):
        F.divergence_to_gaussian(lt, 0.0, 1.0, "Forward")
    with pytest.raises(ValueError, match="^init:"):
        F.fit_gaussian(lt, "forward", init=(0.0, -1.0))
    with pytest.raises(ValueError, match="^grid:"):
        F.fit_gaussian(lt, "forward", grid=np.linspace(-5, 5, 100))  # even length
    with pytest.raises(ValueError, match="^grid:"):
        F.fit_gaussian(lt, "forward", grid=np.linspace(-2, 2, 101))  # target cut off
    with pytest.raises(ValueError, match="^log_target:"):
        F.fit_gaussian(lambda x: np.full_like(x, np.nan), "forward")
    with pytest.raises(ValueError, match="^sigma:"):
        F.divergence_to_gaussian(lt, 0.0, 0.0)


def test_gradient_flow_method():
    lt = mixture([0.5, 0.5], [-2.0, 2.0], [0.8, 0.8])
    grid = F.make_grid(-12, 12, 2401)
    # mirror symmetry of the target: a mirrored start must give the mirrored fit
    a = F.fit_gaussian(lt, "reverse", init=(2.7, 0.6), grid=grid, method="flow")
    b = F.fit_gaussian(lt, "reverse", init=(-2.7, 0.6), grid=grid, method="flow")
    assert a.mu == pytest.approx(-b.mu, abs=1e-6) and a.sigma == pytest.approx(b.sigma, abs=1e-6)
    # the fixed point of the flow is a stationary point: L-BFGS-B from there does not move
    c = F.fit_gaussian(lt, "reverse", init=(a.mu, a.sigma), grid=grid)
    assert (c.mu, c.sigma) == pytest.approx((a.mu, a.sigma), abs=1e-5)
    assert a.mu > 1.5  # started right of the right mode, flowed to it
    # the forward flow ends at the moment-matching solution (closed form)
    f = F.fit_gaussian(lt, "forward", init=(1.0, 0.5), grid=grid, method="flow")
    assert f.mu == pytest.approx(0.0, abs=1e-6) and f.sigma == pytest.approx(math.sqrt(4.64), rel=1e-6)
    with pytest.raises(ValueError, match="^method:"):
        F.fit_gaussian(lt, "js", method="flow")
    with pytest.raises(ValueError, match="^method:"):
        F.fit_gaussian(lt, "reverse", method="newton")


def test_divergence_map_is_pointwise():
    lt = mixture([0.5, 0.5], [-2.0, 2.0], [0.8, 0.8])
    mus, sigmas = np.array([-1.0, 0.5, 2.0]), np.array([0.7, 1.9])
    vals = F.divergence_map(lt, mus, sigmas, "reverse")
    assert vals.shape == (2, 3)
    for i, s in enumerate(sigmas):
        for j, m in enumerate(mus):
            assert vals[i, j] == pytest.approx(_quad_div("reverse_kl", [0.5, 0.5], [-2, 2], [0.8, 0.8],
                                                         m, s), rel=1e-6)
    with pytest.raises(ValueError, match="^sigmas:"):
        F.divergence_map(lt, mus, np.array([1.0, -1.0]))
