"""Tests of klbook_lib.rlhf.distill: per-token divergences, the three distillation losses, helpers.

References: torch.distributions.kl_divergence on Categorical distributions (and on the
explicit mixture for the generalised JSD), and exact sequence-level KLs of a tabular
autoregressive model whose sequences can all be enumerated: 3 tokens (a, b, EOS), at most
3 steps, 15 sequences. Gradients of the losses, weighted by the exact sequence
probabilities, are compared with autograd gradients of the enumerated KLs.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.distributions import Categorical, kl_divergence

from klbook_lib.rlhf import distill as Dl
from rlhf_helpers import micro_policy, small_tokenizer

torch.set_num_threads(1)


def random_logits(B=3, T=5, V=7, seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(B, T, V, generator=g, dtype=torch.float64),
            scale * torch.randn(B, T, V, generator=g, dtype=torch.float64))


# right padding in row 1, left padding in row 2 (e.g. a prompt region), full row 0
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 1, 1, 1]])


# --------------------------------------------------------------------------- per-token divergences
def test_forward_and_reverse_match_torch_distributions():
    s, t = random_logits()
    P, Q = Categorical(logits=t), Categorical(logits=s)          # teacher p, student q
    fwd = Dl.token_divergence(s, t, MASK, "forward")
    rev = Dl.token_divergence(s, t, MASK, "reverse")
    m = MASK.bool()
    torch.testing.assert_close(fwd, torch.where(m, kl_divergence(P, Q), torch.zeros(())))
    torch.testing.assert_close(rev, torch.where(m, kl_divergence(Q, P), torch.zeros(())))


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_generalised_jsd_matches_the_mixture_definition(beta):
    s, t = random_logits(seed=1)
    P, Q = Categorical(logits=t), Categorical(logits=s)
    M = Categorical(probs=beta * P.probs + (1 - beta) * Q.probs)
    expected = beta * kl_divergence(P, M) + (1 - beta) * kl_divergence(Q, M)
    got = Dl.token_divergence(s, t, MASK, "jsd", beta)
    torch.testing.assert_close(got, torch.where(MASK.bool(), expected, torch.zeros(())))
    assert bool((got <= math.log(2) + 1e-12).all()) if beta == 0.5 else True


def test_generalised_jsd_limits_are_scaled_kls():
    s, t = random_logits(seed=2, scale=1.0)
    m = torch.ones(3, 5)
    fwd = Dl.token_divergence(s, t, m, "forward")
    rev = Dl.token_divergence(s, t, m, "reverse")
    eps = 1e-5
    torch.testing.assert_close(Dl.token_divergence(s, t, m, "jsd", eps) / eps, fwd, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(Dl.token_divergence(s, t, m, "jsd", 1 - eps) / eps, rev, rtol=1e-3, atol=1e-6)
    # beta = 1/2 is symmetric in the two distributions
    torch.testing.assert_close(Dl.token_divergence(s, t, m, "jsd"), Dl.token_divergence(t, s, m, "jsd"))


def test_zero_at_equality_and_zero_probabilities():
    s, _ = random_logits(seed=3)
    m = torch.ones(3, 5)
    for kind in ("forward", "reverse", "jsd"):
        assert float(Dl.token_divergence(s, s.clone(), m, kind).abs().max()) < 1e-12
    # a token the teacher cannot emit: reverse KL infinite where the student can, forward KL finite
    t = s.clone()
    t[..., 0] = -math.inf
    assert torch.isinf(Dl.token_divergence(s, t, m, "reverse")).all()
    assert torch.isfinite(Dl.token_divergence(s, t, m, "forward")).all()


def test_losses_reduce_over_real_tokens_only():
    s, t = random_logits(seed=4)
    fwd = Dl.token_divergence(s, t, MASK, "forward")
    per_seq = fwd.sum(1)
    assert float(Dl.forward_kl_loss(s, t, MASK)) == pytest.approx(float(per_seq.mean()))
    assert float(Dl.forward_kl_loss(s, t, MASK, reduction="token")) == pytest.approx(float(fwd.sum() / MASK.sum()))
    jsd = Dl.token_divergence(s, t, MASK, "jsd", 0.3)
    assert float(Dl.gkd_loss(s, t, MASK, beta=0.3)) == pytest.approx(float(jsd.sum(1).mean()))
    # whatever the pads hold (huge logits), the loss and the gradient there do not change
    s2, t2 = s.clone(), t.clone()
    s2[~MASK.bool()] = 1e4
    t2[~MASK.bool()] = -1e4
    s2.requires_grad_(True)
    for loss_fn in (lambda a: Dl.forward_kl_loss(a, t2, MASK), lambda a: Dl.gkd_loss(a, t2, MASK),
                    lambda a: Dl.reverse_kl_loss(a, t2, torch.zeros(3, 5, dtype=torch.long), MASK)):
        s2.grad = None
        loss = loss_fn(s2)
        assert torch.isfinite(loss)
        loss.backward()
        assert float(s2.grad[~MASK.bool()].abs().max()) == 0.0


def test_input_errors():
    s, t = random_logits()
    with pytest.raises(ValueError, match="teacher_logits"):
        Dl.token_divergence(s, t[:, :4], MASK)
    with pytest.raises(ValueError, match="response_mask"):
        Dl.token_divergence(s, t, MASK[:, :4])
    with pytest.raises(ValueError, match="response_mask: must contain only 0 and 1"):
        Dl.token_divergence(s, t, MASK * 2)
    with pytest.raises(ValueError, match="row"):
        Dl.token_divergence(s, t, torch.zeros(3, 5))
    with pytest.raises(ValueError, match="kind"):
        Dl.token_divergence(s, t, MASK, "sideways")
    with pytest.raises(ValueError, match="beta"):
        Dl.gkd_loss(s, t, MASK, beta=1.0)
    with pytest.raises(ValueError, match="future"):
        Dl.reverse_kl_loss(s, t, torch.zeros(3, 5, dtype=torch.long), MASK, future="past")
    with pytest.raises(ValueError, match="response_ids"):
        Dl.reverse_kl_loss(s, t, torch.zeros(3, 4, dtype=torch.long), MASK)
    with pytest.raises(ValueError, match="reduction"):
        Dl.forward_kl_loss(s, t, MASK, reduction="sum")


# --------------------------------------------------------------------------- exact gradients
A, B, E = 0, 1, 2           # tokens; E is EOS
PREFIXES = {(): 0, (A,): 1, (B,): 2, (A, A): 3, (A, B): 4, (B, A): 5, (B, B): 6}


def all_sequences():
    seqs = [(E,), (A, E), (B, E)]
    seqs += [(x, y, z) for x in (A, B) for y in (A, B) for z in (A, B, E)]
    return seqs


def batch(seqs, table, left_pad=False):
    """tokens, mask and logits [N, 3, 3] of the sequences under a [7, 3] table of logits."""
    N, T = len(seqs), 3
    tokens = torch.zeros(N, T, dtype=torch.long)
    mask = torch.zeros(N, T, dtype=torch.long)
    idx = torch.zeros(N, T, dtype=torch.long)
    for i, s in enumerate(seqs):
        off = T - len(s) if left_pad else 0
        for t, tok in enumerate(s):
            tokens[i, off + t] = tok
            mask[i, off + t] = 1
            idx[i, off + t] = PREFIXES[tuple(s[:t])]
    return tokens, mask, table[idx]


def seq_logprob(seqs, table):
    tokens, mask, logits = batch(seqs, table)
    lp = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.where(mask.bool(), lp, torch.zeros_like(lp)).sum(1)


@pytest.fixture()
def tables():
    g = torch.Generator().manual_seed(5)
    theta = torch.randn(7, 3, generator=g, dtype=torch.float64).requires_grad_(True)
    teacher = 1.5 * torch.randn(7, 3, generator=g, dtype=torch.float64)
    return theta, teacher


def test_enumeration_is_a_distribution(tables):
    theta, teacher = tables
    for tab in (theta, teacher):
        assert float(seq_logprob(all_sequences(), tab).detach().exp().sum()) == pytest.approx(1.0, abs=1e-12)


def weighted_grad(theta, weights, loss_of_row):
    """sum_y w(y) * grad loss(y), one sequence at a time."""
    total = torch.zeros_like(theta)
    for y, w in zip(all_sequences(), weights):
        theta.grad = None
        loss_of_row(y).backward()
        total += w * theta.grad
    return total


@pytest.mark.parametrize("left_pad", [False, True])
def test_forward_kl_loss_has_the_sequence_level_gradient(tables, left_pad):
    theta, teacher = tables
    seqs = all_sequences()
    lp_t = seq_logprob(seqs, teacher)
    exact = (lp_t.exp() * (lp_t - seq_logprob(seqs, theta))).sum()
    (g_exact,) = torch.autograd.grad(exact, theta)

    def loss(y):
        tok, mask, s_logits = batch([y], theta, left_pad)
        _, _, t_logits = batch([y], teacher, left_pad)
        return Dl.forward_kl_loss(s_logits, t_logits, mask)

    g = weighted_grad(theta, lp_t.exp().tolist(), loss)
    torch.testing.assert_close(g, g_exact, rtol=1e-10, atol=1e-12)
    # and the expected loss itself is the sequence-level forward KL (chain rule of KL)
    with torch.no_grad():
        val = sum(w * float(loss(y)) for y, w in zip(seqs, lp_t.exp().tolist()))
    assert val == pytest.approx(float(exact.detach()), abs=1e-10)


@pytest.mark.parametrize("future", ["exact", "sampled"])
@pytest.mark.parametrize("left_pad", [False, True])
def test_reverse_kl_loss_has_the_sequence_level_gradient(tables, future, left_pad):
    theta, teacher = tables
    seqs = all_sequences()
    lp_q = seq_logprob(seqs, theta)
    exact = (lp_q.exp() * (lp_q - seq_logprob(seqs, teacher))).sum()
    (g_exact,) = torch.autograd.grad(exact, theta)
    weights = lp_q.exp().detach().tolist()

    def loss(y, fut=future):
        tok, mask, s_logits = batch([y], theta, left_pad)
        _, _, t_logits = batch([y], teacher, left_pad)
        return Dl.reverse_kl_loss(s_logits, t_logits, tok, mask, future=fut, baseline=False)

    g = weighted_grad(theta, weights, loss)
    torch.testing.assert_close(g, g_exact, rtol=1e-10, atol=1e-12)
    # without the policy-gradient term the gradient is only partial: clearly different
    g_none = weighted_grad(theta, weights, lambda y: loss(y, "none"))
    assert float((g_none - g_exact).norm()) > 0.1 * float(g_exact.norm())


def test_reverse_kl_baseline_keeps_the_expected_gradient(tables):
    # Monte Carlo: sample sequences from the student, average the gradient of the loss with
    # the batch baseline over independent batches; compare with the exact gradient within
    # 5 standard errors of the mean of the batch gradients.
    theta, teacher = tables
    seqs = all_sequences()
    lp_q = seq_logprob(seqs, theta)
    exact = (lp_q.exp() * (lp_q - seq_logprob(seqs, teacher))).sum()
    (g_exact,) = torch.autograd.grad(exact, theta)
    probs = lp_q.exp().detach()
    g = torch.Generator().manual_seed(6)
    grads = []
    for _ in range(40):
        draw = torch.multinomial(probs, 500, replacement=True, generator=g).tolist()
        tok, mask, s_logits = batch([seqs[i] for i in draw], theta)
        _, _, t_logits = batch([seqs[i] for i in draw], teacher)
        theta.grad = None
        Dl.reverse_kl_loss(s_logits, t_logits, tok, mask, baseline=True).backward()
        grads.append(theta.grad.clone())
    G = torch.stack(grads)
    se = G.std(0) / math.sqrt(len(grads))
    assert bool(((G.mean(0) - g_exact).abs() <= 5 * se + 1e-9).all())


def test_gkd_is_zero_at_the_teacher_and_positive_elsewhere(tables):
    theta, teacher = tables
    tok, mask, t_logits = batch(all_sequences(), teacher)
    assert float(Dl.gkd_loss(t_logits.clone(), t_logits, mask)) == pytest.approx(0.0, abs=1e-12)
    _, _, s_logits = batch(all_sequences(), theta)
    assert float(Dl.gkd_loss(s_logits, t_logits, mask).detach()) > 0


# --------------------------------------------------------------------------- helpers and training
def test_response_style_and_sentiment():
    assert Dl.response_style(" really lovely and the staff was friendly .") == "A and the N was A ."
    assert Dl.response_style(" good .") == "A ."
    assert Dl.response_style(" very good , bad and okay .") == "A , A and A ."
    assert Dl.response_style(" good good good") == "other"
    assert Dl.sentiment_class(" great .") == "positive"
    assert Dl.sentiment_class(" awful and bad .") == "negative"
    assert Dl.sentiment_class(" okay .") == "neutral"
    with pytest.raises(ValueError, match="response"):
        Dl.response_style(3)


def test_make_student_and_config_errors():
    tok = small_tokenizer()
    st = Dl.make_student(tok, n_layer=0, n_embd=16, n_head=2)
    assert st.config.n_layer == 0 and st.config.vocab_size == len(tok)
    with pytest.raises(ValueError, match="n_head"):
        Dl.make_student(tok, n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="n_layer"):
        Dl.make_student(tok, n_layer=-1)
    for bad, name in ((dict(method="sideways"), "method"), (dict(steps=0), "steps"), (dict(lr=0.0), "lr"),
                      (dict(jsd_beta=0.0), "beta"), (dict(teacher_pool=-1), "teacher_pool")):
        with pytest.raises(ValueError, match=name):
            Dl.DistillConfig(**bad).check()


def test_rollout_from_tokens_lines_up_with_the_logits():
    tok = small_tokenizer()
    model = micro_policy(tok)
    eos = tok.eos_token_id
    resp = [tok.encode(" good .", add_special_tokens=False) + [eos], tok.encode(" bad", add_special_tokens=False)]
    ro = Dl.rollout_from_tokens(tok, ["the food was", "i found the menu"], resp)
    assert ro.response_mask.tolist()[1][len(resp[1]):] == [0] * (ro.response_ids.shape[1] - len(resp[1]))
    assert ro.has_eos.tolist() == [True, False] and ro.responses == [" good .", " bad"]
    from klbook_lib.rlhf.ppo import response_logits
    logits = response_logits(model, ro)
    # row 0 alone, unpadded: the same next-token logits for its response tokens
    ids = torch.tensor([[tok.bos_token_id] + tok.encode("the food was", add_special_tokens=False) + resp[0]])
    full = model(input_ids=ids).logits[0]
    P = len(ids[0]) - len(resp[0])
    torch.testing.assert_close(logits[0, :len(resp[0])], full[P - 1:-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", Dl.METHODS)
def test_distil_lowers_its_own_divergence(method):
    # A random micro teacher and a student of the same shape started elsewhere: 40 steps of
    # each method lower the divergence it estimates on its own samples by a wide margin.
    tok = small_tokenizer()
    teacher = micro_policy(tok, seed=1)
    for p in teacher.parameters():
        p.requires_grad_(False)
    student = micro_policy(tok, seed=2)
    prompts = ["the food was", "i found the menu", "overall the room was"]
    cfg = Dl.DistillConfig(method=method, steps=40, batch_size=16, lr=1e-2, max_new_tokens=6, teacher_pool=64)
    hist = Dl.distil(teacher, student, tok, prompts, cfg, seed=0)
    first = np.mean([h["divergence"] for h in hist[:5]])
    last = np.mean([h["divergence"] for h in hist[-5:]])
    assert last < 0.5 * first, (first, last)


# --------------------------------------------------------------------------- the teacher-logit cache
def _alone_logits(model, tok, prompt, resp):
    """The model's logits predicting ``resp`` after ``bos + prompt``, one unpadded sequence."""
    ids = torch.tensor([[tok.bos_token_id] + tok.encode(prompt, add_special_tokens=False) + list(resp)])
    with torch.no_grad():
        full = model(input_ids=ids).logits[0]
    P = ids.shape[1] - len(resp)
    return full[P - 1:-1]


