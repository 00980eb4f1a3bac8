"""Tests for klbook_lib.rlhf.rewards: the per-token KL reward and the exact token KL.

References are independent of the code under test: rewards written out by hand for
small batches, a brute-force double loop over the vocabulary with Python floats,
torch.distributions.kl_divergence, and Monte Carlo averages with tolerances derived
from the sample size.
"""
from __future__ import annotations

import math

import pytest
import torch

from klbook_lib.rlhf import rewards as R

torch.set_num_threads(1)


# --------------------------------------------------------------------------- hand cases
def test_right_padded_hand_case():
    # Row 0: 3 real tokens then 1 pad; row 1: 4 real tokens (no pad).
    lp = torch.tensor([[-1.0, -2.0, -0.5, -9.0], [-0.1, -0.2, -0.3, -0.4]])
    ref = torch.tensor([[-1.5, -1.0, -0.5, -3.0], [-0.3, -0.2, -0.1, -1.4]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    scores = torch.tensor([2.0, -1.0])
    beta = 0.1
    out = R.per_token_rewards(lp, ref, scores, mask, beta)
    # Written out: -beta * (lp - ref) on real tokens, score on the last real one.
    expected = torch.tensor(
        [
            [-0.1 * 0.5, -0.1 * -1.0, -0.1 * 0.0 + 2.0, 0.0],
            [-0.1 * 0.2, -0.1 * 0.0, -0.1 * -0.2, -0.1 * 1.0 - 1.0],
        ]
    )
    torch.testing.assert_close(out, expected)


def test_left_padded_hand_case():
    # Left padding: pads first, the score goes on the LAST column for every row.
    lp = torch.tensor([[-7.0, -7.0, -1.0, -2.0], [-7.0, -0.5, -0.5, -0.5]])
    ref = torch.tensor([[-1.0, -1.0, -2.0, -1.0], [-1.0, -1.5, -0.5, 0.0]])
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    scores = torch.tensor([1.0, 3.0])
    out = R.per_token_rewards(lp, ref, scores, mask, beta=0.5)
    expected = torch.tensor(
        [
            [0.0, 0.0, -0.5 * 1.0, -0.5 * -1.0 + 1.0],
            [0.0, -0.5 * 1.0, 0.0, -0.5 * -0.5 + 3.0],
        ]
    )
    torch.testing.assert_close(out, expected)


def test_mixed_lengths_and_prompt_positions():
    # A mask that also excludes prompt tokens on the left and pads on the right.
    lp = torch.zeros(2, 6)
    ref = torch.zeros(2, 6)
    mask = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]])
    out = R.per_token_rewards(lp, ref, torch.tensor([5.0, 7.0]), mask, beta=1.0)
    expected = torch.zeros(2, 6)
    expected[0, 3] = 5.0
    expected[1, 5] = 7.0
    torch.testing.assert_close(out, expected)
    assert R.last_token_index(mask).tolist() == [3, 5]


def test_pads_holding_inf_or_nan_give_zero_reward():
    lp = torch.tensor([[-1.0, float("-inf"), float("nan")]])
    ref = torch.tensor([[-2.0, float("-inf"), 0.0]])
    mask = torch.tensor([[1, 0, 0]])
    for est in R.ESTIMATORS:
        out = R.per_token_rewards(lp, ref, torch.tensor([0.0]), mask, beta=0.3, estimator=est)
        assert torch.isfinite(out).all(), (est, out)
        assert out[0, 1] == 0.0 and out[0, 2] == 0.0


def test_bool_mask_equals_int_mask():
    g = torch.Generator().manual_seed(0)
    lp, ref = -torch.rand(3, 5, generator=g), -torch.rand(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    s = torch.tensor([0.1, 0.2, 0.3])
    a = R.per_token_rewards(lp, ref, s, mask, 0.2)
    b = R.per_token_rewards(lp, ref, s, mask.bool(), 0.2)
    c = R.per_token_rewards(lp, ref, s, mask.float(), 0.2)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, c)


def test_estimators_hand_values():
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-2.0, -1.0]])
    mask = torch.ones(1, 2)
    # log-ratios l = +1, -1.
    k1 = [1.0, -1.0]
    k2 = [0.5, 0.5]
    k3 = [math.exp(-1) - 1 + 1, math.exp(1) - 1 - 1]
    for est, k in (("k1", k1), ("k2", k2), ("k3", k3)):
        out = R.per_token_rewards(lp, ref, torch.tensor([0.0]), mask, beta=2.0, estimator=est)
        torch.testing.assert_close(out, torch.tensor([[-2.0 * k[0], -2.0 * k[1]]]))


