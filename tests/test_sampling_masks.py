"""klbook_lib.sampling_masks against independent references: per-row loops for the kept sets,
the closed form pi/mu = S for a truncated sampler, autograd of exact sums, per-sequence
autograd loops for the masked policy gradient, and offpolicy's unmasked gradients."""
from __future__ import annotations

import math

import pytest
import torch

import klbook_lib.offpolicy as offpolicy
import klbook_lib.sampling_masks as sm
import klbook_lib.seqkl as seqkl

SPACE = seqkl.sequence_space(vocab_size=4, length=3, eos=0)
SMALL = seqkl.sequence_space(vocab_size=3, length=2)


def _adv(space, seed):
    return torch.randn(space.n_sequences, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _rel(g, h):
    return float((g - h).norm() / h.norm())


def _kept_by_loop(probs_row, top_p, top_k):
    order = sorted(range(len(probs_row)), key=lambda i: (-probs_row[i], i))
    if top_k > 0:
        order = order[:top_k]
    kept, mass = [], 0.0
    for i in order:
        if top_p < 1 and mass >= top_p:
            break
        kept.append(i)
        mass += probs_row[i]
    return set(kept)


@pytest.mark.parametrize("top_p,top_k", [(1.0, 0), (0.9, 0), (0.7, 0), (1.0, 2), (0.8, 3), (0.5, 1)])
def test_kept_tokens_match_a_loop_over_sorted_probabilities(top_p, top_k):
    th = seqkl.random_logits(SPACE, scale=1.5, seed=3)
    keep = sm.kept_tokens(SPACE, th, top_p=top_p, top_k=top_k)
    probs = torch.softmax(th, -1).tolist()
    for r, row in enumerate(probs):
        assert set(torch.nonzero(keep[r]).flatten().tolist()) == _kept_by_loop(row, top_p, top_k)
    assert bool(keep.any(1).all())
    if top_p == 1.0 and top_k == 0:
        assert bool(keep.all())


def test_full_over_truncated_ratio_is_the_kept_mass():
    th = seqkl.random_logits(SPACE, seed=5)
    keep = sm.kept_tokens(SPACE, th, top_p=0.8)
    lk, valid = sm.truncated_token_logprobs(SPACE, th, keep)
    lp = seqkl.token_logprobs(SPACE, th)
    mass = torch.tensor([sum(p for p, k in zip(row, krow) if k)
                         for row, krow in zip(torch.softmax(th, -1).tolist(), keep.tolist())], dtype=torch.float64)
    assert torch.allclose(sm.kept_mass(SPACE, th, keep), mass, atol=1e-12)
    m = SPACE.mask & valid[:, None]
    ratio = (lp - lk).exp()[m]
    assert torch.allclose(ratio, mass[SPACE.prefix_index][m], atol=1e-12)
    # the truncated sampler is a distribution over the valid sequences
    probs = torch.where(valid, lk.sum(1).exp(), torch.zeros(SPACE.n_sequences, dtype=torch.float64))
    assert abs(float(probs.sum()) - 1) < 1e-12
    assert not bool(valid.all())


@pytest.mark.parametrize("top_p,top_k", [(0.9, 0), (1.0, 2), (0.8, 3)])
def test_kept_mask_gives_the_truncated_objectives_gradient(top_p, top_k):
    for s in range(3):
        th = seqkl.random_logits(SPACE, seed=10 + s)
        A = _adv(SPACE, 20 + s)
        keep = sm.kept_tokens(SPACE, th, top_p=top_p, top_k=top_k)
        truth = sm.truncated_objective_gradient(SPACE, th, A, keep)
        assert _rel(sm.expected_truncated_pg_gradient(SPACE, th, A, keep, "kept"), truth) < 1e-10
        # scoring the full vocabulary is biased, with or without the importance weight
        assert _rel(sm.expected_truncated_pg_gradient(SPACE, th, A, keep, "full"), truth) > 1e-3
        assert _rel(sm.expected_truncated_pg_gradient(SPACE, th, A, keep, "full_is"), truth) > 1e-3


def test_without_truncation_every_method_is_the_on_policy_gradient():
    th = seqkl.random_logits(SPACE, seed=7)
    A = _adv(SPACE, 8)
    keep = sm.kept_tokens(SPACE, th)
    ref = offpolicy.expected_pg_gradient(SPACE, th, th, A, "none")
    for m in sm.TRUNCATION_METHODS:
        assert _rel(sm.expected_truncated_pg_gradient(SPACE, th, A, keep, m), ref) < 1e-10
    assert _rel(sm.truncated_objective_gradient(SPACE, th, A, keep), ref) < 1e-10


def test_sequence_mask_matches_a_per_sequence_loop():
    th = seqkl.random_logits(SPACE, seed=11)
    mu = offpolicy.perturb_logits(th, "noise", 1.0, seed=12)
    A = _adv(SPACE, 13)
    lp_t, lp_m = torch.log_softmax(th, -1), torch.log_softmax(mu, -1)
    m = sm.off_policy_sequence_mask(SPACE, th, mu, A, 0.2)
    for n in range(SPACE.n_sequences):
        toks = [(int(SPACE.prefix_index[n, t]), int(SPACE.sequences[n, t]))
                for t in range(SPACE.length) if SPACE.mask[n, t]]
        mean_kl = sum(float(lp_m[r, a] - lp_t[r, a]) for r, a in toks) / len(toks)
        assert m[n] == float(A[n] >= 0 or mean_kl <= 0.2)
    assert 0 < float(m.sum()) < SPACE.n_sequences


def test_masked_gradient_matches_per_sequence_autograd():
    th = seqkl.random_logits(SMALL, seed=21)
    mu = offpolicy.perturb_logits(th, "noise", 1.0, seed=22)
    A = _adv(SMALL, 23)
    m = sm.off_policy_sequence_mask(SMALL, th, mu, A, 0.1)
    assert 0 < float(m.sum()) < SMALL.n_sequences
    p_mu = torch.softmax(mu, -1)
    total = torch.zeros_like(th)
    for n in range(SMALL.n_sequences):
        x = th.clone().requires_grad_(True)
        toks = [(int(SMALL.prefix_index[n, t]), int(SMALL.sequences[n, t])) for t in range(SMALL.length)]
        logp = sum(torch.log_softmax(x[r], -1)[a] for r, a in toks)
        (g,) = torch.autograd.grad(logp, x)
        mu_y = math.prod(float(p_mu[r, a]) for r, a in toks)
        W = math.exp(sum(float(torch.log_softmax(th[r], -1)[a] - torch.log(p_mu[r, a])) for r, a in toks))
        total += mu_y * float(m[n]) * float(A[n]) * W * g
    got = sm.expected_masked_pg_gradient(SMALL, th, mu, A, 0.1, "seq_is")
    assert torch.allclose(got, total, atol=1e-12)


def test_no_mask_is_offpolicys_gradient_and_a_huge_threshold_masks_nothing():
    th = seqkl.random_logits(SPACE, seed=31)
    mu = offpolicy.perturb_logits(th, "noise", 0.5, seed=32)
    A = _adv(SPACE, 33)
    for corr in ("seq_is", "token_tis", "none"):
        ref = offpolicy.expected_pg_gradient(SPACE, th, mu, A, corr)
        assert _rel(sm.expected_masked_pg_gradient(SPACE, th, mu, A, None, corr), ref) < 1e-12
        assert _rel(sm.expected_masked_pg_gradient(SPACE, th, mu, A, 1e6, corr), ref) < 1e-12
    # sequence IS without a mask is the learner's exact policy gradient (grad E_pi[A] by autograd)
    x = th.clone().requires_grad_(True)
    (truth,) = torch.autograd.grad((seqkl.sequence_logprobs(SPACE, x).exp() * A).sum(), x)
    assert _rel(sm.expected_masked_pg_gradient(SPACE, th, mu, A, None, "seq_is"), truth) < 1e-10
    # non-negative advantages are never masked
    assert bool((sm.off_policy_sequence_mask(SPACE, th, mu, A.abs(), 1e-3) == 1).all())


def test_ess_fraction():
    p = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    assert abs(sm.ess_fraction(p, torch.ones(3, dtype=torch.float64)) - 1) < 1e-15
    w = torch.tensor([2.0, 0.0, 1.0], dtype=torch.float64)
    assert abs(sm.ess_fraction(p, w) - (0.5 + 0.5) ** 2 / (1.0 + 0.5)) < 1e-15


@pytest.mark.parametrize("call,match", [
    (lambda: sm.kept_tokens(SPACE, seqkl.random_logits(SPACE), top_p=0.0), "top_p"),
    (lambda: sm.kept_tokens(SPACE, seqkl.random_logits(SPACE), top_p=1.5), "top_p"),
    (lambda: sm.kept_tokens(SPACE, seqkl.random_logits(SPACE), top_k=-1), "top_k"),
    (lambda: sm.kept_tokens(SPACE, seqkl.random_logits(SPACE), top_k=1.5), "top_k"),
    (lambda: sm.kept_tokens(SPACE, torch.zeros(2, 2)), "logits"),
    (lambda: sm.kept_mass(SPACE, seqkl.random_logits(SPACE), torch.zeros(SPACE.n_prefixes, 4, dtype=torch.bool)),
     "keep"),
    (lambda: sm.expected_truncated_pg_gradient(SPACE, seqkl.random_logits(SPACE), _adv(SPACE, 0),
                                               torch.ones(SPACE.n_prefixes, 4, dtype=torch.bool), "bogus"), "method"),
    (lambda: sm.off_policy_sequence_mask(SPACE, seqkl.random_logits(SPACE), seqkl.random_logits(SPACE),
                                         _adv(SPACE, 0), 0.0), "threshold"),
    (lambda: sm.off_policy_sequence_mask(SPACE, seqkl.random_logits(SPACE), seqkl.random_logits(SPACE),
                                         torch.zeros(3), 0.1), "advantage"),
    (lambda: sm.ess_fraction(torch.tensor([0.5, 0.6]), torch.ones(2)), "probs"),
    (lambda: sm.ess_fraction(torch.tensor([0.5, 0.5]), torch.tensor([-1.0, 1.0])), "weights"),
])
def test_bad_input_raises_valueerror_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