def test_pool_teacher_logits_match_each_pair_alone():
    tok = small_tokenizer()
    teacher = micro_policy(tok, seed=1)
    eos = tok.eos_token_id
    enc = lambda s: tok.encode(s, add_special_tokens=False)
    pool = [("the food was", enc(" good .") + [eos]), ("i found the menu", enc(" bad")),
            ("overall the room was", enc(" fine and the food was good .") + [eos]), ("the food was", [eos])]
    got = Dl.pool_teacher_logits(teacher, tok, pool, batch_size=3)          # two chunks, padded both sides
    assert len(got) == len(pool)
    for (prompt, resp), lg in zip(pool, got):
        assert lg.shape == (len(resp), len(tok))
        torch.testing.assert_close(lg, _alone_logits(teacher, tok, prompt, resp), rtol=1e-4, atol=1e-4)
    # gathered rows: right-padded with zeros, the layout of rollout_from_tokens on the same rows
    rows = [2, 0, 0, 3]
    batch = Dl.gather_pool_logits(got, rows)
    ro = Dl.rollout_from_tokens(tok, [pool[i][0] for i in rows], [pool[i][1] for i in rows])
    assert batch.shape[:2] == ro.response_ids.shape
    for b, i in enumerate(rows):
        n = len(pool[i][1])
        torch.testing.assert_close(batch[b, :n], _alone_logits(teacher, tok, *pool[i]), rtol=1e-4, atol=1e-4)
        assert torch.all(batch[b, n:] == 0) and ro.response_mask[b, n:].sum() == 0
    with pytest.raises(ValueError, match="rows"):
        Dl.gather_pool_logits(got, [])
    with pytest.raises(ValueError, match="batch_size"):
        Dl.pool_teacher_logits(teacher, tok, pool, batch_size=0)


