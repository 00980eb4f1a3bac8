"""Tests for klbook_lib.estimators against independent references.

References: closed-form Gaussian KL (torch.distributions), scipy.stats.entropy,
brute-force sums over all categories, scipy quadrature, pandas' EWM and the
textbook closed-form gradients of categorical KL with respect to logits.
Statistical tests use fixed seeds and a tolerance of 5 standard errors computed
from the sample itself (a false alarm would have probability below 1e-6 per check).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats
from torch.distributions import Categorical, Normal, kl_divergence

from klbook_lib import estimators as E

torch.set_num_threads(1)
Z = 5.0  # tolerance in standard errors


def _gauss_logs(mu_q, s_q, n, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(dtype)  # x ~ p = N(0, 1)
    return stats.norm.logpdf(x), stats.norm.logpdf(x, mu_q, s_q)


def _gauss_kl(mu_q, s_q):
    return float(kl_divergence(Normal(0.0, 1.0), Normal(float(mu_q), float(s_q))))


@pytest.mark.parametrize("name", ["k1", "k3"])
@pytest.mark.parametrize("mu_q,s_q", [(0.3, 1.0), (1.0, 1.2), (-0.5, 0.9)])
def test_unbiased_gaussian(name, mu_q, s_q):
    logp, logq = _gauss_logs(mu_q, s_q, 200_000, seed=11)
    vals = E.ESTIMATORS[name](logp, logq)
    se = vals.std(ddof=1) / math.sqrt(vals.size)
    assert abs(vals.mean() - _gauss_kl(mu_q, s_q)) < Z * se


def test_unbiased_gaussian_torch_input():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(100_000, generator=g, dtype=torch.float64)
    p, q = Normal(0.0, 1.0), Normal(0.7, 1.5)
    true = float(kl_divergence(p, q))
    for f in (E.k1, E.k3):
        vals = f(p.log_prob(x), q.log_prob(x))
        assert isinstance(vals, torch.Tensor) and vals.dtype == torch.float64
        se = float(vals.std()) / math.sqrt(vals.numel())
        assert abs(float(vals.mean()) - true) < Z * se


@pytest.mark.parametrize("mu_q,s_q", [(0.3, 1.0), (1.0, 1.0), (0.0, 0.8), (0.5, 1.1)])
def test_k3_swapped_unbiased_for_the_other_direction(mu_q, s_q):
    """Samples from p = N(0, 1); r log r - (r - 1) estimates KL(q || p), not KL(p || q).
    (Pairs with s_q**2 well below 2, where the estimator's variance is finite.)"""
    logp, logq = _gauss_logs(mu_q, s_q, 200_000, seed=5)
    vals = E.k3_swapped(logp, logq)
    se = vals.std(ddof=1) / math.sqrt(vals.size)
    other = float(kl_divergence(Normal(float(mu_q), float(s_q)), Normal(0.0, 1.0)))
    assert abs(vals.mean() - other) < Z * se
    # and it is distinguishable from the KL it does not estimate (where the two differ)
    if abs(other - _gauss_kl(mu_q, s_q)) > 0.01:
        assert abs(vals.mean() - _gauss_kl(mu_q, s_q)) > Z * se


@pytest.mark.parametrize("seed", range(3))
def test_k3_swapped_brute_force_categorical(seed):
    """E_p[r log r - (r - 1)] as an exact sum over all categories equals KL(q || p)."""
    p, q = _random_categorical(7, seed)
    vals = E.k3_swapped(np.log(p), np.log(q))
    assert np.sum(p * vals) == pytest.approx(stats.entropy(q, p), rel=1e-10)
    t = E.k3_swapped(torch.tensor(np.log(p)), torch.tensor(np.log(q)))
    assert isinstance(t, torch.Tensor) and float((torch.tensor(p) * t).sum()) == pytest.approx(stats.entropy(q, p), rel=1e-10)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(min_value=-30, max_value=30, allow_nan=False),
                          st.floats(min_value=-30, max_value=30, allow_nan=False)), min_size=1, max_size=20))
