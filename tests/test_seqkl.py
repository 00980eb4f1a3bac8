"""Tests for klbook_lib.seqkl: exact sequence-level KL and the expected gradients of its estimators.

References are independent of the code under test: sequence probabilities rebuilt token by
token with torch.distributions.Categorical, KLs from explicit Python sums and from
torch.distributions.kl_divergence, gradients from central finite differences and from
closed forms at one position, and Monte Carlo averages of batches sampled by the test's
own ancestral sampler and differentiated the way a training loop does it. Statistical
tests use fixed seeds and a tolerance of 5 standard errors per component.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Categorical, kl_divergence

import klbook_lib.seqkl as S

torch.set_num_threads(1)
DT = torch.float64


def _pair(space, seed, delta=1.0):
    ref = S.random_logits(space, seed=seed)
    theta = ref + delta * S.random_logits(space, seed=seed + 1)
    return theta, ref


def _seq_logprob_by_hand(space, logits, tokens):
    """log pi(y) rebuilt token by token with Categorical, walking the prefixes."""
    row = {p: i for i, p in enumerate(space.prefixes)}
    total = 0.0
    for t, v in enumerate(tokens):
        total += float(Categorical(logits=logits[row[tuple(tokens[:t])]]).log_prob(torch.tensor(v)))
    return total


# --------------------------------------------------------------------------- enumeration
@pytest.mark.parametrize("V,T,eos", [(2, 1, None), (3, 3, None), (4, 2, None), (3, 3, 2), (4, 4, 0)])
def test_enumeration_counts_and_structure(V, T, eos):
    sp = S.sequence_space(V, T, eos=eos)
    seqs = [sp.tokens(i) for i in range(sp.n_sequences)]
    assert len(set(seqs)) == len(seqs)
    # brute force: every token string of length <= T that ends at T or at its first EOS
    expected = set()
    for n in range(1, T + 1):
        for cand in __import__("itertools").product(range(V), repeat=n):
            body, last = cand[:-1], cand[-1]
            if eos is not None and eos in body:
                continue
            if n == T or last == eos:
                expected.add(cand)
    assert set(seqs) == expected
    assert sp.n_prefixes == len({s[:t] for s in seqs for t in range(len(s))})
    for i, s in enumerate(seqs):
        for t in range(len(s)):
            assert sp.prefixes[int(sp.prefix_index[i, t])] == s[:t]
        assert int(sp.mask[i].sum()) == len(s)


@pytest.mark.parametrize("eos", [None, 1])
def test_sequence_probabilities_match_categorical(eos):
    sp = S.sequence_space(3, 3, eos=eos)
    logits = S.random_logits(sp, scale=1.5, seed=3)
    lp = S.sequence_logprobs(sp, logits)
    for i in range(sp.n_sequences):
        assert lp[i].item() == pytest.approx(_seq_logprob_by_hand(sp, logits, sp.tokens(i)), abs=1e-12)
    assert lp.exp().sum().item() == pytest.approx(1.0, abs=1e-12)


def test_exact_kl_against_brute_force_and_chain_rule():
    sp = S.sequence_space(3, 3, eos=2)
    theta, ref = _pair(sp, 10)
    brute = 0.0
    for i in range(sp.n_sequences):
        a = _seq_logprob_by_hand(sp, theta, sp.tokens(i))
        b = _seq_logprob_by_hand(sp, ref, sp.tokens(i))
        brute += math.exp(a) * (a - b)
    assert S.exact_kl(sp, theta, ref).item() == pytest.approx(brute, abs=1e-12)
    # chain rule with torch.distributions: sum over visited prefixes of the next-token KLs
    row = {p: i for i, p in enumerate(sp.prefixes)}
    chain = 0.0
    for i in range(sp.n_sequences):
        s = sp.tokens(i)
        p_y = math.exp(_seq_logprob_by_hand(sp, theta, s))
        chain += p_y * sum(float(kl_divergence(Categorical(logits=theta[row[s[:t]]]),
                                               Categorical(logits=ref[row[s[:t]]]))) for t in range(len(s)))
    assert S.exact_kl(sp, theta, ref).item() == pytest.approx(chain, abs=1e-12)
    w = S.sequence_logprobs(sp, theta).exp()
    assert (w * S.position_kl(sp, theta, ref).sum(1)).sum().item() == pytest.approx(chain, abs=1e-12)


def test_length_one_kl_is_the_categorical_kl():
    sp = S.sequence_space(7, 1)
    theta, ref = _pair(sp, 20)
    want = float(kl_divergence(Categorical(logits=theta[0]), Categorical(logits=ref[0])))
    assert S.exact_kl(sp, theta, ref).item() == pytest.approx(want, abs=1e-13)
    want_fwd = float(kl_divergence(Categorical(logits=ref[0]), Categorical(logits=theta[0])))
    assert S.exact_kl(sp, ref, theta).item() == pytest.approx(want_fwd, abs=1e-13)


@pytest.mark.parametrize("direction", ["reverse", "forward"])
@pytest.mark.parametrize("eos", [None, 0])
def test_exact_gradient_against_finite_differences(direction, eos):
    sp = S.sequence_space(3, 3, eos=eos)
    theta, ref = _pair(sp, 30)
    g = S.exact_kl_gradient(sp, theta, ref, direction=direction)
    f = (lambda th: S.exact_kl(sp, th, ref)) if direction == "reverse" else (lambda th: S.exact_kl(sp, ref, th))
    eps = 1e-6
    fd = torch.zeros_like(theta)
    for i in range(theta.shape[0]):
        for j in range(theta.shape[1]):
            e = torch.zeros_like(theta)
            e[i, j] = eps
            fd[i, j] = (f(theta + e) - f(theta - e)) / (2 * eps)
    torch.testing.assert_close(g, fd, atol=1e-8, rtol=0)


# --------------------------------------------------------------------------- one position (chapter 4)
def test_length_one_reduces_to_the_per_position_results():
    sp = S.sequence_space(9, 1)
    theta, ref = _pair(sp, 40)
    p, q = torch.softmax(theta, -1), torch.softmax(ref, -1)
    l = p.log() - q.log()
    grad_rev = p * (l - (p * l).sum())          # d KL(p||q) / d logits, closed form
    grad_fwd = p - q                            # d KL(q||p) / d logits, closed form
    G = lambda e, pl: S.expected_gradient(sp, theta, ref, e, pl)
    torch.testing.assert_close(G("k1", "loss"), torch.zeros_like(theta), atol=1e-14, rtol=0)
    torch.testing.assert_close(G("k2", "loss"), grad_rev, atol=1e-14, rtol=0)
    torch.testing.assert_close(G("k3", "loss"), grad_fwd, atol=1e-14, rtol=0)
    torch.testing.assert_close(G("k1", "reward"), grad_rev, atol=1e-14, rtol=0)
    torch.testing.assert_close(G("k3", "reward"), grad_rev - grad_fwd, atol=1e-14, rtol=0)
    # k2 in the reward: E[k2 grad log p] = p * (k2 - E[k2])
    k2 = 0.5 * l**2
    torch.testing.assert_close(G("k2", "reward"), p * (k2 - (p * k2).sum()), atol=1e-14, rtol=0)


# --------------------------------------------------------------------------- sequences
@pytest.mark.parametrize("eos", [None, 2])
def test_sequence_level_pattern(eos):
    sp = S.sequence_space(3, 3, eos=eos)
    theta, ref = _pair(sp, 50)
    g_star = S.exact_kl_gradient(sp, theta, ref)
    G = lambda *a, **kw: S.expected_gradient(sp, theta, ref, *a, **kw)
    # k1 in the reward with summed returns (and with the whole sequence's return) is exact
    torch.testing.assert_close(G("k1", "reward"), g_star, atol=1e-13, rtol=0)
    torch.testing.assert_close(G("k1", "reward", returns="total"), g_star, atol=1e-13, rtol=0)
    # k2 in the loss = k1 in the reward without returns: a partial gradient, not the exact one
    torch.testing.assert_close(G("k2", "loss"), G("k1", "reward", returns="immediate"), atol=1e-13, rtol=0)
    err = S.gradient_error(G("k2", "loss"), g_star)
    assert err["rel_error"] > 1e-2 and err["cosine"] < 1 - 1e-4
    # k3 in the loss: the partial gradient of the FORWARD per-position KLs along pi_theta's prefixes
    leaf = theta.clone().requires_grad_(True)
    w = S.sequence_logprobs(sp, theta).exp()
    partial_fwd = torch.autograd.grad((w * S.position_kl(sp, ref, leaf).sum(1)).sum(), leaf)[0]
    torch.testing.assert_close(G("k3", "loss"), partial_fwd, atol=1e-13, rtol=0)
    assert S.gradient_error(G("k3", "loss"), g_star)["rel_error"] > 1e-2
    # k1 in the loss: zero in expectation
    assert G("k1", "loss").abs().max().item() < 1e-13


def test_partial_gradient_error_vanishes_at_the_reference():
    sp = S.sequence_space(3, 3)
    errs = []
    for delta in (0.02, 0.2, 1.0):
        theta, ref = _pair(sp, 60, delta)
        g_star = S.exact_kl_gradient(sp, theta, ref)
        errs.append(S.gradient_error(S.expected_gradient(sp, theta, ref, "k2", "loss"), g_star)["rel_error"])
    assert errs[0] < errs[1] < errs[2]
    assert errs[0] < 0.05 * errs[2]


def test_off_policy_weights():
    sp = S.sequence_space(3, 3)
    theta, ref = _pair(sp, 70)
    old = theta - 0.4 * S.random_logits(sp, seed=79)
    for est, place in S.ON_POLICY_IMPLEMENTATIONS:
        on = S.expected_gradient(sp, theta, ref, est, place)
        seq = S.expected_gradient(sp, theta, ref, est, place, behaviour_logits=old, weights="sequence")
        torch.testing.assert_close(seq, on, atol=1e-12, rtol=0)
        if on.norm() > 1e-8:
            for w in ("none", "token"):
                off = S.expected_gradient(sp, theta, ref, est, place, behaviour_logits=old, weights=w)
                assert (off - on).norm() > 1e-3 * on.norm(), (est, place, w)
    # when pi_old = pi_theta every weighting is the on-policy gradient
    for w in S.WEIGHTS:
        torch.testing.assert_close(S.expected_gradient(sp, theta, ref, "k3", "loss", behaviour_logits=theta, weights=w),
                                   S.expected_gradient(sp, theta, ref, "k3", "loss"), atol=1e-13, rtol=0)


def test_surrogate_works_for_a_network_parameterisation():
    # logits from a tiny linear network over one-hot prefix features: the gradient of the expected
    # surrogate with respect to the network's weights is the chain rule applied to the table gradient
    sp = S.sequence_space(3, 2)
    g = torch.Generator().manual_seed(80)
    W = torch.randn(sp.n_prefixes, sp.vocab_size, generator=g, dtype=DT, requires_grad=True)
    b = torch.randn(sp.vocab_size, generator=g, dtype=DT, requires_grad=True)
    ref = S.random_logits(sp, seed=81)
    logits = torch.eye(sp.n_prefixes, dtype=DT) @ W + b
    val = S.expected_surrogate(sp, logits, ref, "k1", "reward")
    gW, gb = torch.autograd.grad(val, (W, b))
    table = S.expected_gradient(sp, logits.detach(), ref, "k1", "reward")
    torch.testing.assert_close(gW, table, atol=1e-13, rtol=0)
    torch.testing.assert_close(gb, table.sum(0), atol=1e-13, rtol=0)


# --------------------------------------------------------------------------- Monte Carlo
def _ancestral(space, logits, n, gen):
    """The test's own sampler: walk prefixes token by token (independent of seqkl.sample)."""
    row = {p: i for i, p in enumerate(space.prefixes)}
    probs = torch.softmax(logits, -1)
    toks = torch.zeros(n, space.length, dtype=torch.long)
    rows = torch.zeros(n, space.length, dtype=torch.long)
    mask = torch.zeros(n, space.length, dtype=torch.bool)
    prefixes = [()] * n
    alive = torch.ones(n, dtype=torch.bool)
    for t in range(space.length):
        r = torch.tensor([row.get(p, 0) for p in prefixes])
        tok = torch.multinomial(probs[r], 1, generator=gen).squeeze(1)
        toks[:, t] = torch.where(alive, tok, torch.zeros_like(tok))
        rows[:, t] = r
        mask[:, t] = alive
        prefixes = [p + (int(v),) for p, v in zip(prefixes, tok)]
        ended = (tok == space.eos) if space.eos is not None else torch.zeros(n, dtype=torch.bool)
        alive = alive & ~ended
    return toks, rows, mask


