"""Tests for klbook_lib.offpolicy: attached-ratio KL terms, mismatch corrections, trust-region masks.

References are independent of the code under test: KLs and occupancies rebuilt by explicit
Python loops over prefixes and tokens, gradients by central finite differences of those
sums, per-sample gradients by autograd on torch.distributions.Categorical, PPO's clipped
objective written out with torch.clamp, Bernoulli KLs from torch.distributions.kl_divergence.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.distributions import Bernoulli, Categorical, kl_divergence

import klbook_lib.offpolicy as op
import klbook_lib.seqkl as S

torch.set_num_threads(1)
DT = torch.float64


def _triple(space, seed):
    ref = S.random_logits(space, seed=seed)
    th = ref + S.random_logits(space, seed=seed + 1)
    old = th - 0.5 * S.random_logits(space, seed=seed + 2)
    return ref, th, old


def _row(space):
    return {p: i for i, p in enumerate(space.prefixes)}


def _occupancy_kl_by_hand(space, theta, ref, mu):
    """sum over prefixes s of P_mu(reach s) * KL(pi_theta(.|s) || pi_ref(.|s)), by explicit loops."""
    row = _row(space)
    total = 0.0
    for p in space.prefixes:
        reach = 1.0
        for t in range(len(p)):
            reach *= float(torch.softmax(mu[row[p[:t]]], -1)[p[t]])
        pt, pr = torch.softmax(theta[row[p]], -1), torch.softmax(ref[row[p]], -1)
        total += reach * sum(float(pt[v] * (pt[v].log() - pr[v].log())) for v in range(space.vocab_size))
    return total


def _finite_difference(f, x, h=1e-5):
    g = torch.zeros_like(x)
    for idx in itertools.product(*[range(n) for n in x.shape]):
        e = torch.zeros_like(x)
        e[idx] = h
        g[idx] = (f(x + e) - f(x - e)) / (2 * h)
    return g


# ------------------------------------------------------------------ 1. attached ratios
@pytest.mark.parametrize("seed", [0, 1])
def test_attached_k3_at_one_position_is_the_reverse_kl_gradient_for_any_old_policy(seed):
    space = S.sequence_space(4, 1)
    ref, th, old = _triple(space, 10 * seed)
    g = op.expected_attached_gradient(space, th, ref, old, "k3", "token")

    def kl(x):  # KL(softmax(x) || softmax(ref)) by hand
        p, q = torch.softmax(x[0], -1), torch.softmax(ref[0], -1)
        return float((p * (p.log() - q.log())).sum())
    assert torch.allclose(g, _finite_difference(kl, th), atol=1e-8)


@pytest.mark.parametrize("seed", [0, 1])
def test_attached_k3_over_responses_is_the_partial_gradient_under_old_prefixes(seed):
    space = S.sequence_space(3, 3, eos=0)
    ref, th, old = _triple(space, 20 + seed)
    g = op.expected_attached_gradient(space, th, ref, old, "k3", "token")
    fd = _finite_difference(lambda x: _occupancy_kl_by_hand(space, x, ref, old), th)
    assert torch.allclose(g, fd, atol=1e-7)
    assert torch.allclose(op.partial_kl_gradient(space, th, ref, old), fd, atol=1e-7)
    # ... and it is not the gradient of the sequence KL
    full = S.exact_kl_gradient(space, th, ref)
    assert float((g - full).norm() / full.norm()) > 0.05


def test_attached_ratio_per_sample_gradient_is_k1_times_the_score():
    """grad(rho * k3) = rho * k1 * grad log pi for each sampled token (autograd on Categorical)."""
    torch.manual_seed(0)
    theta, ref, old = (torch.randn(5, dtype=DT) for _ in range(3))
    for a in range(5):
        x = theta.clone().requires_grad_(True)
        lp = Categorical(logits=x).log_prob(torch.tensor(a))
        lq = Categorical(logits=ref).log_prob(torch.tensor(a))
        lo = Categorical(logits=old).log_prob(torch.tensor(a))
        rho = (lp - lo).exp()
        k3 = (lq - lp).exp() - 1 - (lq - lp)
        (g_attached,) = torch.autograd.grad(rho * k3, x)
        y = theta.clone().requires_grad_(True)
        score = torch.autograd.grad(Categorical(logits=y).log_prob(torch.tensor(a)), y)[0]
        expected = float(rho.detach()) * float((lp - lq).detach()) * score
        assert torch.allclose(g_attached, expected, atol=1e-12)


def test_on_policy_attached_k3_equals_k2_in_the_loss_and_k1_reward_with_discount_zero():
    space = S.sequence_space(4, 3, eos=0)
    ref, th, _ = _triple(space, 31)
    a = op.expected_attached_gradient(space, th, ref, None, "k3", "token")
    fd = _finite_difference(lambda x: _occupancy_kl_by_hand(space, x, ref, th), th)  # prefixes held at pi_theta
    assert torch.allclose(a, fd, atol=1e-7)
    k2 = S.expected_gradient(space, th, ref, "k2", "loss")
    assert torch.allclose(k2, fd, atol=1e-7)


def test_attached_ratio_levels_differ_and_reduce_at_one_token():
    space1 = S.sequence_space(4, 1)
    ref, th, old = _triple(space1, 40)
    g = {lvl: op.expected_attached_gradient(space1, th, ref, old, "k3", lvl) for lvl in op.LEVELS}
    assert torch.allclose(g["token"], g["geometric"], atol=1e-12) and torch.allclose(g["token"], g["sequence"], atol=1e-12)
    space = S.sequence_space(3, 3, eos=0)
    ref, th, old = _triple(space, 41)
    seq = op.expected_attached_gradient(space, th, ref, old, "k3", "sequence")
    geo = op.expected_attached_gradient(space, th, ref, old, "k3", "geometric")
    assert float((seq - geo).norm()) > 1e-3


def test_attached_surrogate_monte_carlo_matches_the_exact_expectation():
    """The batch mean of the per-sequence surrogate's gradient, from the test's own sampler,
    lies within 5 standard errors of the exact expectation (in norm)."""
    space = S.sequence_space(3, 2)
    ref, th, old = _triple(space, 50)
    exact = op.expected_attached_gradient(space, th, ref, old, "k3", "token")
    g = torch.Generator().manual_seed(0)
    p_old = S.sequence_logprobs(space, old).exp()
    idx = torch.multinomial(p_old, 4000, replacement=True, generator=g)
    x = th.clone().requires_grad_(True)
    surr = op.attached_ratio_surrogate(space, x, ref, old, "k3", "token")
    per = torch.stack([torch.autograd.grad(surr[i], x, retain_graph=True)[0] for i in range(space.n_sequences)])
    samples = per[idx]
    # in norm: |mean - exact| within 5 standard errors of the whole vector
    se = float(samples.var(0).sum().sqrt()) / math.sqrt(len(idx))
    assert float((samples.mean(0) - exact).norm()) <= 5 * se


# ------------------------------------------------------------------ 2. mismatch
def test_perturb_logits_rounds_like_torch_and_noise_is_seeded():
    x = torch.tensor([[1.23456789, -7.654321]], dtype=DT)
    assert op.perturb_logits(x, "bfloat16").tolist() == x.to(torch.bfloat16).double().tolist()
    assert op.perturb_logits(x, "bfloat16").dtype == DT
    assert float((op.perturb_logits(x, "bfloat16") - x).abs().max()) <= 2.0 ** -8 * 8
    a, b = op.perturb_logits(x, "noise", 0.3, seed=1), op.perturb_logits(x, "noise", 0.3, seed=1)
    assert torch.equal(a, b) and not torch.equal(a, op.perturb_logits(x, "noise", 0.3, seed=2))
    with pytest.raises(ValueError, match="how"):
        op.perturb_logits(x, "int8")
    with pytest.raises(ValueError, match="scale"):
        op.perturb_logits(x, "noise", -1.0)


def _sequence_prob_by_hand(space, logits, n):
    row = _row(space)
    toks = space.tokens(n)
    p = 1.0
    for t in range(len(toks)):
        p *= float(torch.softmax(logits[row[toks[:t]]], -1)[toks[t]])
    return p


def test_mismatch_metrics_against_explicit_sums():
    space = S.sequence_space(3, 3, eos=0)
    pi = S.random_logits(space, scale=2.0, seed=3)
    mu = op.perturb_logits(pi, "noise", 0.5, seed=4)
    m = op.mismatch_metrics(space, pi, mu)
    P = [_sequence_prob_by_hand(space, pi, n) for n in range(space.n_sequences)]
    M = [_sequence_prob_by_hand(space, mu, n) for n in range(space.n_sequences)]
    kl_seq = sum(b * math.log(b / a) for a, b in zip(P, M))
    chi2_seq = sum(a * a / b for a, b in zip(P, M)) - 1
    assert m["kl_seq"] == pytest.approx(kl_seq, rel=1e-9)
    assert m["chi2_seq"] == pytest.approx(chi2_seq, rel=1e-9)
    assert m["ess_seq"] == pytest.approx(1 / (1 + chi2_seq), rel=1e-9)
    # per-token: by the chain rule E_mu[sum_t KL_t] is the sequence KL; chi^2 per token by hand
    length = sum(b * len(space.tokens(n)) for n, b in enumerate(M))
    assert m["kl_token"] == pytest.approx(kl_seq / length, rel=1e-9)
    row = _row(space)
    chi2_tok = 0.0
    for n, b in enumerate(M):
        toks = space.tokens(n)
        for t in range(len(toks)):
            r = float(torch.softmax(pi[row[toks[:t]]], -1)[toks[t]] / torch.softmax(mu[row[toks[:t]]], -1)[toks[t]])
            chi2_tok += b * (r * r - 1)
    assert m["chi2_token"] == pytest.approx(chi2_tok / length, rel=1e-9)
    assert m["mean_length"] == pytest.approx(length, rel=1e-12)


def test_batch_mismatch_metrics_converge_to_the_exact_ones():
    space = S.sequence_space(3, 3, eos=0)
    pi = S.random_logits(space, scale=2.0, seed=5)
    mu = op.perturb_logits(pi, "noise", 0.3, seed=6)
    exact = op.mismatch_metrics(space, pi, mu)
    idx = S.sample(space, mu, 200_000, seed=0)
    est = op.batch_mismatch_metrics(space, pi, mu, idx)
    # the token means are ratio estimators (tokens, not sequences, are averaged): consistent
    assert est["kl_token"] == pytest.approx(exact["kl_token"], rel=0.05)
    assert est["chi2_token"] == pytest.approx(exact["chi2_token"], rel=0.05)
    assert est["chi2_seq"] == pytest.approx(exact["chi2_seq"], rel=0.05)
    assert est["ess_seq"] == pytest.approx(exact["ess_seq"], rel=0.01)
    assert est["k3_token"] >= 0


def test_correction_weights_by_hand():
    space = S.sequence_space(3, 3, eos=0)
    pi = S.random_logits(space, scale=2.0, seed=7)
    mu = op.perturb_logits(pi, "noise", 1.0, seed=8)
    row = _row(space)
    C = 1.5
    w = {c: op.correction_weights(space, pi, mu, c, C) for c in op.IS_CORRECTIONS}
    for n in range(space.n_sequences):
        toks = space.tokens(n)
        rho = [float(torch.softmax(pi[row[toks[:t]]], -1)[toks[t]] / torch.softmax(mu[row[toks[:t]]], -1)[toks[t]])
               for t in range(len(toks))]
        W = math.prod(rho)
        for t, r in enumerate(rho):
            assert float(w["none"][n, t]) == 1.0
            assert float(w["token_tis"][n, t]) == pytest.approx(min(r, C), rel=1e-10)
            assert float(w["token_mis"][n, t]) == pytest.approx(r if r <= C else 0.0, rel=1e-10)
            assert float(w["seq_is"][n, t]) == pytest.approx(W, rel=1e-10)
            assert float(w["seq_tis"][n, t]) == pytest.approx(min(W, C), rel=1e-10)
            assert float(w["seq_mis"][n, t]) == pytest.approx(W if W <= C else 0.0, rel=1e-10)
        assert all(float(w[c][n, len(toks):].abs().sum()) == 0 for c in op.IS_CORRECTIONS)


def test_sequence_is_gives_the_learners_policy_gradient_and_the_others_do_not():
    space = S.sequence_space(3, 3, eos=0)
    pi = S.random_logits(space, scale=2.0, seed=9)
    mu = op.perturb_logits(pi, "noise", 1.0, seed=10)
    adv = torch.randn(space.n_sequences, dtype=DT, generator=torch.Generator().manual_seed(0))

    def value(x):  # E_{pi_x}[A] by hand
        return sum(_sequence_prob_by_hand(space, x, n) * float(adv[n]) for n in range(space.n_sequences))
    true = _finite_difference(value, pi)
    assert torch.allclose(op.expected_pg_gradient(space, pi, mu, adv, "seq_is"), true, atol=1e-7)
    assert torch.allclose(op.expected_pg_gradient(space, pi, pi, adv, "none"), true, atol=1e-7)
    for c in ("none", "token_tis", "token_mis"):
        g = op.expected_pg_gradient(space, pi, mu, adv, c, 2.0)
        assert float((g - true).norm() / true.norm()) > 1e-3, c


def test_sampled_pg_gradient_is_the_mean_of_per_sample_gradients():
    space = S.sequence_space(3, 3, eos=0)
    pi = S.random_logits(space, scale=2.0, seed=11)
    mu = op.perturb_logits(pi, "noise", 0.5, seed=12)
    adv = torch.randn(space.n_sequences, dtype=DT, generator=torch.Generator().manual_seed(1))
    idx = S.sample(space, mu, 40, seed=3)
    for c in ("token_tis", "seq_mis"):
        c_w = op.correction_weights(space, pi, mu, c, 2.0)
        total = torch.zeros_like(pi)
        for i in idx.tolist():
            x = pi.clone().requires_grad_(True)
            lp = S.token_logprobs(space, x)[i]
            total += torch.autograd.grad(float(adv[i]) * (c_w[i] * lp).sum(), x)[0]
        assert torch.allclose(op.sampled_pg_gradient(space, pi, mu, adv, idx, c, 2.0), total / len(idx), atol=1e-12)
    with pytest.raises(ValueError, match="index"):
        op.sampled_pg_gradient(space, pi, mu, adv, torch.tensor([space.n_sequences]), "none")


# ------------------------------------------------------------------ 3. trust regions
def test_gspo_ratio_is_the_length_normalised_sequence_ratio():
    space = S.sequence_space(3, 4, eos=0)
    th, old = S.random_logits(space, seed=13), S.random_logits(space, seed=14)
    s = op.gspo_ratio(S.token_logprobs(space, th), S.token_logprobs(space, old), space.mask)
    for n in range(0, space.n_sequences, 7):
        L = len(space.tokens(n))
        want = (_sequence_prob_by_hand(space, th, n) / _sequence_prob_by_hand(space, old, n)) ** (1 / L)
        assert float(s[n]) == pytest.approx(want, rel=1e-10)
    with pytest.raises(ValueError, match="mask"):
        op.gspo_ratio(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.bool))


def test_ratio_clipping_and_tv_treat_rare_and_frequent_tokens_differently():
    old = torch.tensor([0.001, 0.5, 0.5, 0.9, 0.5], dtype=DT)
    new = torch.tensor([0.0013, 0.65, 0.58, 0.74, 0.5], dtype=DT)
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, 0.0], dtype=DT)
    ratio = op.trust_region_mask(new, old, adv, "ratio", 0.2, 0.2)
    tv = op.trust_region_mask(new, old, adv, "tv", 0.1, 0.1)
    # the rare token moved by 0.0003 (ratio 1.3): clipping drops it, TV keeps it
    assert not bool(ratio[0]) and bool(tv[0])
    # 0.5 -> 0.65 is far in both senses; 0.5 -> 0.58 in neither; A = 0 is never dropped
    assert not bool(ratio[1]) and not bool(tv[1]) and bool(ratio[2]) and bool(tv[2]) and bool(ratio[4] & tv[4])
    # 0.9 -> 0.74 with A < 0: ratio 0.82 is inside the clip range, TV 0.16 is outside
    assert bool(ratio[3]) and not bool(tv[3])


def test_binary_kl_mask_uses_the_bernoulli_kl():
    old = torch.tensor([0.01, 0.3, 0.6, 0.6], dtype=DT)
    new = torch.tensor([0.05, 0.4, 0.45, 0.7], dtype=DT)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=DT)
    kl = kl_divergence(Bernoulli(probs=old), Bernoulli(probs=new))
    keep = op.trust_region_mask(new, old, adv, "binary_kl", 0.02, 0.02)
    # dropped only when the KL is large AND the token moved the way its advantage pushes
    moved_with_advantage = torch.where(adv > 0, new > old, new < old)
    assert torch.equal(keep, ~((kl > 0.02) & moved_with_advantage))
    assert not bool(keep.all()) and bool(keep[3])


def test_masked_loss_with_the_ratio_mask_has_ppos_clipped_gradient():
    g = torch.Generator().manual_seed(0)
    old = torch.log_softmax(torch.randn(64, 6, dtype=DT, generator=g), -1)
    new = (old + 0.4 * torch.randn(64, 6, dtype=DT, generator=g)).log_softmax(-1)
    a = torch.randint(0, 6, (64,), generator=g)
    adv = torch.randn(64, dtype=DT, generator=g)
    x1 = new.clone().requires_grad_(True)
    lp, lo = x1.log_softmax(-1)[torch.arange(64), a], old[torch.arange(64), a]
    keep = op.trust_region_mask(lp.exp(), lo.exp(), adv, "ratio", 0.2, 0.2)
    (g1,) = torch.autograd.grad(op.masked_pg_loss(lp, lo, adv, keep), x1)
    x2 = new.clone().requires_grad_(True)
    rho = (x2.log_softmax(-1)[torch.arange(64), a] - lo).exp()
    ppo = -torch.minimum(rho * adv, rho.clamp(0.8, 1.2) * adv).mean()
    (g2,) = torch.autograd.grad(ppo, x2)
    assert not bool(keep.all()) and torch.allclose(g1, g2, atol=1e-12)


def test_bandit_run_rules_agree_when_no_mask_binds_and_report_exact_kl():
    ref = -torch.log(torch.arange(1, 9, dtype=DT))
    r = torch.zeros(8, dtype=DT)
    r[5] = 1.0
    runs = {rule: op.bandit_run(ref, r, rule, 1e6, 1e6, iterations=3, batch=64, epochs=2, seed=1)
            for rule in op.TRUST_REGION_RULES}
    assert runs["ratio"] == runs["tv"] == runs["binary_kl"]
    assert all(k == 1.0 for k in runs["ratio"]["kept"])
    tight = op.bandit_run(ref, r, "ratio", 0.01, 0.01, iterations=3, batch=64, epochs=8, lr=0.2, seed=1)
    loose = op.bandit_run(ref, r, "ratio", 1e6, 1e6, iterations=3, batch=64, epochs=8, lr=0.2, seed=1)
    assert tight["kl_step"][0] < loose["kl_step"][0] and min(tight["kept"]) < 1.0
    assert all(k >= 0 for k in tight["kl_step"]) and all(0 <= t <= 1 for t in tight["tv_step"])


@pytest.mark.parametrize("call, match", [
    (lambda s, t: op.expected_attached_gradient(s, t, t, None, "k4"), "estimator"),
    (lambda s, t: op.expected_attached_gradient(s, t, t, None, "k3", "batch"), "level"),
    (lambda s, t: op.expected_attached_gradient(s, t[:1], t), "logits"),
    (lambda s, t: op.correction_weights(s, t, t, "seq_is", 0.0), "threshold"),
    (lambda s, t: op.correction_weights(s, t, t, "both"), "correction"),
    (lambda s, t: op.expected_pg_gradient(s, t, t, torch.zeros(3)), "advantage"),
    (lambda s, t: op.trust_region_mask(torch.tensor([1.5]), torch.tensor([0.5]), 1.0), "prob"),
    (lambda s, t: op.trust_region_mask(torch.tensor([0.5]), torch.tensor([0.5]), 1.0, "kl"), "rule"),
    (lambda s, t: op.bandit_run(torch.zeros(3), torch.zeros(4)), "reward"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, match):
    space = S.sequence_space(3, 2)
    theta = S.random_logits(space, seed=0)
    with pytest.raises(ValueError, match=match):
        call(space, theta)
