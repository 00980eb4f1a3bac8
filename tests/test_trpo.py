"""Tests for klbook_lib.trpo against independent references.

References used: a hand-derived closed form for the short corridor, power-series policy
evaluation, torch autograd for score functions and the KL Hessian, central finite differences
for the policy gradient, numpy's pseudo-inverse for the natural gradient.
"""
import math

import numpy as np
import pytest
import torch

from klbook_lib import trpo as T


def random_problem(seed, S=4, A=3, k=5, gamma=0.9):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(S) * 0.5, size=(S, A)) * 0.97   # 3% chance to terminate
    R = rng.normal(size=(S, A))
    mu = rng.dirichlet(np.ones(S))
    phi = rng.normal(size=(S, A, k))
    theta = rng.normal(size=k)
    return T.TabularMDP(P, R, gamma, mu), phi, theta


def test_short_corridor_closed_form():
    # Hand derivation (undiscounted): V0 = (2p - 4) / (p (1 - p)), maximised at p = 2 - sqrt(2)
    # with value about -11.66 (Sutton & Barto report p ~ 0.59, v ~ -11.6).
    mdp, phi = T.short_corridor(gamma=1.0)
    for p in [0.1, 0.3, 0.5, 2 - math.sqrt(2), 0.8, 0.95]:
        theta = np.array([0.0, math.log(p / (1 - p))])
        J = T.evaluate(mdp, T.policy_probs(phi, theta)).J
        assert J == pytest.approx((2 * p - 4) / (p * (1 - p)), rel=1e-10)
    ps = np.linspace(0.01, 0.99, 981)
    Js = [T.evaluate(mdp, np.tile([1 - p, p], (3, 1))).J for p in ps]
    assert ps[int(np.argmax(Js))] == pytest.approx(2 - math.sqrt(2), abs=1e-3)


def test_evaluate_matches_power_series():
    mdp, phi, theta = random_problem(0)
    pi = T.policy_probs(phi, theta)
    ev = T.evaluate(mdp, pi)
    P_pi = np.einsum("sa,sat->st", pi, mdp.P)
    r_pi = (pi * mdp.R).sum(1)
    occ = mdp.mu.copy()
    J, eta = 0.0, np.zeros(mdp.n_states)
    for t in range(2000):
        J += occ @ r_pi
        eta += occ
        occ = mdp.gamma * occ @ P_pi
    assert ev.J == pytest.approx(J, rel=1e-9)
    np.testing.assert_allclose(ev.eta, eta, rtol=1e-9)
    np.testing.assert_allclose((pi * ev.A).sum(1), 0, atol=1e-10)


def test_policy_gradient_matches_finite_differences():
    mdp, phi, theta = random_problem(1)
    g = T.policy_gradient(mdp, phi, theta)
    h = 1e-5
    fd = np.zeros_like(theta)
    for i in range(theta.size):
        e = np.zeros_like(theta)
        e[i] = h
        fd[i] = (T.evaluate(mdp, T.policy_probs(phi, theta + e)).J
                 - T.evaluate(mdp, T.policy_probs(phi, theta - e)).J) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def test_surrogate_gradient_is_policy_gradient_and_zero_at_old():
    mdp, phi, theta = random_problem(2)
    assert T.surrogate(mdp, phi, theta, theta) == pytest.approx(0.0, abs=1e-12)
    h = 1e-6
    fd = np.array([(T.surrogate(mdp, phi, theta, theta + h * e)
                    - T.surrogate(mdp, phi, theta, theta - h * e)) / (2 * h)
                   for e in np.eye(theta.size)])
    np.testing.assert_allclose(fd, T.policy_gradient(mdp, phi, theta), rtol=1e-6, atol=1e-8)


def test_fisher_matches_bruteforce_outer_products_of_autograd_scores():
    mdp, phi, theta = random_problem(3)
    d = T.evaluate(mdp, T.policy_probs(phi, theta)).d
    th = torch.tensor(theta, requires_grad=True)
    ph = torch.tensor(phi)
    logp = torch.log_softmax(ph @ th, dim=1)
    F_bf = np.zeros((theta.size, theta.size))
    S, A = logp.shape
    for s in range(S):
        for a in range(A):
            (score,) = torch.autograd.grad(logp[s, a], th, retain_graph=True)
            score = score.numpy()
            F_bf += d[s] * math.exp(logp[s, a].item()) * np.outer(score, score)
    np.testing.assert_allclose(T.fisher(phi, theta, d), F_bf, rtol=1e-10, atol=1e-12)