def _batch_loss(theta, ref, old, toks, rows, mask, est, place, weights):
    """A training loop's loss on a sampled batch (mean over sequences), written out directly."""
    lp = torch.log_softmax(theta, -1)[rows, toks] * mask
    lq = torch.log_softmax(ref, -1)[rows, toks] * mask
    lo = (torch.log_softmax(old, -1)[rows, toks] * mask) if old is not None else lp.detach()
    l = lp - lq
    k = {"k1": l, "k2": 0.5 * l**2, "k3": torch.exp(-l) - 1 + l}[est] * mask
    if place == "reward":
        kd = k.detach()
        ret = torch.flip(torch.cumsum(torch.flip(kd, [1]), 1), [1])      # reward to go
        per_tok = ret * lp
    else:
        per_tok = k
    if weights == "token":
        per_tok = torch.exp(lp - lo).detach() * per_tok
    per_seq = per_tok.sum(1)
    if weights == "sequence":
        per_seq = torch.exp((lp - lo).sum(1)).detach() * per_seq
    return per_seq.mean()


MC_CASES = [(e, p, None) for e, p in S.ON_POLICY_IMPLEMENTATIONS] + [
    ("k1", "reward", "none"), ("k1", "reward", "token"), ("k1", "reward", "sequence"),
    ("k3", "loss", "none"), ("k3", "loss", "token"), ("k2", "loss", "sequence")]


