"""Tests of klbook_lib.shape against independent references: scipy optimisation, finite
differences, autograd of the plain definitions, closed forms and klbook_lib.seqkl's optimum."""
import numpy as np
import pytest
import torch
from scipy.optimize import minimize

import klbook_lib.shape as sh
from klbook_lib import seqkl
from klbook_lib.dpo import dpo_loss


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("beta", [0.05, 0.3, 2.0])
def test_forward_kl_optimum_matches_scipy(beta):
    q = np.array([0.45, 0.05, 0.3, 0.2])
    r = np.array([1.0, 1.0, 0.2, -0.5])
    pi = sh.forward_kl_optimum(q, r, beta)
    # independent: maximise E_pi r - beta KL(q || pi) over softmax logits with BFGS
    f = lambda x: -(_softmax(x) @ r - beta * np.sum(q * (np.log(q) - np.log(_softmax(x)))))
    res = minimize(f, np.zeros(4), method="BFGS", options={"gtol": 1e-10})
    assert np.allclose(pi, _softmax(res.x), atol=1e-5)
    assert sh.forward_kl_objective(pi, q, r, beta) >= -res.fun - 1e-9


def test_forward_kl_optimum_keeps_reference_ratio_of_equal_rewards():
    q = np.array([0.45, 0.05, 0.5])
    for beta in (0.01, 0.1, 1.0):
        pi = sh.forward_kl_optimum(q, [1.0, 1.0, 0.0], beta)
        assert abs(pi[0] / pi[1] - 9.0) < 1e-8


def test_reverse_kl_ratio_closed_form():
    q = np.array([0.45, 0.05, 0.5])
    r = np.array([1.0, 1.3, 0.0])
    for beta in (0.05, 0.5):
        assert abs(sh.optimal_ratio(q, r, beta, 0, 1) - 9.0 * np.exp(-0.3 / beta)) < 1e-9 * 9


def test_entropy_rate_matches_finite_differences():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(5, 7, generator=g, dtype=torch.float64)
    d = torch.randn(5, 7, generator=g, dtype=torch.float64)
    h = 1e-6
    fd = (sh.entropy(z + h * d) - sh.entropy(z - h * d)) / (2 * h)
    assert torch.allclose(sh.entropy_rate(z, d), fd, atol=1e-8)
    # and against the plain definition of H differentiated by autograd
    t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    p = torch.softmax(z[0] + t * d[0], -1)
    (dh,) = torch.autograd.grad(-(p * p.log()).sum(), t)
    assert abs(float(dh) - float(sh.entropy_rate(z[0], d[0]))) < 1e-10


def test_vanilla_pg_logit_change_is_the_gradient_of_expected_advantage():
    z = torch.tensor([1.0, -0.5, 0.3, 2.0], dtype=torch.float64, requires_grad=True)
    A = torch.tensor([0.5, -1.0, 2.0, 0.1], dtype=torch.float64)
    (g,) = torch.autograd.grad((torch.softmax(z, -1) * A).sum(), z)
    assert torch.allclose(sh.pg_logit_change(z.detach(), A, 0.1, "vanilla"), 0.1 * g)
    assert torch.allclose(sh.pg_logit_change(z.detach(), A, 0.1, "natural"), 0.1 * A)


def test_clipped_bandit_first_epoch_is_the_sampled_policy_gradient():
    ref = torch.tensor([1.0, 0.0, -0.5, 0.2], dtype=torch.float64)
    r = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    h = sh.clipped_bandit_runs(ref, r, [3], iterations=1, group=8, epochs=1, lr=0.7)
    # the same draw by hand, and the plain batch policy gradient mean_i A_i (e_{a_i} - pi)
    pi = torch.softmax(ref, -1)
    arms = torch.multinomial(pi, 8, replacement=True, generator=torch.Generator().manual_seed(3))
    rw = r[arms]
    A = (rw - rw.mean()) / rw.std() if rw.std() > 0 else torch.zeros_like(rw)
    grad = (A[:, None] * (torch.nn.functional.one_hot(arms, 4).double() - pi)).mean(0)
    theta = ref + 0.7 * grad
    p1 = torch.softmax(theta, -1)
    assert abs(h["reward"][1, 0] - float(p1 @ r)) < 1e-12
    assert abs(h["entropy"][1, 0] - float(-(p1 * p1.log()).sum())) < 1e-12


def test_clipped_bandit_rejects_bad_input():
    with pytest.raises(ValueError, match="eps_high"):
        sh.clipped_bandit_runs(torch.zeros(3), torch.ones(3), [0], eps_high=-0.1)
    with pytest.raises(ValueError, match="reward"):
        sh.clipped_bandit_runs(torch.zeros(3), torch.ones(4), [0])