def test_fisher_is_hessian_of_mean_kl():
    mdp, phi, theta = random_problem(4)
    d = T.evaluate(mdp, T.policy_probs(phi, theta)).d
    p_old = torch.tensor(T.policy_probs(phi, theta))
    ph, dd = torch.tensor(phi), torch.tensor(d)

    def kl(th):
        logq = torch.log_softmax(ph @ th, dim=1)
        return (dd * (p_old * (p_old.log() - logq)).sum(1)).sum()

    H = torch.autograd.functional.hessian(kl, torch.tensor(theta)).numpy()
    np.testing.assert_allclose(T.fisher(phi, theta, d), H, rtol=1e-8, atol=1e-10)


def test_mean_kl_matches_torch_distributions():
    mdp, phi, theta = random_problem(5)
    theta2 = theta + 0.3
    theta2[0] -= 1.0
    d = T.evaluate(mdp, T.policy_probs(phi, theta)).d
    p = torch.distributions.Categorical(probs=torch.tensor(T.policy_probs(phi, theta)))
    q = torch.distributions.Categorical(probs=torch.tensor(T.policy_probs(phi, theta2)))
    ref = float((torch.tensor(d) * torch.distributions.kl_divergence(p, q)).sum())
    assert T.mean_kl(phi, theta, theta2, d) == pytest.approx(ref, rel=1e-10)


def test_kl_is_second_order_in_the_step():
    # KLbar(theta + t u) / t^2 -> 1/2 u^T F u as t -> 0, with error O(t).
    mdp, phi, theta = random_problem(6)
    d = T.evaluate(mdp, T.policy_probs(phi, theta)).d
    F = T.fisher(phi, theta, d)
    u = np.random.default_rng(0).normal(size=theta.size)
    quad = 0.5 * u @ F @ u
    errs = []
    for t in [1e-1, 1e-2, 1e-3]:
        ratio = T.mean_kl(phi, theta, theta + t * u, d) / t**2
        errs.append(abs(ratio - quad))
    assert errs[2] < 2e-3 * quad
    assert errs[1] < errs[0] / 5 and errs[2] < errs[1] / 5   # shrinks about linearly in t


