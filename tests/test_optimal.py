"""Tests for klbook_lib.optimal: the closed-form optimum of E_pi[r] - beta KL(pi || pi_ref).

References are independent of the module: the objective is re-implemented directly from
its definition, maximised numerically with scipy, KLs come from scipy.special.rel_entr and
gradients from torch autograd.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.special import rel_entr

from klbook_lib import optimal

torch.set_num_threads(1)  # a shared 2-core machine: one thread is fastest


def direct_objective(pi, pi_ref, r, beta):
    """J(pi) written out from the definition, no shared code with the module."""
    return float(np.dot(pi, r) - beta * np.sum(rel_entr(pi, pi_ref)))


def problem(seed, n=24):
    rng = np.random.default_rng(seed)
    pi_ref = rng.dirichlet(np.ones(n))
    r = rng.normal(size=n)
    return pi_ref, r


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("beta", [0.2, 1.0, 5.0])
def test_closed_form_matches_scipy_maximiser(seed, beta):
    pi_ref, r = problem(seed)

    def neg_j(pi):
        return -direct_objective(pi, pi_ref, r, beta)

    def neg_j_grad(pi):  # d/dpi of -J, from the definition
        return -(r - beta * (np.log(pi / pi_ref) + 1.0))

    pi_star = optimal.optimal_policy(pi_ref, r, beta)
    j_star = direct_objective(pi_star, pi_ref, r, beta)
    rng = np.random.default_rng(100 + seed)
    n = pi_ref.size
    for _ in range(3):  # random starts in the simplex; J is concave there
        res = minimize(neg_j, rng.dirichlet(np.ones(n)), jac=neg_j_grad, method="SLSQP",
                       bounds=[(1e-12, 1.0)] * n,
                       constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1.0}],
                       options={"ftol": 1e-13, "maxiter": 1000})
        assert res.success, res.message
        # no numerical optimum may beat the closed form, and SLSQP reaches it
        assert -res.fun <= j_star + 1e-9
        assert -res.fun == pytest.approx(j_star, abs=1e-7)
        np.testing.assert_allclose(res.x, pi_star, atol=1e-4)
    # the maximum value is beta log Z
    assert direct_objective(pi_star, pi_ref, r, beta) == pytest.approx(
        beta * np.log(np.sum(pi_ref * np.exp(r / beta))), abs=1e-10)


@pytest.mark.parametrize("seed", range(5))
def test_objective_decomposition_for_random_pi(seed):
    rng = np.random.default_rng(seed)
    pi_ref, r = problem(seed, n=40)
    beta = float(rng.uniform(0.05, 5.0))
    log_z = np.log(np.sum(pi_ref * np.exp(r / beta)))
    pi_star = pi_ref * np.exp(r / beta) / np.exp(log_z)
    for _ in range(20):
        pi = rng.dirichlet(rng.uniform(0.1, 3.0) * np.ones(pi_ref.size))
        j = optimal.objective(pi, pi_ref, r, beta)
        assert j == pytest.approx(beta * log_z - beta * np.sum(rel_entr(pi, pi_star)), abs=1e-10)
        assert j == pytest.approx(direct_objective(pi, pi_ref, r, beta), abs=1e-12)
    assert optimal.log_partition(pi_ref, r, beta) == pytest.approx(log_z, abs=1e-12)


def test_random_perturbations_lower_objective():
    pi_ref, r = problem(7, n=30)
    beta = 0.5
    pi_star = optimal.optimal_policy(pi_ref, r, beta)
    j_star = direct_objective(pi_star, pi_ref, r, beta)
    rng = np.random.default_rng(0)
    for eps in (1e-3, 1e-2, 1e-1):
        for _ in range(50):
            pi = pi_star * np.exp(eps * rng.normal(size=pi_star.size))
            pi /= pi.sum()
            assert direct_objective(pi, pi_ref, r, beta) < j_star


def test_limits_in_beta():
    pi_ref, r = problem(3, n=30)
    # large beta: pi* -> pi_ref, with total variation O(1/beta)
    tv = 0.5 * np.abs(optimal.optimal_policy(pi_ref, r, 1e4) - pi_ref).sum()
    assert tv < 1e-3
    # small beta: pi* -> the argmax of r, and no overflow even for r/beta ~ 1e5
    pi_small = optimal.optimal_policy(pi_ref, r, 1e-5)
    assert np.all(np.isfinite(pi_small))
    assert pi_small[np.argmax(r)] == pytest.approx(1.0, abs=1e-12)
    log_z = optimal.log_partition(pi_ref, r, 1e-5)
    assert log_z == pytest.approx(r.max() / 1e-5 + np.log(pi_ref[np.argmax(r)]), rel=1e-9)


def test_zero_reference_mass_stays_zero():
    pi_ref = np.array([0.5, 0.0, 0.3, 0.2])
    r = np.array([0.0, 100.0, 1.0, -1.0])  # the best reward is outside the support
    pi_star = optimal.optimal_policy(pi_ref, r, 0.01)
    assert pi_star[1] == 0.0
    assert np.argmax(pi_star) == 2
    # pi with mass outside the support has infinite KL, so J = -inf
    assert optimal.objective(np.array([0.0, 1.0, 0.0, 0.0]), pi_ref, r, 1.0) == -np.inf


def test_gradient_matches_autograd():
    pi_ref, r = problem(11, n=12)
    beta = 0.7
    theta = np.random.default_rng(0).normal(size=12)
    t = torch.tensor(theta, requires_grad=True)
    log_pi = torch.log_softmax(t, 0)
    j = (log_pi.exp() * torch.tensor(r)).sum() - beta * (
        log_pi.exp() * (log_pi - torch.log(torch.tensor(pi_ref)))).sum()
    j.backward()
    np.testing.assert_allclose(optimal.objective_grad_logits(theta, pi_ref, r, beta),
                               t.grad.numpy(), atol=1e-12)


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_gradient_ascent_reaches_closed_form(beta):
    pi_ref, r = problem(5, n=30)
    pi_star = pi_ref * np.exp(r / beta)
    pi_star /= pi_star.sum()
    for seed in range(3):
        hist = optimal.maximise_objective(pi_ref, r, beta, steps=3000, seed=seed)
        np.testing.assert_allclose(hist["pi"], pi_star, atol=2e-3)
        assert hist["objective"][-1] > hist["objective"][0]
        assert hist["kl_to_optimum"][-1] < 1e-3


def test_validation_errors():
    pi_ref = np.array([0.2, 0.3, 0.5])
    r = np.zeros(3)
    with pytest.raises(ValueError, match="beta"):
        optimal.optimal_policy(pi_ref, r, 0.0)
    with pytest.raises(ValueError, match="beta"):
        optimal.log_partition(pi_ref, r, -1.0)
    with pytest.raises(ValueError, match="beta"):
        optimal.objective(pi_ref, pi_ref, r, float("nan"))
    with pytest.raises(ValueError, match="r:"):
        optimal.optimal_policy(pi_ref, np.zeros(4), 1.0)
    with pytest.raises(ValueError, match="pi_ref: probabilities must be non-negative"):
        optimal.optimal_policy(np.array([1.2, -0.2, 0.0]), r, 1.0)
    with pytest.raises(ValueError, match="pi_ref: probabilities must sum to 1"):
        optimal.optimal_policy(np.array([0.2, 0.2, 0.2]), r, 1.0)
    with pytest.raises(ValueError, match="pi:"):
        optimal.objective(np.array([0.5, 0.5]), pi_ref, r, 1.0)
    with pytest.raises(ValueError, match="r: rewards must be finite"):
        optimal.optimal_policy(pi_ref, np.array([0.0, np.inf, 0.0]), 1.0)