@pytest.mark.parametrize("est,place,weights", MC_CASES)
def test_expected_gradient_matches_monte_carlo(est, place, weights):
    # Seed 123; 40 batches of 500 sampled sequences; each component of the batch-mean gradient
    # must lie within 5 standard errors (spread of the 40 batch means / sqrt(40)) of the exact
    # expectation. A false failure needs a 5-sigma deviation in one of 39 components (p < 1e-4).
    sp = S.sequence_space(3, 3, eos=2)
    theta, ref = _pair(sp, 90, delta=0.7)
    old = None if weights is None else theta - 0.3 * S.random_logits(sp, seed=99)
    gen = torch.Generator().manual_seed(123)
    batches = []
    for _ in range(40):
        toks, rows, mask = _ancestral(sp, old if old is not None else theta, 500, gen)
        leaf = theta.clone().requires_grad_(True)
        loss = _batch_loss(leaf, ref, old, toks, rows, mask, est, place, weights or "none")
        batches.append(torch.autograd.grad(loss, leaf)[0])
    batches = torch.stack(batches)
    mean, se = batches.mean(0), batches.std(0) / math.sqrt(len(batches))
    exact = S.expected_gradient(sp, theta, ref, est, place, behaviour_logits=old, weights=weights or "none")
    bad = (mean - exact).abs() > 5 * se + 1e-12
    assert not bad.any(), (est, place, weights, (mean - exact)[bad], se[bad])