def test_conjugate_gradient_gives_pseudoinverse_solution_on_singular_fisher():
    # tabular softmax: F is singular (adding a constant to one state's logits changes nothing)
    S, A = 3, 4
    phi = T.tabular_features(S, A)
    mdp, _, _ = random_problem(7, S=S, A=A)
    theta = np.random.default_rng(1).normal(size=S * A)
    ev = T.evaluate(mdp, T.policy_probs(phi, theta))
    F = T.fisher(phi, theta, ev.d)
    assert np.linalg.matrix_rank(F, tol=1e-10) == S * (A - 1)
    g = T.policy_gradient(mdp, phi, theta)
    x = T.conjugate_gradient(lambda v: F @ v, g, iters=100)
    np.testing.assert_allclose(x, np.linalg.pinv(F, rcond=1e-10) @ g, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("delta", [1e-3, 1e-2, 0.1])
def test_natural_step_respects_kl_after_line_search(seed, delta):
    mdp, phi, theta = random_problem(10 + seed)
    res = T.natural_gradient_step(mdp, phi, theta, delta)
    assert res.accepted
    d = T.evaluate(mdp, T.policy_probs(phi, theta)).d
    kl = T.mean_kl(phi, theta, res.theta, d)       # recomputed independently of res.kl
    assert kl <= delta * (1 + 1e-12)
    assert res.surrogate_gain > 0
    # the full step was scaled so that the quadratic model of the KL equals delta
    F = T.fisher(phi, theta, d)
    full = res.step / res.step_fraction
    assert 0.5 * full @ F @ full == pytest.approx(delta, rel=1e-6)
    # direction is the natural gradient F^+ g
    ng = np.linalg.pinv(F) @ T.policy_gradient(mdp, phi, theta)
    cos = full @ ng / np.linalg.norm(full) / np.linalg.norm(ng)
    assert cos == pytest.approx(1.0, abs=1e-6)


def test_short_corridor_trpo_improves_and_big_gradient_step_overshoots():
    mdp, phi = T.short_corridor(gamma=0.99)
    theta0 = np.array([0.0, math.log(0.2 / 0.8)])
    J0 = T.evaluate(mdp, T.policy_probs(phi, theta0)).J
    trpo = T.natural_gradient_step(mdp, phi, theta0, delta=0.02)
    assert trpo.kl <= 0.02 and trpo.J_after > J0
    pg = T.gradient_step(mdp, phi, theta0, lr=0.3)
    assert pg.kl > 10 * 0.02          # far outside the trust region
    assert pg.J_after < J0            # and the true objective got worse
    assert pg.surrogate_gain > 0      # although the surrogate promised a gain


def test_train_history_shapes_and_monotone_trpo_early():
    mdp, phi = T.short_corridor()
    h = T.train(mdp, phi, np.array([0.0, math.log(0.25)]), 5, "trpo", delta=0.01)
    assert len(h["J"]) == len(h["kl"]) == 6
    assert all(b > a for a, b in zip(h["J"], h["J"][1:]))
    assert max(h["kl"]) <= 0.01


@pytest.mark.parametrize("call, name", [
    (lambda m, f: T.natural_gradient_step(m, f, np.zeros(2), delta=0.0), "delta"),
    (lambda m, f: T.natural_gradient_step(m, f, np.zeros(3), delta=0.1), "theta"),
    (lambda m, f: T.natural_gradient_step(m, f, np.zeros(2), 0.1, backtrack=1.0), "backtrack"),
    (lambda m, f: T.gradient_step(m, f, np.zeros(2), lr=-1.0), "lr"),
    (lambda m, f: T.train(m, f, np.zeros(2), 3, method="sgd"), "method"),
    (lambda m, f: T.TabularMDP(m.P * 2, m.R, 0.9, m.mu), "P"),
    (lambda m, f: T.TabularMDP(m.P, m.R, 1.5, m.mu), "gamma"),
    (lambda m, f: T.TabularMDP(m.P, m.R, 0.9, np.array([0.5, 0.0, 0.0])), "mu"),
    (lambda m, f: T.evaluate(m, np.ones((2, 2))), "pi"),
    (lambda m, f: T.policy_probs(f, np.array([np.nan, 0.0])), "theta"),
])
def test_bad_arguments(call, name):
    mdp, phi = T.short_corridor()
    with pytest.raises(ValueError, match=name):
        call(mdp, phi)


def test_deterministic_policy_that_never_ends_is_reported():
    mdp, phi = T.short_corridor(gamma=1.0)
    with pytest.raises(ValueError, match="pi"):
        T.evaluate(mdp, np.tile([0.0, 1.0], (3, 1)))


def test_penalty_step_is_stationary_point_by_finite_differences():
    mdp, phi, theta = random_problem(20)
    beta = 2.0
    res = T.penalty_step(mdp, phi, theta, beta)
    d = T.evaluate(mdp, T.policy_probs(phi, theta)).d

    def obj(th):
        return T.surrogate(mdp, phi, theta, th) - beta * T.mean_kl(phi, theta, th, d)

    h = 1e-5
    grad = np.array([(obj(res.theta + h * e) - obj(res.theta - h * e)) / (2 * h)
                     for e in np.eye(theta.size)])
    assert np.abs(grad).max() < 1e-5
    # a maximum: random perturbations do not improve the penalised objective
    rng = np.random.default_rng(0)
    best = obj(res.theta)
    assert all(obj(res.theta + 1e-2 * rng.normal(size=theta.size)) <= best for _ in range(20))
    assert res.kl == pytest.approx(T.mean_kl(phi, theta, res.theta, d))


def test_penalty_kl_depends_on_reward_scale_but_trust_region_does_not():
    mdp, phi = T.short_corridor()
    theta0 = np.array([0.0, math.log(0.2 / 0.8)])
    scaled = T.TabularMDP(mdp.P, 10 * mdp.R, mdp.gamma, mdp.mu)
    J0 = T.evaluate(mdp, T.policy_probs(phi, theta0)).J
    r1 = T.penalty_step(mdp, phi, theta0, beta=50.0)
    r10 = T.penalty_step(scaled, phi, theta0, beta=50.0)
    assert r10.kl > 5 * r1.kl          # same beta, ten times the reward: a much larger step
    assert r1.J_after > J0 and r10.J_after / 10 < J0   # helpful on one, harmful on the other
    # scaling rewards by c is the same as dividing beta by c
    assert T.penalty_step(scaled, phi, theta0, beta=500.0).kl == pytest.approx(r1.kl, rel=1e-5)
    t1 = T.natural_gradient_step(mdp, phi, theta0, delta=0.01, backtrack=0.9)
    t10 = T.natural_gradient_step(scaled, phi, theta0, delta=0.01, backtrack=0.9)
    assert t1.kl == pytest.approx(t10.kl, rel=1e-6)     # the constraint is unit-free
