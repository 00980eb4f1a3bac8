"""On-policy distillation (``klbook_lib.offpolicy``, section 4) against independent references.

References: finite differences of the reverse KL of whole responses and of the occupancy-weighted
per-position KL, both summed by explicit loops over the prefixes (not through ``seqkl``'s tables);
the closed form ``A_t = -sum_u gamma^(u-t) k1_u`` by a double loop; and the sampling error of a batch
mean, bounded by five standard errors computed from the per-sequence gradients.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

import klbook_lib.offpolicy as op
import klbook_lib.seqkl as S

torch.set_num_threads(1)


def _row(space):
    return {p: i for i, p in enumerate(space.prefixes)}


def _reach(space, logits, prefix):
    row, r = _row(space), 1.0
    for t in range(len(prefix)):
        r *= float(torch.softmax(logits[row[prefix[:t]]], -1)[prefix[t]])
    return r


def _position_kl(theta_row, ref_row):
    p, q = torch.softmax(theta_row, -1), torch.softmax(ref_row, -1)
    return float((p * (p.log() - q.log())).sum())


def _sequence_kl_by_hand(space, theta, ref):
    """KL(pi_theta || pi_ref) of whole responses as sum over prefixes of reach * per-position KL
    (the chain rule), every product written out."""
    return sum(_reach(space, theta, p) * _position_kl(theta[_row(space)[p]], ref[_row(space)[p]])
               for p in space.prefixes)


def _partial_by_hand(space, theta, ref, occupancy_logits):
    """The same sum with the prefixes' reach frozen at ``occupancy_logits``."""
    return sum(_reach(space, occupancy_logits, p) * _position_kl(theta[_row(space)[p]], ref[_row(space)[p]])
               for p in space.prefixes)


def _finite_difference(f, x, h=1e-5):
    g = torch.zeros_like(x)
    for idx in itertools.product(*[range(n) for n in x.shape]):
        e = torch.zeros_like(x)
        e[idx] = h
        g[idx] = (f(x + e) - f(x - e)) / (2 * h)
    return g


def _pair(space, seed):
    teacher = S.random_logits(space, scale=1.5, seed=seed)
    student = S.random_logits(space, seed=seed + 50)
    return student, teacher


@pytest.mark.parametrize("seed", [0, 1])
def test_discount_one_is_the_gradient_of_the_sequence_reverse_kl(seed):
    space = S.sequence_space(3, 3, eos=0)
    th, te = _pair(space, seed)
    fd = _finite_difference(lambda x: _sequence_kl_by_hand(space, x, te), th)
    g = op.expected_distillation_gradient(space, th, te, discount=1.0)
    assert torch.allclose(g, fd, atol=1e-7), (g - fd).abs().max()


@pytest.mark.parametrize("seed", [0, 1])
def test_discount_zero_is_the_partial_gradient_at_the_students_prefixes(seed):
    space = S.sequence_space(3, 3, eos=0)
    th, te = _pair(space, seed)
    fd = _finite_difference(lambda x: _partial_by_hand(space, x, te, th), th)
    g = op.expected_distillation_gradient(space, th, te, discount=0.0)
    assert torch.allclose(g, fd, atol=1e-7), (g - fd).abs().max()
    # ... and not the sequence-KL gradient when responses are longer than one token
    full = _finite_difference(lambda x: _sequence_kl_by_hand(space, x, te), th)
    assert float((g - full).norm() / full.norm()) > 0.05


def test_at_one_token_both_discounts_give_the_reverse_kl_gradient():
    space = S.sequence_space(5, 1)
    th, te = _pair(space, 3)
    fd = _finite_difference(lambda x: _position_kl(x[0], te[0]), th)
    for gamma in (0.0, 0.5, 1.0):
        g = op.expected_distillation_gradient(space, th, te, discount=gamma)
        assert torch.allclose(g, fd, atol=1e-8), (gamma, (g - fd).abs().max())


def test_both_discounts_vanish_at_the_teacher():
    space = S.sequence_space(3, 3, eos=0)
    _, te = _pair(space, 4)
    for gamma in (0.0, 1.0):
        assert op.expected_distillation_gradient(space, te, te, gamma).abs().max() < 1e-12