def test_score_clip():
    lp = torch.zeros(3, 2)
    mask = torch.ones(3, 2)
    out = R.per_token_rewards(lp, lp, torch.tensor([10.0, -10.0, 0.5]), mask, 0.0, score_clip=2.0)
    assert out[:, 1].tolist() == [2.0, -2.0, 0.5]
    assert out[:, 0].tolist() == [0.0, 0.0, 0.0]


def test_sum_of_k1_rewards_is_sequence_log_ratio():
    # Sum over tokens of -beta*k1 + score = score - beta * log(pi_theta(y)/pi_ref(y)).
    g = torch.Generator().manual_seed(1)
    lp, ref = -3 * torch.rand(4, 7, generator=g), -3 * torch.rand(4, 7, generator=g)
    mask = (torch.rand(4, 7, generator=g) < 0.7).long()
    mask[:, 0] = 1
    s = torch.randn(4, generator=g)
    out = R.per_token_rewards(lp, ref, s, mask, beta=0.05)
    seq_lr = torch.tensor(
        [sum(float(lp[b, t] - ref[b, t]) for t in range(7) if mask[b, t]) for b in range(4)]
    )
    torch.testing.assert_close(out.sum(1), s - 0.05 * seq_lr)


# --------------------------------------------------------------------------- exact KL
def _brute_force_kl(logits, ref_logits, mask):
    B, T, V = logits.shape
    out = [[0.0] * T for _ in range(B)]
    for b in range(B):
        for t in range(T):
            if not mask[b][t]:
                continue
            zp = sum(math.exp(float(logits[b, t, v])) for v in range(V))
            zq = sum(math.exp(float(ref_logits[b, t, v])) for v in range(V))
            total = 0.0
            for v in range(V):
                p = math.exp(float(logits[b, t, v])) / zp
                q = math.exp(float(ref_logits[b, t, v])) / zq
                total += p * math.log(p / q)
            out[b][t] = total
    return torch.tensor(out, dtype=torch.float64)


def test_exact_token_kl_vs_brute_force():
    g = torch.Generator().manual_seed(2)
    logits = 2 * torch.randn(3, 4, 11, generator=g, dtype=torch.float64)
    ref_logits = 2 * torch.randn(3, 4, 11, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [1, 1, 1, 1]])
    got = R.exact_token_kl(logits, ref_logits, mask)
    torch.testing.assert_close(got, _brute_force_kl(logits, ref_logits, mask.tolist()))
    # and against torch.distributions on the real positions
    td = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=logits),
        torch.distributions.Categorical(logits=ref_logits),
    )
    torch.testing.assert_close(got, torch.where(mask.bool(), td, torch.zeros_like(td)))
    seq = R.sequence_sum(got, mask)
    torch.testing.assert_close(seq, (td * mask).sum(1))


def test_exact_token_kl_with_truncated_policy():
    # A top-k policy has -inf logits: those tokens contribute 0, not NaN.
    logits = torch.tensor([[[0.0, 0.0, float("-inf"), float("-inf")]]])
    ref = torch.zeros(1, 1, 4)
    got = R.exact_token_kl(logits, ref, torch.ones(1, 1))
    torch.testing.assert_close(got, torch.tensor([[math.log(2.0)]]))  # log(0.5/0.25)
    # the reverse situation: the policy puts mass where the reference has none -> +inf
    got2 = R.exact_token_kl(ref, logits, torch.ones(1, 1))
    assert torch.isinf(got2).all() and (got2 > 0).all()