def test_k3_swapped_nonnegative(pairs):
    logp = np.array([a for a, _ in pairs])
    logq = np.array([b for _, b in pairs])
    assert np.all(E.k3_swapped(logp, logq) >= 0)
    with pytest.raises(ValueError, match="^logp"):
        E.k3_swapped(np.array([np.nan]), np.array([0.0]))


def _random_categorical(k, seed):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(k)), rng.dirichlet(np.ones(k))


@pytest.mark.parametrize("seed", range(5))
def test_expectations_brute_force_categorical(seed):
    """E_p[k] as an exact sum over all categories: k1, k3 give KL; k2 gives E[lr^2]/2."""
    p, q = _random_categorical(7, seed)
    logp, logq = np.log(p), np.log(q)
    true = stats.entropy(p, q)
    assert np.sum(p * E.k1(logp, logq)) == pytest.approx(true, rel=1e-12)
    assert np.sum(p * E.k3(logp, logq)) == pytest.approx(true, rel=1e-10)
    lr = np.log(q / p)
    assert np.sum(p * E.k2(logp, logq)) == pytest.approx(0.5 * np.sum(p * lr**2), rel=1e-12)


def test_k2_expectation_gaussian_quadrature():
    mu_q, s_q = 0.5, 1.3

    def lr(x):
        return stats.norm.logpdf(x, mu_q, s_q) - stats.norm.logpdf(x)

    expected, _ = integrate.quad(lambda x: stats.norm.pdf(x) * lr(x) ** 2 / 2, -np.inf, np.inf)
    logp, logq = _gauss_logs(mu_q, s_q, 200_000, seed=5)
    vals = E.k2(logp, logq)
    se = vals.std(ddof=1) / math.sqrt(vals.size)
    assert abs(vals.mean() - expected) < Z * se
    # and it is biased: far from the true KL for this pair
    assert abs(expected - _gauss_kl(mu_q, s_q)) > 10 * se


def test_k2_close_to_kl_for_close_distributions():
    """E[k2] - KL = O(eps^3): the relative error shrinks linearly as q -> p."""
    rel = []
    for eps in (0.2, 0.1, 0.05):
        p = np.array([0.2, 0.3, 0.5])
        q = p * np.exp(eps * np.array([1.0, -1.0, 0.5]))
        q /= q.sum()
        true = stats.entropy(p, q)
        ek2 = np.sum(p * E.k2(np.log(p), np.log(q)))
        rel.append(abs(ek2 - true) / true)
    assert rel[0] > rel[1] > rel[2]
    assert rel[2] < 0.05
    assert rel[1] / rel[2] == pytest.approx(2.0, rel=0.2)


finite_logs = st.floats(min_value=-60, max_value=60, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(finite_logs, finite_logs), min_size=1, max_size=20))
def test_k3_and_k2_nonnegative(pairs):
    logp = np.array([a for a, _ in pairs])
    logq = np.array([b for _, b in pairs])
    assert np.all(E.k3(logp, logq) >= 0)
    assert np.all(E.k2(logp, logq) >= 0)
    for dtype in (torch.float64, torch.float32):
        t = E.k3(torch.tensor(logp, dtype=dtype), torch.tensor(logq, dtype=dtype))
        assert bool((t >= 0).all())


@settings(max_examples=100, deadline=None)
@given(finite_logs, finite_logs, st.floats(min_value=0, max_value=30))
def test_clamp_bounds_log_ratio(lp, lq, c):
    lr = E.log_ratio(np.array([lp]), np.array([lq]), clamp=c)
    assert -c <= lr[0] <= c
    assert E.k1(np.array([lp]), np.array([lq]), clamp=c)[0] == pytest.approx(-np.clip(lq - lp, -c, c))