def test_distil_with_cached_teacher_logits_is_the_uncached_run():
    # forward KL on a teacher pool: gathering the pool's teacher logits gives the run that
    # recomputes them on every batch (same samples, same history and student up to rounding)
    tok = small_tokenizer()
    teacher = micro_policy(tok, seed=1)
    for p in teacher.parameters():
        p.requires_grad_(False)
    prompts = ["the food was", "i found the menu", "overall the room was"]
    cfg = Dl.DistillConfig(method="forward_kl", steps=12, batch_size=8, lr=1e-2, max_new_tokens=6, teacher_pool=32)
    runs = {}
    for cache in (True, False):
        student = micro_policy(tok, seed=2)
        runs[cache] = (Dl.distil(teacher, student, tok, prompts, cfg, seed=3, cache_teacher=cache), student)
    (h1, s1), (h0, s0) = runs[True], runs[False]
    assert [h["length"] for h in h1] == [h["length"] for h in h0]          # the same pool rows every step
    for key in ("loss", "divergence"):
        np.testing.assert_allclose([h[key] for h in h1], [h[key] for h in h0], rtol=1e-4, atol=1e-6)
    assert h1[-1]["divergence"] < h1[0]["divergence"]                      # it trained
    for a, b in zip(s1.parameters(), s0.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