def test_k1_average_approaches_exact_kl():
    # Sample many tokens from pi_theta at one position; mean of k1 -> exact KL.
    g = torch.Generator().manual_seed(3)
    V, N = 20, 40_000
    logits = torch.randn(V, generator=g, dtype=torch.float64)
    ref_logits = torch.randn(V, generator=g, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    tokens = torch.multinomial(p, N, replacement=True, generator=g)
    lp = torch.log_softmax(logits, -1)[tokens]
    ref = torch.log_softmax(ref_logits, -1)[tokens]
    exact = R.exact_token_kl(logits.view(1, 1, V), ref_logits.view(1, 1, V), torch.ones(1, 1))
    for est in ("k1", "k3"):
        k = R.kl_per_token(lp.view(1, N), ref.view(1, N), est).flatten()
        se = k.std() / math.sqrt(N)
        # 5 standard errors: a false failure has probability below 1e-6.
        assert abs(k.mean() - exact.item()) < 5 * se, (est, k.mean(), exact, se)
    # k2 is biased: its mean approaches sum_v p(v) l(v)^2 / 2, which is not the KL.
    k2 = R.kl_per_token(lp.view(1, N), ref.view(1, N), "k2").flatten()
    l_all = torch.log_softmax(logits, -1) - torch.log_softmax(ref_logits, -1)
    e_k2 = float((p * 0.5 * l_all**2).sum())
    assert abs(k2.mean() - e_k2) < 5 * k2.std() / math.sqrt(N)
    assert abs(e_k2 - exact.item()) > 1e-3


def test_summed_k1_over_sequences_approaches_sequence_kl():
    # Autoregressive toy: two-token sequences over a vocabulary of 3, second-token
    # distribution depends on the first. Sum of k1 over tokens, averaged over sampled
    # sequences, approaches the exact sequence KL computed by enumerating all 9 sequences.
    g = torch.Generator().manual_seed(4)
    V, N = 3, 50_000
    l1, r1 = torch.randn(V, generator=g, dtype=torch.float64), torch.randn(V, generator=g, dtype=torch.float64)
    l2, r2 = torch.randn(V, V, generator=g, dtype=torch.float64), torch.randn(V, V, generator=g, dtype=torch.float64)
    lp1, lq1 = torch.log_softmax(l1, -1), torch.log_softmax(r1, -1)
    lp2, lq2 = torch.log_softmax(l2, -1), torch.log_softmax(r2, -1)
    exact = sum(
        math.exp(lp1[a] + lp2[a, b]) * float(lp1[a] + lp2[a, b] - lq1[a] - lq2[a, b])
        for a in range(V) for b in range(V)
    )
    a = torch.multinomial(lp1.exp(), N, replacement=True, generator=g)
    b = torch.multinomial(lp2[a].exp(), 1, generator=g).squeeze(1)
    lp = torch.stack([lp1[a], lp2[a, b]], 1)
    ref = torch.stack([lq1[a], lq2[a, b]], 1)
    mask = torch.ones(N, 2)
    seq_k1 = R.sequence_sum(R.kl_per_token(lp, ref, "k1"), mask)
    se = seq_k1.std() / math.sqrt(N)
    assert abs(seq_k1.mean() - exact) < 5 * se  # 5 standard errors
    # The exact per-token KL summed along the sampled prefixes is another unbiased
    # estimate of the same sequence KL (and has lower variance).
    logits = torch.stack([l1.expand(N, V), l2[a]], 1)
    ref_logits = torch.stack([r1.expand(N, V), r2[a]], 1)
    seq_exact = R.sequence_sum(R.exact_token_kl(logits, ref_logits, mask), mask)
    se2 = seq_exact.std() / math.sqrt(N)
    assert abs(seq_exact.mean() - exact) < 5 * se2
    assert seq_exact.std() < seq_k1.std()


def test_masked_mean_excludes_pads():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert R.masked_mean(x, m).item() == pytest.approx(2.0)


def test_token_logprobs_matches_categorical_and_temperature():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 3, 7, generator=g)
    tokens = torch.randint(0, 7, (2, 3), generator=g)
    for temp in (1.0, 0.7):
        want = torch.distributions.Categorical(logits=logits / temp).log_prob(tokens)
        torch.testing.assert_close(R.token_logprobs(logits, tokens, temp), want)


# --------------------------------------------------------------------------- bad inputs
def _good():
    return torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda a: a.update(response_mask=torch.ones(2, 4)), "response_mask"),
        (lambda a: a.update(response_mask=torch.tensor([[1, 1, 0], [0, 0, 0]])), "response_mask.*empty"),
        (lambda a: a.update(scores=torch.tensor([0.0, float("nan")])), "scores.*NaN"),
        (lambda a: a.update(response_mask=torch.tensor([[1, 0.5, 0], [1, 1, 1]])), "response_mask.*0 and 1"),
        (lambda a: a.update(beta=-0.1), "beta"),
        (lambda a: a.update(beta=float("nan")), "beta"),
        (lambda a: a.update(scores=torch.zeros(3)), "scores"),
        (lambda a: a.update(ref_logprobs=torch.zeros(2, 4)), "ref_logprobs"),
        (lambda a: a.update(logprobs=torch.zeros(2, 3, 1)), "logprobs"),
        (lambda a: a.update(estimator="k4"), "estimator"),
        (lambda a: a.update(score_clip=0.0), "score_clip"),
        (lambda a: a.update(logprobs=torch.tensor([[float("nan"), 0, 0], [0, 0, 0]])), "logprobs.*NaN"),
    ],
)
def test_bad_inputs(change, match):
    lp, ref, s, m = _good()
    args = dict(logprobs=lp, ref_logprobs=ref, scores=s, response_mask=m, beta=0.1)
    change(args)
    with pytest.raises(ValueError, match=match):
        R.per_token_rewards(**args)