def test_fixed_anchor_converges_to_the_closed_form_optimum():
    sp = seqkl.sequence_space(2, 2)
    init = seqkl.random_logits(sp, seed=1)
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    beta = 0.5
    h = sh.anchor_runs(sp, init, r, [0], anchor="fixed", beta=beta, steps=3000, lr=1.0, log_every=3000)
    p_star = seqkl.sequence_logprobs(sp, seqkl.optimal_logits(sp, init, r, beta)).exp()
    assert abs(h["reward"][-1, 0] - float(p_star @ r)) < 1e-6
    # and the KL to the initial policy equals that of the optimum (enumeration)
    kl = float((p_star * (p_star.log() - seqkl.sequence_logprobs(sp, init))).sum())
    assert abs(h["kl_init"][-1, 0] - kl) < 1e-6


def test_ema_with_alpha_one_is_a_reset_and_none_ignores_beta():
    sp = seqkl.sequence_space(2, 3)
    init = seqkl.random_logits(sp, seed=2)
    r = (sp.sequences.sum(1) == 2).double()
    kw = dict(beta=0.3, period=7, steps=40, lr=0.5, log_every=10)
    a = sh.anchor_runs(sp, init, r, [0], anchor="reset", **kw)
    b = sh.anchor_runs(sp, init, r, [0], anchor="ema", alpha=1.0, **kw)
    assert np.allclose(a["reward"], b["reward"], atol=1e-12)
    n1 = sh.anchor_runs(sp, init, r, [0], anchor="none", **kw)
    n2 = sh.anchor_runs(sp, init, r, [0], anchor="none", **{**kw, "beta": 5.0})
    assert np.allclose(n1["reward"], n2["reward"]) and not np.allclose(a["reward"], n1["reward"])


def test_sampled_anchor_gradient_is_unbiased():
    # the mean of many one-step sampled updates approaches the exact step (5 standard errors)
    sp = seqkl.sequence_space(2, 2)
    init = seqkl.random_logits(sp, seed=3)
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    exact = sh.anchor_runs(sp, init, r, [0], anchor="fixed", beta=0.2, steps=1, lr=0.1, log_every=1)
    many = sh.anchor_runs(sp, init, r, range(400), anchor="fixed", beta=0.2, steps=1, lr=0.1,
                          log_every=1, n_samples=64)
    x = many["reward"][1]
    assert abs(x.mean() - exact["reward"][1, 0]) < 5 * x.std() / np.sqrt(x.size) + 1e-4


def test_preference_links_closed_forms():
    lz = torch.tensor([-1.0, 0.0, 0.7], dtype=torch.float64)
    z = lz.exp()
    assert torch.allclose(sh.link(lz, "chipo"), z + lz)
    assert torch.allclose(sh.link(lz, "js"), torch.log(2 * z / (1 + z)))
    assert torch.allclose(sh.link(lz, "forward_kl"), -1 / z)
    with pytest.raises(ValueError, match="name"):
        sh.link(lz, "kl")


def test_preference_loss_dpo_is_the_books_dpo_and_chipo_by_hand():
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (torch.randn(6, generator=g, dtype=torch.float64) for _ in range(4))
    assert torch.allclose(sh.preference_loss(pc, pr, rc, rr, 0.3, "dpo"), dpo_loss(pc, pr, rc, rr, 0.3)[0])
    zw, zl = (pc - rc).exp(), (pr - rr).exp()
    by_hand = torch.log1p(torch.exp(-0.3 * ((zw + (pc - rc)) - (zl + (pr - rr))))).mean()
    assert torch.allclose(sh.preference_loss(pc, pr, rc, rr, 0.3, "chipo"), by_hand)


def test_preference_data_labels_follow_bradley_terry():
    r = np.array([1.0, 0.0])
    c, l = sh.preference_data(r, [0.5, 0.5], 20000, seed=0)
    frac = np.mean(c == 0)
    p = 1 / (1 + np.exp(-1.0))
    assert abs(frac - p) < 5 * np.sqrt(p * (1 - p) / 20000)   # 5 standard errors
    with pytest.raises(ValueError, match="behaviour"):
        sh.preference_data(r, [1.0, 0.0], 10, seed=0)


def test_fit_preference_bandit_dpo_matches_the_closed_form_on_full_coverage():
    # two arms, many pairs: DPO's minimiser has beta log(z_0/z_1) = the empirical log-odds
    c = np.array([0] * 70 + [1] * 30)
    l = 1 - c
    pi = sh.fit_preference_bandit([0.5, 0.5], c, l, 0.5, "dpo", steps=2000, lr=0.05)
    assert abs(0.5 * np.log(pi[0] / pi[1]) - np.log(70 / 30)) < 1e-3


def test_f_dpo_links_match_trls_scores_up_to_a_constant():
    # TRL 1.10.0.dev0 (dpo_trainer.py): js_divergence scores logsigmoid(log z), forward_kl -exp(-log z)
    lw = torch.tensor([-0.4, 1.2, 0.3], dtype=torch.float64)
    ll = torch.tensor([0.5, -2.0, 0.3], dtype=torch.float64)
    js = torch.nn.functional.logsigmoid
    assert torch.allclose(sh.link(lw, "js") - sh.link(ll, "js"), js(lw) - js(ll))
    assert torch.allclose(sh.link(lw, "forward_kl") - sh.link(ll, "forward_kl"), -torch.exp(-lw) + torch.exp(-ll))
