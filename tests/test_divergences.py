"""Tests for klbook_lib.divergences against independent references.

References: scipy.stats.entropy (discrete KL), torch.distributions.kl_divergence
(Categorical, Normal, Independent(Normal)), scipy.spatial.distance.jensenshannon,
scipy.stats.wasserstein_distance, and hand-derived closed forms.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats as st
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from scipy.spatial.distance import jensenshannon

from klbook_lib import divergences as D

torch.set_num_threads(1)
LOG2 = math.log(2.0)


def _rand_simplex(rng, shape, zeros=False):
    x = rng.gamma(0.5, size=shape)
    if zeros:
        x = np.where(rng.random(shape) < 0.3, 0.0, x)
        x[..., 0] += 1e-3  # keep every row non-empty
    return x / x.sum(-1, keepdims=True)


# Hypothesis strategy: a pair of probability vectors of the same length (zeros allowed).
@hs.composite
def prob_pairs(draw, min_size=1, max_size=8, allow_zero=True):
    n = draw(hs.integers(min_size, max_size))
    # entries are 0 (if allowed) or in [1e-6, 1]: denormal probabilities only test underflow
    elems = hs.floats(1e-6 if allow_zero else 1e-3, 1.0, allow_nan=False, allow_infinity=False)
    if allow_zero:
        elems = hs.one_of(hs.just(0.0), elems)
    a = np.array(draw(hs.lists(elems, min_size=n, max_size=n)))
    b = np.array(draw(hs.lists(elems, min_size=n, max_size=n)))
    a[0] += 1e-3
    b[0] += 1e-3
    return a / a.sum(), b / b.sum()


# ---------------------------------------------------------------- kl vs references
def test_kl_matches_scipy_entropy_batched():
    rng = np.random.default_rng(0)
    p = _rand_simplex(rng, (5, 7))
    q = _rand_simplex(rng, (5, 7))
    ours = D.kl(p, q)
    ref = np.array([st.entropy(p[i], q[i]) for i in range(5)])
    assert isinstance(ours, np.ndarray) and ours.shape == (5,)
    np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-15)


def test_kl_axis_argument():
    rng = np.random.default_rng(1)
    p = _rand_simplex(rng, (4, 6)).T  # distributions along axis 0
    q = _rand_simplex(rng, (4, 6)).T
    np.testing.assert_allclose(D.kl(p, q, axis=0), st.entropy(p, q, axis=0), rtol=1e-12)


def test_kl_torch_matches_categorical():
    rng = np.random.default_rng(2)
    p = torch.tensor(_rand_simplex(rng, (3, 5)))
    q = torch.tensor(_rand_simplex(rng, (3, 5)))
    ours = D.kl(p, q)
    ref = torch.distributions.kl_divergence(torch.distributions.Categorical(probs=p),
                                            torch.distributions.Categorical(probs=q))
    assert isinstance(ours, torch.Tensor)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


def test_kl_zero_handling_exact():
    # 0 log 0 = 0: only the support of p counts; by hand: 0.5 log(0.5/0.25) + 0.5 log(0.5/0.25)
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.25, 0.25, 0.5])
    assert D.kl(p, q) == pytest.approx(math.log(2), rel=1e-14)
    # mass of p where q = 0 -> +inf
    assert D.kl(q, p) == math.inf
    assert D.kl(torch.tensor(q), torch.tensor(p)).item() == math.inf
    # both zero at the same place: finite
    assert np.isfinite(D.kl(np.array([1.0, 0.0]), np.array([1.0, 0.0])))


def test_kl_torch_gradient_is_finite_and_correct():
    p = torch.tensor([0.2, 0.8, 0.0], dtype=torch.float64, requires_grad=True)
    q = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64, requires_grad=True)
    D.kl(p, q).backward()
    # d/dq KL(p||q) = -p/q (closed form)
    np.testing.assert_allclose(q.grad.numpy(), -(p / q).detach().numpy())
    assert torch.isfinite(p.grad).all()


def test_kl_float32_tolerance():
    x = torch.softmax(torch.randn(4, 50_000, generator=torch.Generator().manual_seed(0)), -1)
    y = torch.softmax(torch.randn(4, 50_000, generator=torch.Generator().manual_seed(1)), -1)
    ours = D.kl(x, y)  # float32 sums are not exactly 1; must not raise
    ref = D.kl(x.double() / x.double().sum(-1, keepdim=True), y.double() / y.double().sum(-1, keepdim=True))
    torch.testing.assert_close(ours.double(), ref, rtol=1e-3, atol=1e-4)
    assert D.sum_tolerance(np.float64) == 1e-6
    assert D.sum_tolerance(torch.float32) == pytest.approx(math.sqrt(np.finfo(np.float32).eps))


# ---------------------------------------------------------------- logits
def test_kl_from_logits_matches_categorical_and_is_stable():
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(4, 10, generator=g, dtype=torch.float64) * 30  # huge logits
    lq = torch.randn(4, 10, generator=g, dtype=torch.float64) * 30
    ours = D.kl_from_logits(lp, lq)
    ref = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=lp),
                                            torch.distributions.Categorical(logits=lq))
    torch.testing.assert_close(ours, ref)
    ours_np = D.kl_from_logits(lp.numpy(), lq.numpy())
    assert isinstance(ours_np, np.ndarray)
    np.testing.assert_allclose(ours_np, ref.numpy(), rtol=1e-9, atol=1e-9)
    # logits of 1e4: softmax underflows to exact zeros, the log-domain result is still finite
    big = np.array([1e4, 0.0, -1e4])
    val = D.kl_from_logits(big, big[::-1].copy())
    assert np.isfinite(val) and val == pytest.approx(2e4, rel=1e-9)


def test_kl_from_logits_masking():
    ninf = -math.inf
    # P masks outcome 2 -> it contributes nothing; compare with probabilities
    lp = np.array([0.0, 1.0, ninf])
    lq = np.array([0.5, 0.0, 2.0])
    p = np.exp(lp) / np.exp(lp).sum()
    q = np.exp(lq) / np.exp(lq).sum()
    assert D.kl_from_logits(lp, lq) == pytest.approx(st.entropy(p, q), rel=1e-12)
    # Q masks an outcome P uses -> inf
    assert D.kl_from_logits(lq, lp) == math.inf
    assert D.kl_from_logits(torch.tensor(lq), torch.tensor(lp)).item() == math.inf


# ---------------------------------------------------------------- Gaussians
def test_gaussian_kl_matches_torch_normal():
    g = torch.Generator().manual_seed(4)
    mp, mq = torch.randn(6, generator=g), torch.randn(6, generator=g)
    sp, sq = torch.rand(6, generator=g) + 0.1, torch.rand(6, generator=g) + 0.1
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(mp, sp),
                                            torch.distributions.Normal(mq, sq))
    torch.testing.assert_close(D.gaussian_kl(mp, sp, mq, sq), ref)
    np.testing.assert_allclose(D.gaussian_kl(mp.numpy(), sp.numpy(), mq.numpy(), sq.numpy()),
                               ref.numpy(), rtol=1e-5)


def test_gaussian_kl_reduce_matches_independent_normal():
    g = torch.Generator().manual_seed(5)
    B, A = 8, 4
    mp, mq = torch.randn(B, A, generator=g), torch.randn(B, A, generator=g)
    log_std_p = torch.randn(A, generator=g) * 0.3  # state-independent std, broadcast to (B, A)
    sq = torch.rand(B, A, generator=g) + 0.2
    sp = log_std_p.exp()
    Pd = torch.distributions.Independent(torch.distributions.Normal(mp, sp.expand(B, A)), 1)
    Qd = torch.distributions.Independent(torch.distributions.Normal(mq, sq), 1)
    joint = torch.distributions.kl_divergence(Pd, Qd)
    torch.testing.assert_close(D.gaussian_kl(mp, sp, mq, sq, reduce="sum"), joint)
    torch.testing.assert_close(D.gaussian_kl(mp, sp, mq, sq, reduce="mean"), joint / A)
    assert D.gaussian_kl(mp, sp, mq, sq).shape == (B, A)


def test_gaussian_kl_closed_form_by_hand():
    # N(0,1) vs N(1, 2^2): log 2 + (1 + 1)/8 - 1/2
    assert float(D.gaussian_kl(0.0, 1.0, 1.0, 2.0)) == pytest.approx(math.log(2) + 0.25 - 0.5)
    assert float(D.gaussian_kl(0.3, 0.7, 0.3, 0.7)) == 0.0


def test_gaussian_kl_matches_discretised_kl():
    # brute force: KL of fine discretisations converges to the continuous KL
    x = np.linspace(-15, 15, 200_001)
    p = st.norm.pdf(x, 0.5, 0.8)
    q = st.norm.pdf(x, -1.0, 1.7)
    p, q = p / p.sum(), q / q.sum()
    assert D.kl(p, q) == pytest.approx(float(D.gaussian_kl(0.5, 0.8, -1.0, 1.7)), rel=1e-6)


# ---------------------------------------------------------------- relatives
def test_js_matches_scipy_and_bounds():
    rng = np.random.default_rng(6)
    p = _rand_simplex(rng, (5, 9), zeros=True)
    q = _rand_simplex(rng, (5, 9), zeros=True)
    ref = jensenshannon(p, q, axis=-1) ** 2  # scipy returns the JS *distance* (sqrt), natural log
    np.testing.assert_allclose(D.js(p, q), ref, rtol=1e-9, atol=1e-12)
    # disjoint supports reach log 2 exactly
    assert D.js([1.0, 0.0], [0.0, 1.0]) == pytest.approx(LOG2, rel=1e-15)
    torch.testing.assert_close(D.js(torch.tensor(p), torch.tensor(q)), torch.tensor(ref))


def test_total_variation_equals_max_event_difference():
    # brute force over all events A: TV = max_A P(A) - Q(A)
    rng = np.random.default_rng(7)
    p, q = _rand_simplex(rng, 6), _rand_simplex(rng, 6)
    best = 0.0
    for mask in range(1 << 6):
        idx = [(mask >> i) & 1 == 1 for i in range(6)]
        best = max(best, p[idx].sum() - q[idx].sum())
    assert D.total_variation(p, q) == pytest.approx(best, rel=1e-12)


def test_symmetric_kl():
    p, q = np.array([0.1, 0.9]), np.array([0.6, 0.4])
    assert D.symmetric_kl(p, q) == pytest.approx(st.entropy(p, q) + st.entropy(q, p))
    assert D.symmetric_kl([1.0, 0.0], [0.5, 0.5]) == math.inf


# ---------------------------------------------------------------- f-divergences
def test_f_divergence_generators_reproduce_direct_formulas():
    rng = np.random.default_rng(8)
    p = _rand_simplex(rng, (4, 7))
    q = _rand_simplex(rng, (4, 7))
    np.testing.assert_allclose(D.f_divergence(p, q, "kl"), st.entropy(p, q, axis=-1), rtol=1e-10)
    np.testing.assert_allclose(D.f_divergence(p, q, D.F_KL), D.kl(p, q), rtol=1e-10)
    np.testing.assert_allclose(D.f_divergence(p, q, "reverse_kl"), st.entropy(q, p, axis=-1),
                               rtol=1e-10)
    np.testing.assert_allclose(D.f_divergence(p, q, "js"), jensenshannon(p, q, axis=-1) ** 2,
                               rtol=1e-9)
    np.testing.assert_allclose(D.f_divergence(p, q, "tv"), 0.5 * np.abs(p - q).sum(-1), rtol=1e-10)
    np.testing.assert_allclose(D.f_divergence(p, q, "chi2"), ((p - q) ** 2 / q).sum(-1), rtol=1e-10)


def test_f_divergence_zero_conventions():
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.5, 0.0, 0.5])
    # JS and TV stay finite when supports differ; compare with scipy / direct formula
    assert D.f_divergence(p, q, "js") == pytest.approx(jensenshannon(p, q) ** 2, rel=1e-12)
    assert D.f_divergence(p, q, "tv") == pytest.approx(0.5)
    assert D.f_divergence(p, q, "kl") == math.inf
    assert D.f_divergence(p, q, "reverse_kl") == math.inf
    # a plain callable: Hellinger-type generator (sqrt t - 1)^2, squared Hellinger x2
    p2, q2 = np.array([0.2, 0.8]), np.array([0.5, 0.5])
    val = D.f_divergence(p2, q2, lambda t: (np.sqrt(t) - 1) ** 2)
    assert val == pytest.approx(((np.sqrt(p2) - np.sqrt(q2)) ** 2).sum())
    with pytest.raises(ValueError, match="f:"):
        D.f_divergence(p2, q2, lambda t: t)  # f(1) != 0
    with pytest.raises(ValueError, match="f:"):
        D.f_divergence(p2, q2, "hellinger-typo")
    with pytest.raises(ValueError, match="q:"):
        D.f_divergence(p, q, lambda t: (t - 1) ** 2)


# ---------------------------------------------------------------- Wasserstein
def test_wasserstein_matches_scipy():
    rng = np.random.default_rng(9)
    for _ in range(20):
        n, m = rng.integers(1, 30, size=2)
        u, v = rng.normal(size=n) * 3, rng.normal(1.0, 2.0, size=m)
        uw, vw = rng.random(n), rng.random(m)
        assert D.wasserstein_1d(u, v) == pytest.approx(st.wasserstein_distance(u, v), rel=1e-10)
        assert D.wasserstein_1d(u, v, uw, vw) == pytest.approx(
            st.wasserstein_distance(u, v, uw, vw), rel=1e-10, abs=1e-12)


def test_wasserstein_shift_closed_form():
    # shifting a distribution by c moves every unit of mass by c
    u = np.array([0.0, 1.0, 5.0])
    assert D.wasserstein_1d(u, u + 2.5) == pytest.approx(2.5)


# ---------------------------------------------------------------- properties
@settings(max_examples=150, deadline=None)
@given(prob_pairs())
def test_properties_nonneg_identity_bounds(pair):
    p, q = pair
    assert D.kl(p, q) >= -1e-12
    assert abs(D.kl(p, p)) <= 1e-12
    j = D.js(p, q)
    assert -1e-12 <= j <= LOG2 + 1e-12
    assert D.js(p, q) == pytest.approx(D.js(q, p), abs=1e-12)
    tv = D.total_variation(p, q)
    assert -1e-15 <= tv <= 1 + 1e-12
    # Pinsker: TV <= sqrt(KL/2)
    k = D.kl(p, q)
    if np.isfinite(k):
        assert tv <= math.sqrt(max(k, 0.0) / 2) + 1e-9


@settings(max_examples=100, deadline=None)
@given(prob_pairs(max_size=5), prob_pairs(max_size=5))
def test_chain_rule_for_product_distributions(pair1, pair2):
    (p1, q1), (p2, q2) = pair1, pair2
    joint_p = np.outer(p1, p2).ravel()
    joint_q = np.outer(q1, q2).ravel()
    lhs = D.kl(joint_p, joint_q)
    rhs = D.kl(p1, q1) + D.kl(p2, q2)
    if np.isinf(rhs):
        assert np.isinf(lhs)
    else:
        assert lhs == pytest.approx(rhs, rel=1e-9, abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(prob_pairs(allow_zero=False))
def test_f_kl_equals_kl_property(pair):
    p, q = pair
    assert D.f_divergence(p, q, D.F_KL) == pytest.approx(D.kl(p, q), rel=1e-9, abs=1e-12)
    assert D.f_divergence(p, q, D.F_REVERSE_KL) == pytest.approx(D.kl(q, p), rel=1e-9, abs=1e-12)


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("fn", [D.kl, D.js, D.total_variation, D.symmetric_kl,
                                lambda p, q: D.f_divergence(p, q, "kl")])
def test_bad_probabilities_raise_naming_argument(fn):
    good = np.array([0.5, 0.5])
    with pytest.raises(ValueError, match=r"^p: .*non-negative"):
        fn(np.array([-0.1, 1.1]), good)
    with pytest.raises(ValueError, match=r"^q: .*non-negative"):
        fn(good, np.array([1.2, -0.2]))
    with pytest.raises(ValueError, match=r"^p: .*sum to 1"):
        fn(np.array([0.5, 0.6]), good)
    with pytest.raises(ValueError, match=r"^q: .*sum to 1"):
        fn(good, np.array([0.5, 0.5 + 1e-5]))
    with pytest.raises(ValueError, match=r"^q: shape"):
        fn(good, np.array([0.5, 0.25, 0.25]))
    with pytest.raises(ValueError, match=r"^q: shape"):  # would broadcast, must not
        fn(np.full((3, 2), 0.5), good)
    with pytest.raises(ValueError, match=r"^p: contains NaN"):
        fn(np.array([np.nan, 0.5]), good)
    with pytest.raises(ValueError, match=r"^q: contains NaN"):
        fn(torch.tensor([0.5, 0.5]), torch.tensor([0.5, float("nan")]))


def test_sum_within_tolerance_accepted():
    assert np.isfinite(D.kl(np.array([0.5, 0.5 + 5e-7]), np.array([0.5, 0.5])))


def test_bad_logits_raise():
    with pytest.raises(ValueError, match=r"^logits_q: shape"):
        D.kl_from_logits(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match=r"^logits_p: contains NaN"):
        D.kl_from_logits(np.array([0.0, np.nan]), np.zeros(2))
    with pytest.raises(ValueError, match=r"^logits_q: .*\+inf"):
        D.kl_from_logits(np.zeros(2), np.array([0.0, np.inf]))
    with pytest.raises(ValueError, match=r"^logits_p: every logit"):
        D.kl_from_logits(np.array([-np.inf, -np.inf]), np.zeros(2))


def test_bad_gaussians_raise():
    with pytest.raises(ValueError, match=r"^std_p: .*positive"):
        D.gaussian_kl(0.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"^std_q: .*positive"):
        D.gaussian_kl(0.0, 1.0, 0.0, torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"^mu_q: contains NaN"):
        D.gaussian_kl(0.0, 1.0, float("nan"), 1.0)
    with pytest.raises(ValueError, match=r"^mu_q/std_q: shape"):
        D.gaussian_kl(np.zeros(3), 1.0, np.zeros((2, 3)), 1.0)
    with pytest.raises(ValueError, match=r"^reduce:"):
        D.gaussian_kl(np.zeros(3), 1.0, np.zeros(3), 1.0, reduce="max")


def test_bad_wasserstein_raise():
    with pytest.raises(ValueError, match=r"^u_weights: .*non-negative"):
        D.wasserstein_1d([0.0, 1.0], [0.0], u_weights=[1.0, -1.0])
    with pytest.raises(ValueError, match=r"^v_weights: shape"):
        D.wasserstein_1d([0.0, 1.0], [0.0], v_weights=[1.0, 1.0])
    with pytest.raises(ValueError, match=r"^v_values: contains NaN"):
        D.wasserstein_1d([0.0], [np.nan])
    with pytest.raises(ValueError, match=r"^u_values: must be a non-empty"):
        D.wasserstein_1d([], [1.0])