def test_exact_kl_bad_inputs():
    with pytest.raises(ValueError, match="ref_logits"):
        R.exact_token_kl(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4), torch.ones(1, 2))
    with pytest.raises(ValueError, match="response_mask"):
        R.exact_token_kl(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.ones(1, 3))
    with pytest.raises(ValueError, match="logits"):
        R.exact_token_kl(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="temperature"):
        R.token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), 0.0)


# --------------------------------------------------------------------------- property
from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 4), st.integers(1, 6), st.integers(0, 4)),  # (left pads, real, right pads)
        min_size=1, max_size=5,
    ),
    beta=st.floats(0.0, 2.0),
    seed=st.integers(0, 10_000),
)
def test_property_score_on_last_real_token_any_padding(rows, beta, seed):
    # Any mix of left and right padding: pads get exactly 0, the score sits on the
    # last real token, and each row's return is score - beta * (sum of k1 over real tokens).
    T = max(l + n + r for l, n, r in rows)
    B = len(rows)
    mask = torch.zeros(B, T, dtype=torch.long)
    last = []
    for b, (l, n, _) in enumerate(rows):
        mask[b, l:l + n] = 1
        last.append(l + n - 1)
    g = torch.Generator().manual_seed(seed)
    lp = -3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    ref = -3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    s = torch.randn(B, generator=g, dtype=torch.float64)
    out = R.per_token_rewards(lp, ref, s, mask, beta)
    assert R.last_token_index(mask).tolist() == last
    assert torch.all(out[mask == 0] == 0)
    for b in range(B):
        kl_sum = sum(float(lp[b, t] - ref[b, t]) for t in range(T) if mask[b, t])
        assert math.isclose(float(out[b].sum()), float(s[b]) - beta * kl_sum, rel_tol=1e-9, abs_tol=1e-9)
        # the score is only on the last real token: other real tokens carry -beta * k1 only
        for t in range(T):
            if mask[b, t] and t != last[b]:
                assert math.isclose(float(out[b, t]), -beta * float(lp[b, t] - ref[b, t]), abs_tol=1e-12)


# --------------------------------------------------------------------------- unmasked GAE (TRL's)
def _gae_closed_form(rewards, values, gamma, lam):
    """A_t = sum_{u >= t} (gamma*lam)**(u-t) * delta_u, delta_u = R_u + gamma*V_{u+1} - V_u, V_T = 0."""
    B, T = rewards.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            total = 0.0
            for u in range(t, T):
                v_next = float(values[b, u + 1]) if u + 1 < T else 0.0
                delta = float(rewards[b, u]) + gamma * v_next - float(values[b, u])
                total += (gamma * lam) ** (u - t) * delta
            out[b, t] = total
    return out


def test_gae_unmasked_hand_case_score_on_first_pad():
    # three real tokens then one pad; the score (1) sits on the pad, as in TRL's PPO trainer
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    adv, ret = R.gae_unmasked(r, torch.zeros(1, 4), gamma=1.0, lam=0.95)
    real = adv[0, :3]
    torch.testing.assert_close(real, torch.tensor([0.95**3, 0.95**2, 0.95]))
    torch.testing.assert_close(ret, adv)
    # the book's masked GAE loses it entirely
    from klbook_lib.rlhf import ppo
    masked, _ = ppo.gae(r, torch.zeros(1, 4), torch.tensor([[1, 1, 1, 0]]), 1.0, 0.95)
    assert torch.all(masked == 0)


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (0.99, 1.0), (1.0, 0.0)])
def test_gae_unmasked_matches_closed_form(gamma, lam):
    g = torch.Generator().manual_seed(11)
    r = torch.randn(3, 6, generator=g, dtype=torch.float64)
    v = torch.randn(3, 6, generator=g, dtype=torch.float64)
    adv, ret = R.gae_unmasked(r, v, gamma, lam)
    torch.testing.assert_close(adv, _gae_closed_form(r, v, gamma, lam))
    torch.testing.assert_close(ret, adv + v)


def test_gae_unmasked_bad_inputs():
    with pytest.raises(ValueError, match="values"):
        R.gae_unmasked(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="lam"):
        R.gae_unmasked(torch.zeros(2, 3), torch.zeros(2, 3), lam=1.5)
    with pytest.raises(ValueError, match="gamma"):
        R.gae_unmasked(torch.zeros(2, 3), torch.zeros(2, 3), gamma=-0.1)
    with pytest.raises(ValueError, match="rewards"):
        R.gae_unmasked(torch.zeros(3), torch.zeros(3))