@pytest.mark.parametrize("eos", [None, 1])
def test_sample_frequencies_match_probabilities(eos):
    # 200,000 draws (seed 7); every sequence's frequency within 5 binomial standard errors.
    sp = S.sequence_space(3, 3, eos=eos)
    logits = S.random_logits(sp, seed=5)
    n = 200_000
    idx = S.sample(sp, logits, n, seed=7)
    freq = torch.bincount(idx, minlength=sp.n_sequences).double() / n
    p = S.sequence_logprobs(sp, logits).exp()
    z = (freq - p) / (p * (1 - p) / n).sqrt()
    assert z.abs().max() < 5, z
    # deterministic for a seed, different for another
    first = S.sample(sp, logits, 100, seed=7)
    assert torch.equal(S.sample(sp, logits, 100, seed=7), first)
    assert not torch.equal(S.sample(sp, logits, 100, seed=8), first)


def test_random_logits_is_seeded():
    sp = S.sequence_space(3, 2)
    assert torch.equal(S.random_logits(sp, seed=1), S.random_logits(sp, seed=1))
    assert not torch.equal(S.random_logits(sp, seed=1), S.random_logits(sp, seed=2))
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(S.random_logits(sp, seed=g1), S.random_logits(sp, seed=g2))


def test_gradient_error_values():
    g_star = torch.tensor([3.0, 4.0], dtype=DT)
    e = S.gradient_error(torch.tensor([3.0, 4.0], dtype=DT) * 2, g_star)
    assert e["rel_error"] == pytest.approx(1.0) and e["cosine"] == pytest.approx(1.0) and e["norm_ratio"] == 2
    e = S.gradient_error(torch.tensor([-4.0, 3.0], dtype=DT), g_star)
    assert e["cosine"] == pytest.approx(0.0) and e["rel_error"] == pytest.approx(math.sqrt(2))
    assert math.isnan(S.gradient_error(torch.zeros(2, dtype=DT), g_star)["cosine"])