def test_k1_negative_for_some_samples_and_small_batches():
    logp, logq = _gauss_logs(0.3, 1.0, 10_000, seed=2)
    v1 = E.k1(logp, logq)
    assert np.mean(v1 < 0) > 0.2  # every x with q(x) > p(x) gives k1 < 0
    batch_means = v1.reshape(-1, 4).mean(1)
    assert np.any(batch_means < 0)
    assert np.all(E.k3(logp, logq) >= 0)


def test_types_and_dtypes_preserved():
    a32 = torch.tensor([0.0, -1.0], dtype=torch.float32)
    b32 = torch.tensor([-0.5, -0.2], dtype=torch.float32)
    for f in (E.k1, E.k2, E.k3):
        out = f(a32, b32)
        assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
        out_np = f(a32.numpy(), b32.numpy())
        assert isinstance(out_np, np.ndarray) and out_np.dtype == np.float32
        np.testing.assert_allclose(out.numpy(), out_np, rtol=1e-6)
    assert E.k1(0.0, -1.0) == pytest.approx(1.0)  # Python floats work too
    assert E.k3(0.0, -1.0) == pytest.approx(math.exp(-1) - 1 + 1)


def test_k3_overflow_and_clamp():
    logp = torch.tensor([-100.0], dtype=torch.float32)
    logq = torch.tensor([0.0], dtype=torch.float32)  # lr = 100: exp overflows float32
    assert torch.isinf(E.k3(logp, logq)).all()
    v = E.k3(logp, logq, clamp=20.0)
    assert torch.isfinite(v).all()
    assert float(v) == pytest.approx(math.exp(20) - 1 - 20, rel=1e-6)
    h = E.k3(torch.tensor([0.0], dtype=torch.float16), torch.tensor([12.0], dtype=torch.float16))
    assert torch.isinf(h).all()  # exp(12) > 65504, the float16 maximum
    assert torch.isfinite(E.k3(torch.tensor([0.0], dtype=torch.float16),
                                torch.tensor([12.0], dtype=torch.float16), clamp=5.0)).all()


def test_clamp_costs_bias():
    """Clamping lr makes k3 biased: measured against the closed-form KL."""
    logp, logq = _gauss_logs(0.0, 3.0, 200_000, seed=9)
    true = _gauss_kl(0.0, 3.0)
    clamped = E.k3(logp, logq, clamp=1.0)
    se = clamped.std(ddof=1) / math.sqrt(clamped.size)
    assert true - clamped.mean() > 10 * se  # clamped k3 underestimates here


@pytest.mark.parametrize("bad", ["shape", "nan_p", "nan_q", "clamp", "posinf", "logp_neginf"])
def test_validation_errors(bad):
    a, b = np.zeros(3), np.zeros(3)
    with pytest.raises(ValueError) as err:
        if bad == "shape":
            E.k1(a, np.zeros(4))
        elif bad == "nan_p":
            E.k2(np.array([0.0, np.nan]), np.zeros(2))
        elif bad == "nan_q":
            E.k3(torch.zeros(2), torch.tensor([0.0, float("nan")]))
        elif bad == "clamp":
            E.k3(a, b, clamp=-1.0)
        elif bad == "posinf":
            E.k1(a, np.array([0.0, np.inf, 0.0]))
        else:
            E.k1(np.array([-np.inf]), np.array([0.0]))
    expected = {"shape": "logq", "nan_p": "logp", "nan_q": "logq", "clamp": "clamp",
                "posinf": "logq", "logp_neginf": "logp"}[bad]
    assert str(err.value).startswith(expected)


def test_logq_minus_inf_gives_infinite_estimate():
    assert np.isinf(E.k1(np.array([-1.0]), np.array([-np.inf])))[0]


def test_exact_kl_categorical_vs_torch_and_scipy():
    g = torch.Generator().manual_seed(0)
    zp = torch.randn(6, 5, generator=g, dtype=torch.float64) * 2
    zq = torch.randn(6, 5, generator=g, dtype=torch.float64) * 2
    ref = kl_divergence(Categorical(logits=zp), Categorical(logits=zq))
    got = E.exact_kl_categorical(zp, zq)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, ref)
    got_np = E.exact_kl_categorical(zp.numpy(), zq.numpy())
    p = torch.softmax(zp, -1).numpy()
    q = torch.softmax(zq, -1).numpy()
    np.testing.assert_allclose(got_np, stats.entropy(p, q, axis=-1), rtol=1e-10)