def test_advantages_are_minus_the_discounted_future_log_ratio():
    g = torch.Generator().manual_seed(0)
    lp, lt = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 3, -torch.rand(4, 5, generator=g, dtype=torch.float64) * 3
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    for gamma in (0.0, 0.5, 1.0):
        a = op.distillation_advantages(lp, lt, mask, gamma)
        for i in range(4):
            for t in range(5):
                want = 0.0 if not mask[i, t] else -sum(
                    gamma ** (u - t) * float(lp[i, u] - lt[i, u]) for u in range(t, 5) if mask[i, u])
                assert math.isclose(float(a[i, t]), want, abs_tol=1e-12), (gamma, i, t)
    assert not op.distillation_advantages(lp.requires_grad_(True), lt, mask).requires_grad


def test_sampled_gradient_is_within_five_standard_errors_of_the_expected_one():
    space = S.sequence_space(3, 3, eos=0)
    th, te = _pair(space, 5)
    n, seed = 4000, 7
    for gamma in (0.0, 1.0):
        per_seq = torch.stack([torch.autograd.grad(op.distillation_surrogate(
            space, x := th.clone().requires_grad_(True), te, gamma)[y], x)[0] for y in range(space.n_sequences)])
        mu = S.sequence_logprobs(space, th).exp()
        mean = (mu[:, None, None] * per_seq).sum(0)
        sd = ((mu[:, None, None] * (per_seq - mean) ** 2).sum(0)).sqrt()
        assert torch.allclose(mean, op.expected_distillation_gradient(space, th, te, gamma), atol=1e-12)
        total_var = float((mu[:, None, None] * (per_seq - mean) ** 2).sum())
        assert math.isclose(op.distillation_gradient_variance(space, th, te, gamma), total_var, rel_tol=1e-10)
        g = op.sampled_distillation_gradient(space, th, te, n, gamma, seed)
        # the batch mean of the per-sequence gradients of the sequences seqkl.sample draws
        idx = S.sample(space, th, n, seed)
        assert torch.allclose(g, per_seq[idx].mean(0), atol=1e-12)
        assert bool(((g - mean).abs() <= 5 * sd / math.sqrt(n) + 1e-12).all())


def test_distill_run_starts_at_the_exact_kl_and_moves_towards_the_teacher():
    space = S.sequence_space(3, 3, eos=0)
    th, te = _pair(space, 6)
    for gamma in (0.0, 1.0):
        h = op.distill_run(space, te, th, gamma, steps=60, batch=16, lr=0.1, seed=0)
        assert len(h["kl"]) == 61
        assert math.isclose(h["kl"][0], _sequence_kl_by_hand(space, th, te), rel_tol=1e-9)
        assert h["kl"][-1] < 0.2 * h["kl"][0], (gamma, h["kl"][0], h["kl"][-1])
    a = op.distill_run(space, te, th, 0.0, steps=5, seed=3)["kl"]
    assert a == op.distill_run(space, te, th, 0.0, steps=5, seed=3)["kl"]


@pytest.mark.parametrize("call, match", [
    (lambda sp, th: op.expected_distillation_gradient(sp, th, th, discount=-0.1), "discount"),
    (lambda sp, th: op.expected_distillation_gradient(sp, th, th, discount=1.5), "discount"),
    (lambda sp, th: op.expected_distillation_gradient(sp, th, th, discount="one"), "discount"),
    (lambda sp, th: op.expected_distillation_gradient(sp, th, th[:2], 0.0), "teacher_logits"),
    (lambda sp, th: op.expected_distillation_gradient(sp, th * float("nan"), th, 0.0), "logits"),
    (lambda sp, th: op.sampled_distillation_gradient(sp, th, th, 0), "n"),
    (lambda sp, th: op.distillation_gradient_variance(sp, th, th, 2.0), "discount"),
    (lambda sp, th: op.distill_run(sp, th, th, steps=0), "steps"),
    (lambda sp, th: op.distill_run(sp, th, th, batch=0), "batch"),
    (lambda sp, th: op.distill_run(sp, th, th, lr=0.0), "lr"),
    (lambda sp, th: op.distill_run(sp, th, th[:1], 0.0), "start_logits"),
    (lambda sp, th: op.distillation_advantages(th, th, (th > 0).double()), "mask"),
    (lambda sp, th: op.distillation_advantages(th[0], th[0], th[0] > 0), "logprobs"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, match):
    space = S.sequence_space(3, 2, eos=0)
    th = S.random_logits(space, seed=0)
    with pytest.raises(ValueError, match=match):
        call(space, th)
