"""Tests of the additions to klbook_lib.seqkl for chapter 11: aggregations and fixed points.

References: brute-force sums over the enumerated sequences (the optimum pi_ref(y) e^{r/beta} / Z),
autograd on the exact expected reward, central finite differences, and plain gradient descent
on the exact expected update.
"""
from __future__ import annotations

import math

import pytest
import torch

import klbook_lib.seqkl as S

torch.set_num_threads(1)
DT = torch.float64


def _setup(V=3, T=3, eos=None, seed=0, p_success=0.3):
    sp = S.sequence_space(V, T, eos=eos)
    ref = S.random_logits(sp, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    r = (torch.rand(sp.n_sequences, generator=g, dtype=DT) < p_success).double()
    return sp, ref, r


# --------------------------------------------------------------------------- aggregation
def test_aggregations_scale_or_tilt_the_gradient():
    sp, ref, _ = _setup(3, 3, eos=1, seed=1)
    theta = ref + S.random_logits(sp, seed=2)
    old = theta - 0.3 * S.random_logits(sp, seed=3)
    G = lambda agg, **kw: S.expected_gradient(sp, theta, ref, "k3", "loss", aggregation=agg, **kw)
    mean_len = float((S.sequence_logprobs(sp, theta).exp() * sp.lengths).sum())
    # token_mean: the sum divided by the expected length (a constant): same direction
    torch.testing.assert_close(G("token_mean") * mean_len, G("sum"), atol=1e-12, rtol=0)
    mean_len_old = float((S.sequence_logprobs(sp, old).exp() * sp.lengths).sum())
    torch.testing.assert_close(G("token_mean", behaviour_logits=old) * mean_len_old,
                               G("sum", behaviour_logits=old), atol=1e-12, rtol=0)
    # sequence_mean with variable lengths: a different direction
    assert S.gradient_error(G("sequence_mean"), G("sum"))["cosine"] < 1 - 1e-3
    # without EOS every sequence has length T: sequence_mean = sum / T
    sp2, ref2, _ = _setup(3, 3, eos=None, seed=4)
    th2 = ref2 + S.random_logits(sp2, seed=5)
    torch.testing.assert_close(S.expected_gradient(sp2, th2, ref2, "k2", "loss", aggregation="sequence_mean") * 3,
                               S.expected_gradient(sp2, th2, ref2, "k2", "loss"), atol=1e-12, rtol=0)


def test_sequence_mean_against_a_direct_sum():
    # sum_y pi(y) (1/|y|) sum_t grad k2_t, written with the test's own per-sequence loop
    sp, ref, _ = _setup(3, 3, eos=0, seed=6)
    theta = ref + S.random_logits(sp, seed=7)
    leaf = theta.clone().requires_grad_(True)
    lp, lq = S.token_logprobs(sp, leaf), S.token_logprobs(sp, ref)
    w = S.sequence_logprobs(sp, theta).exp()
    total = 0.0
    for n in range(sp.n_sequences):
        L = int(sp.mask[n].sum())
        total = total + w[n] * sum(0.5 * (lp[n, t] - lq[n, t]) ** 2 for t in range(L)) / L
    want = torch.autograd.grad(total, leaf)[0]
    torch.testing.assert_close(S.expected_gradient(sp, theta, ref, "k2", "loss", aggregation="sequence_mean"),
                               want, atol=1e-12, rtol=0)


def test_compare_implementations_accepts_an_aggregation():
    sp, ref, _ = _setup(3, 2, eos=0, seed=8)
    theta = ref + S.random_logits(sp, seed=9)
    rows = S.compare_implementations(sp, theta, ref, [("k1", "reward"), ("k3", "loss", "none", "to_go", "sequence_mean")])
    assert rows[0]["aggregation"] == "sum" and rows[1]["aggregation"] == "sequence_mean"
    assert rows[0]["rel_error"] < 1e-12 and rows[1]["rel_error"] > 1e-2


# --------------------------------------------------------------------------- fixed points
def test_expected_reward_is_a_sum_and_its_gradient_matches_finite_differences():
    sp, ref, r = _setup(3, 2, seed=10)
    p = S.sequence_logprobs(sp, ref).exp()
    assert S.expected_reward(sp, ref, r).item() == pytest.approx(float((p * r).sum()), abs=1e-14)
    leaf = ref.clone().requires_grad_(True)
    g = torch.autograd.grad(S.expected_reward(sp, leaf, r), leaf)[0]
    eps = 1e-6
    for i, j in [(0, 0), (1, 2), (3, 1)]:
        e = torch.zeros_like(ref); e[i, j] = eps
        fd = (S.expected_reward(sp, ref + e, r) - S.expected_reward(sp, ref - e, r)) / (2 * eps)
        assert g[i, j].item() == pytest.approx(fd.item(), abs=1e-8)


@pytest.mark.parametrize("eos", [None, 2])
@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_optimum_is_the_tilted_reference(eos, beta):
    sp, ref, r = _setup(3, 3, eos=eos, seed=11)
    r = r + 0.5 * torch.randn(sp.n_sequences, generator=torch.Generator().manual_seed(3), dtype=DT)
    brute = torch.softmax(S.sequence_logprobs(sp, ref) + r / beta, 0)       # pi_ref(y) e^{r/beta} / Z
    got = S.sequence_logprobs(sp, S.optimal_logits(sp, ref, r, beta)).exp()
    torch.testing.assert_close(got, brute, atol=1e-12, rtol=0)
    # and nothing does better on the regularised objective: compare with random policies
    obj = lambda th: float(S.expected_reward(sp, th, r) - beta * S.exact_kl(sp, th, ref))
    best = obj(S.optimal_logits(sp, ref, r, beta))
    for s in range(5):
        assert obj(ref + 0.5 * S.random_logits(sp, seed=50 + s)) < best


@pytest.mark.parametrize("impl", S.FIXED_POINT_IMPLEMENTATIONS)
@pytest.mark.parametrize("eos", [None, 1])
def test_fixed_points_zero_the_expected_update(impl, eos):
    # -grad E[r] + beta * E[KL-term gradient] vanishes at the closed form, and not at the others
    sp, ref, r = _setup(3, 3, eos=eos, seed=12)
    beta = 0.3

    def field(th):
        leaf = th.clone().requires_grad_(True)
        gr = torch.autograd.grad(S.expected_reward(sp, leaf, r), leaf)[0]
        return -gr + beta * S.expected_gradient(sp, th, ref, *impl)

    fp = S.fixed_point_logits(sp, ref, r, beta, impl)
    assert field(fp).abs().max().item() < 1e-12
    assert torch.allclose(torch.logsumexp(fp, -1), torch.zeros(sp.n_prefixes, dtype=DT), atol=1e-12)
    for other in S.FIXED_POINT_IMPLEMENTATIONS:
        if other != impl:
            assert field(S.fixed_point_logits(sp, ref, r, beta, other)).abs().max().item() > 1e-4


def test_one_position_partial_gradient_reaches_the_optimum_but_k3_does_not():
    # T = 1: no later prefix, so k2 in the loss is exact (chapter 7) and reaches pi*; k3 does not
    sp, ref, r = _setup(5, 1, seed=13, p_success=0.5)
    opt = S.optimal_logits(sp, ref, r, 0.2)
    assert S.exact_kl(sp, S.fixed_point_logits(sp, ref, r, 0.2, ("k2", "loss")), opt).item() < 1e-20
    assert S.exact_kl(sp, S.fixed_point_logits(sp, ref, r, 0.2, ("k3", "loss")), opt).item() > 1e-3
    # longer sequences: the partial gradient stops elsewhere
    sp3, ref3, r3 = _setup(3, 3, seed=13)
    opt3 = S.optimal_logits(sp3, ref3, r3, 0.2)
    assert S.exact_kl(sp3, S.fixed_point_logits(sp3, ref3, r3, 0.2, ("k2", "loss")), opt3).item() > 1e-3


def test_k3_fixed_point_keeps_a_floor_under_every_token():
    # pi(a|s) = beta q(a) / (lam - Q(a)) with lam <= max Q + beta: pi(a|s) >= beta q(a) / (beta + max Q - min Q)
    sp, ref, r = _setup(3, 3, seed=14)
    beta = 0.05
    fp = S.fixed_point_logits(sp, ref, r, beta, ("k3", "loss")).exp()
    q = torch.softmax(ref, -1)
    spread = float(r.max() - r.min())
    assert bool((fp >= beta * q / (beta + spread) - 1e-15).all())
    # the optimum has no such floor: it starves failing continuations
    opt = S.optimal_logits(sp, ref, r, beta).exp()
    assert float((opt / q).min()) < 1e-3 < float((fp / q).min())


def test_descent_on_the_exact_update_converges_to_the_fixed_point():
    sp, ref, r = _setup(3, 2, seed=15)
    beta = 0.3
    for impl in S.FIXED_POINT_IMPLEMENTATIONS:
        th = ref.clone().requires_grad_(True)
        opt = torch.optim.Adam([th], lr=0.05)
        for _ in range(1000):                      # Adam on the exact expected update, from pi_ref
            leaf = th.detach().clone().requires_grad_(True)
            gr = torch.autograd.grad(S.expected_reward(sp, leaf, r), leaf)[0]
            th.grad = -gr + beta * S.expected_gradient(sp, th.detach(), ref, *impl)
            opt.step()
        th = th.detach()
        fp = S.fixed_point_logits(sp, ref, r, beta, impl)
        assert (torch.softmax(th, -1) - fp.exp()).abs().max().item() < 1e-6, impl


@pytest.mark.parametrize("call, match", [
    (lambda: S.expected_reward(S.sequence_space(2, 2), torch.zeros(3, 2), torch.zeros(3)), "reward"),
    (lambda: S.expected_reward(S.sequence_space(2, 2), torch.zeros(3, 2), [0.0, 1.0, float("nan"), 0.0]), "reward"),
    (lambda: S.fixed_point_logits(S.sequence_space(2, 2), torch.zeros(3, 2), torch.zeros(4), 0.0), "beta"),
    (lambda: S.fixed_point_logits(S.sequence_space(2, 2), torch.zeros(3, 2), torch.zeros(4), 1.0,
                                  ("k1", "loss")), "implementation"),
    (lambda: S.optimal_logits(S.sequence_space(2, 2), torch.zeros(2, 2), torch.zeros(4), 1.0), "ref_logits"),
    (lambda: S.expected_gradient(S.sequence_space(2, 2), torch.zeros(3, 2), torch.zeros(3, 2), "k1", "loss",
                                 aggregation="mean"), "aggregation"),
])
def test_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()