def test_exact_kl_categorical_zero_probabilities():
    zp = np.array([0.0, -np.inf, 1.0])
    zq = np.array([0.0, 0.0, 0.0])
    p = np.array([1.0, 0.0, math.e]) / (1 + math.e)
    assert E.exact_kl_categorical(zp, zq) == pytest.approx(stats.entropy(p, np.ones(3) / 3))
    assert np.isinf(E.exact_kl_categorical(zq, zp))  # q = 0 where p > 0
    with pytest.raises(ValueError, match="^logits_q"):
        E.exact_kl_categorical(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="^logits_p"):
        E.exact_kl_categorical(np.array([np.nan, 0.0]), np.zeros(2))


def test_ema_matches_pandas():
    v = np.random.default_rng(0).standard_normal(50)
    for alpha in (1.0, 0.3, 0.05):
        ref = pd.Series(v).ewm(alpha=alpha, adjust=False).mean().to_numpy()
        np.testing.assert_allclose(E.ema(v, alpha), ref, rtol=1e-12)
    with pytest.raises(ValueError, match="^alpha"):
        E.ema(v, 0.0)
    with pytest.raises(ValueError, match="^values"):
        E.ema(np.zeros((2, 2)), 0.5)


def _closed_form_grads(zt, zr):
    """d/dz KL(pi||ref) = pi * (log pi - log ref - KL); d/dz KL(ref||pi) = pi - ref."""
    pi, ref = torch.softmax(zt, -1), torch.softmax(zr, -1)
    lpi, lref = torch.log(pi), torch.log(ref)
    kl = torch.sum(pi * (lpi - lref))
    return pi * (lpi - lref - kl), pi - ref


@pytest.mark.parametrize("seed", [0, 1])
def test_loss_gradients_on_policy(seed):
    g = torch.Generator().manual_seed(100 + seed)
    zt = torch.randn(6, generator=g, dtype=torch.float64)
    zr = torch.randn(6, generator=g, dtype=torch.float64)
    res = E.loss_gradients(zt, zr, n_samples=200_000, seed=seed)
    g_rev, g_fwd = _closed_form_grads(zt, zr)
    torch.testing.assert_close(res["exact_reverse"], g_rev)
    torch.testing.assert_close(res["exact_forward"], g_fwd)
    # reverse and forward gradients differ clearly for this pair
    assert float((g_rev - g_fwd).abs().max()) > 0.05

    def within(name, target):
        m, se = res[name]["mean"], res[name]["se"]
        assert torch.all((m - target).abs() <= Z * se + 1e-12), (name, m, target, se)

    within("k1", torch.zeros(6, dtype=torch.float64))
    within("k2", g_rev)
    within("k3", g_fwd)          # k3 as a loss follows the FORWARD KL
    within("k1_score", g_rev)
    within("k3_is", g_rev)
    # and k3 is NOT following the reverse gradient (many standard errors away)
    assert float(((res["k3"]["mean"] - g_rev).abs() / res["k3"]["se"]).max()) > 20
    # k2, the score-function k1 and importance-weighted k3 give identical per-sample gradients
    torch.testing.assert_close(res["per_action"]["k2"], res["per_action"]["k1_score"])
    torch.testing.assert_close(res["per_action"]["k3_is"], res["per_action"]["k1_score"])


def test_loss_gradients_validation():
    with pytest.raises(ValueError, match="^n_samples"):
        E.loss_gradients(torch.zeros(3), torch.zeros(3), n_samples=1)
    with pytest.raises(ValueError, match="^logits_ref"):
        E.loss_gradients(torch.zeros(3), torch.zeros(4), n_samples=10)