def test_compare_implementations_rows():
    sp = S.sequence_space(3, 2)
    theta, ref = _pair(sp, 95)
    rows = S.compare_implementations(sp, theta, ref)
    assert [(r["estimator"], r["placement"]) for r in rows] == list(S.ON_POLICY_IMPLEMENTATIONS)
    assert rows[0]["rel_error"] < 1e-12


# --------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("call, match", [
    (lambda: S.sequence_space(1, 3), "vocab_size"),
    (lambda: S.sequence_space(3, 0), "length"),
    (lambda: S.sequence_space(3.0, 2), "vocab_size"),
    (lambda: S.sequence_space(3, 2, eos=3), "eos"),
    (lambda: S.sequence_space(50, 5), "vocab_size, length"),
    (lambda: S.random_logits("space"), "space"),
    (lambda: S.random_logits(S.sequence_space(2, 2), scale=-1), "scale"),
    (lambda: S.random_logits(S.sequence_space(2, 2), seed="x"), "seed"),
    (lambda: S.token_logprobs(S.sequence_space(2, 2), torch.zeros(2, 2)), "logits"),
    (lambda: S.token_logprobs(S.sequence_space(2, 2), torch.zeros(3, 2, dtype=torch.long)), "logits"),
    (lambda: S.token_logprobs(S.sequence_space(2, 2), torch.full((3, 2), float("nan"))), "logits"),
    (lambda: S.exact_kl(S.sequence_space(2, 2), torch.zeros(3, 2), torch.zeros(2, 2)), "q_logits"),
    (lambda: S.exact_kl_gradient(S.sequence_space(2, 2), torch.zeros(3, 2), torch.zeros(3, 2), "both"), "direction"),
    (lambda: S.expected_gradient(S.sequence_space(2, 2), torch.zeros(3, 2), torch.zeros(3, 2), "k4", "loss"), "estimator"),
    (lambda: S.expected_gradient(S.sequence_space(2, 2), torch.zeros(3, 2), torch.zeros(3, 2), "k1", "lose"), "placement"),
    (lambda: S.expected_gradient(S.sequence_space(2, 2), torch.zeros(3, 2), torch.zeros(3, 2), "k1", "loss",
                                 weights="tokens"), "weights"),
    (lambda: S.expected_gradient(S.sequence_space(2, 2), torch.zeros(3, 2), torch.zeros(3, 2), "k1", "reward",
                                 returns="discounted"), "returns"),
    (lambda: S.expected_gradient(S.sequence_space(2, 2), torch.zeros(3, 2), torch.zeros(3, 2), "k1", "reward",
                                 behaviour_logits=torch.zeros(2, 2)), "behaviour_logits"),
    (lambda: S.sample(S.sequence_space(2, 2), torch.zeros(3, 2), 0), "n"),
    (lambda: S.gradient_error(torch.ones(2), torch.zeros(2)), "g_exact"),
    (lambda: S.gradient_error(torch.ones(2), torch.ones(3)), "g"),
    (lambda: S.compare_implementations(S.sequence_space(2, 2), torch.zeros(3, 2), torch.ones(3, 2), [("k1",)]),
     "implementations"),
    (lambda: S.kl_per_token(torch.zeros(2), torch.zeros(3), "k1"), "ref_logprobs"),
])
def test_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_monte_carlo_separates_partial_from_exact_gradient():
    # The claim itself, by sampling alone (seed 321, 40 batches of 500): the per-token loss
    # gradients average to something 5+ standard errors away from the exact sequence-KL gradient
    # in some component, while k1 in the reward with summed returns does not.
    sp = S.sequence_space(3, 3, eos=2)
    theta, ref = _pair(sp, 90, delta=0.7)
    g_star = S.exact_kl_gradient(sp, theta, ref)
    zmax = {}
    for est, place in [("k1", "reward"), ("k2", "loss"), ("k3", "loss")]:
        gen = torch.Generator().manual_seed(321)
        batches = []
        for _ in range(40):
            toks, rows, mask = _ancestral(sp, theta, 500, gen)
            leaf = theta.clone().requires_grad_(True)
            loss = _batch_loss(leaf, ref, None, toks, rows, mask, est, place, "none")
            batches.append(torch.autograd.grad(loss, leaf)[0])
        batches = torch.stack(batches)
        se = batches.std(0) / math.sqrt(len(batches))
        zmax[est, place] = float(((batches.mean(0) - g_star).abs() / (se + 1e-12)).max())
    assert zmax["k1", "reward"] < 5
    assert zmax["k2", "loss"] > 5 and zmax["k3", "loss"] > 5, zmax
