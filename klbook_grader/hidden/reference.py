"""Reference solutions of the graded exercises (numpy; torch only for ``dpo_loss``).

These are written independently of the rest of ``klbook_lib`` so that the exercises do
not depend on the chapters' code; ``tests/grader/test_grading.py`` checks each of them against
scipy, torch.distributions, closed forms or brute force.
"""
from __future__ import annotations

import numpy as np
from scipy import integrate, optimize, special, stats


# ---------- ex01: definition and numerical stability ----------
def kl_categorical(p, q) -> float:
    """KL(p || q) in nats for two probability vectors; 0 log 0 = 0, +inf if q=0 < p."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    mask = p > 0
    if np.any(q[mask] == 0):
        return float("inf")
    return float(np.sum(p[mask] * (np.log(p[mask]) - np.log(q[mask]))))


def kl_from_logits(logits_p, logits_q) -> np.ndarray:
    """KL(softmax(logits_p) || softmax(logits_q)) along the last axis, stable for huge logits."""
    lp = special.log_softmax(np.asarray(logits_p, float), axis=-1)
    lq = special.log_softmax(np.asarray(logits_q, float), axis=-1)
    return np.sum(np.exp(lp) * (lp - lq), axis=-1)


def gaussian_kl(mu1: float, s1: float, mu2: float, s2: float) -> float:
    """KL(N(mu1, s1^2) || N(mu2, s2^2))."""
    return float(np.log(s2 / s1) + (s1**2 + (mu1 - mu2) ** 2) / (2 * s2**2) - 0.5)


# ---------- ex02: forward vs reverse ----------
def forward_kl_gaussian_fit(weights, means, stds) -> np.ndarray:
    """argmin over N(mu, sigma^2) of KL(mixture || N): moment matching, returns [mu, sigma]."""
    w, m, s = (np.asarray(a, float) for a in (weights, means, stds))
    mu = np.sum(w * m)
    var = np.sum(w * (s**2 + m**2)) - mu**2
    return np.array([mu, np.sqrt(var)])


def mixture_logpdf(x, weights, means, stds):
    comps = np.stack([np.log(w) + stats.norm.logpdf(x, m, s) for w, m, s in zip(weights, means, stds)])
    return special.logsumexp(comps, axis=0)


def reverse_kl_gauss_to_mixture(mu, sigma, weights, means, stds) -> float:
    """KL(N(mu, sigma^2) || mixture) by adaptive quadrature over mu +- 12 sigma."""
    def f(x):
        lq = stats.norm.logpdf(x, mu, sigma)
        return np.exp(lq) * (lq - mixture_logpdf(x, weights, means, stds))
    val, _ = integrate.quad(f, mu - 12 * sigma, mu + 12 * sigma, limit=200, epsabs=1e-10)
    return float(val)


# ---------- ex03: TRPO / PPO ----------
def adaptive_beta_update(beta: float, kl: float, kl_target: float) -> float:
    """PPO paper's adaptive KL coefficient (Schulman et al. 2017, section 4)."""
    if kl < kl_target / 1.5:
        return beta / 2
    if kl > kl_target * 1.5:
        return beta * 2
    return beta


def proportional_beta_update(beta: float, kl: float, kl_target: float, n_steps: int,
                             horizon: int) -> float:
    """Ziegler et al. (2019) proportional controller."""
    err = np.clip(kl / kl_target - 1, -0.2, 0.2)
    return float(beta * (1 + err * n_steps / horizon))


def ppo_clip_objective(ratio, advantages, eps: float) -> np.ndarray:
    """Per-sample min(r A, clip(r, 1-eps, 1+eps) A)."""
    r, a = np.asarray(ratio, float), np.asarray(advantages, float)
    return np.minimum(r * a, np.clip(r, 1 - eps, 1 + eps) * a)


def kl_hessian_logits(logits) -> np.ndarray:
    """Hessian at theta = theta0 of theta -> KL(softmax(theta0) || softmax(theta)).

    It is the Fisher information matrix of the categorical distribution in its logits,
    diag(p) - p p^T (singular: adding a constant to every logit changes nothing).
    """
    p = np.exp(special.log_softmax(np.asarray(logits, float)))
    return np.diag(p) - np.outer(p, p)


def kl_penalty_loss(logits_new, logits_old, actions, advantages, beta: float, eps: float) -> float:
    """-mean(min(r A, clip(r, 1-eps, 1+eps) A)) + beta * mean_s KL(pi_old(.|s) || pi_theta(.|s))."""
    lpn = special.log_softmax(np.asarray(logits_new, float), axis=-1)
    lpo = special.log_softmax(np.asarray(logits_old, float), axis=-1)
    a = np.asarray(actions).astype(int)
    rows = np.arange(len(a))
    ratio = np.exp(lpn[rows, a] - lpo[rows, a])
    adv = np.asarray(advantages, float)
    surrogate = np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv)
    kl = np.sum(np.exp(lpo) * (lpo - lpn), axis=-1)
    return float(-surrogate.mean() + beta * kl.mean())


# ---------- ex04: estimators (samples x ~ p, log_ratio = log q(x) - log p(x)) ----------
def k3(log_ratio) -> np.ndarray:
    lr = np.asarray(log_ratio, float)
    return np.expm1(lr) - lr


def kl_estimates(log_ratio) -> np.ndarray:
    """Sample means of [k1, k2, k3]."""
    lr = np.asarray(log_ratio, float)
    return np.array([np.mean(-lr), np.mean(0.5 * lr**2), np.mean(np.expm1(lr) - lr)])


def k2_bias_gaussian(mu_q: float) -> float:
    """E_p[k2] - KL(p||q) for p = N(0,1), q = N(mu_q, 1): log q/p = mu_q x - mu_q^2/2."""
    # E[(mu x - mu^2/2)^2]/2 = (mu^2 + mu^4/4)/2 and KL = mu^2/2.
    return (mu_q**2 + mu_q**4 / 4) / 2 - mu_q**2 / 2


def kl_gradients(logits, ref_logits) -> np.ndarray:
    """Expected gradients, with respect to the logits of p = softmax(logits), of the six ways of
    putting a KL estimate into a one-token RL update (samples a ~ p, q = softmax(ref_logits),
    l = log p(a) - log q(a), rho = q(a)/p(a)).

    Rows: k1, k2, k3 in the reward (a detached cost c(a) times grad log p(a):
    E_p[c(a) (e_a - p)] = p * c - p (p . c)), then k1, k2, k3 in the loss (E_p[grad k(a)]:
    0, p * l - p (p . l), and p - q).
    """
    lp = special.log_softmax(np.asarray(logits, float))
    lq = special.log_softmax(np.asarray(ref_logits, float))
    p, q = np.exp(lp), np.exp(lq)
    l = lp - lq
    # p * k for each estimate; p * k3 = q - p + p l, never p * (rho - 1 + l): rho overflows where p is tiny
    weighted = [p * l, p * l**2 / 2, q - p + p * l]
    rows = [w - p * w.sum() for w in weighted]
    rows += [np.zeros_like(p), p * l - p * np.sum(p * l), p - q]
    return np.array(rows)


# ---------- ex05: monitoring ----------
def kl_diagnostics(logp_new, logp_old, clip_eps: float) -> np.ndarray:
    """[mean k1, mean k3, clip fraction] for samples drawn from pi_old (CleanRL's logging)."""
    lr = np.asarray(logp_new, float) - np.asarray(logp_old, float)
    ratio = np.exp(lr)
    return np.array([np.mean(-lr), np.mean((ratio - 1) - lr), np.mean(np.abs(ratio - 1) > clip_eps)])


def epochs_before_stop(approx_kls, target_kl: float) -> int:
    """Epochs run when training stops right after the first epoch with KL > 1.5 target."""
    for i, kl in enumerate(approx_kls):
        if kl > 1.5 * target_kl:
            return i + 1
    return len(approx_kls)


# ---------- ex06, ex09: KL-regularised reward and its optimal policy ----------
def kl_shaped_reward(score, logp_policy, logp_ref, beta: float) -> np.ndarray:
    """score - beta * sum_t (log pi(y_t) - log pi_ref(y_t)), one value per sequence."""
    d = np.asarray(logp_policy, float) - np.asarray(logp_ref, float)
    return np.asarray(score, float) - beta * d.sum(axis=-1)


def optimal_policy(pi_ref, rewards, beta: float) -> np.ndarray:
    """pi*(a) proportional to pi_ref(a) exp(r(a)/beta), computed in log space."""
    logits = np.log(np.asarray(pi_ref, float)) + np.asarray(rewards, float) / beta
    return np.exp(logits - special.logsumexp(logits))


def kl_reward_frontier(pi_ref, rewards, betas) -> np.ndarray:
    rows = []
    for b in betas:
        pi = optimal_policy(pi_ref, rewards, b)
        rows.append([float(np.dot(pi, rewards)), kl_categorical(pi, pi_ref)])
    return np.array(rows)


def beta_for_kl(pi_ref, rewards, kl_target: float) -> float:
    """The beta whose optimal policy has KL(pi*||pi_ref) = kl_target (KL falls as beta grows)."""
    f = lambda lb: kl_categorical(optimal_policy(pi_ref, rewards, np.exp(lb)), pi_ref) - kl_target  # noqa: E731
    return float(np.exp(optimize.brentq(f, np.log(1e-4), np.log(1e4), xtol=1e-14, rtol=1e-14)))


# ---------- ex07: per-token rewards ----------
def per_token_rewards(logprobs, ref_logprobs, scores, mask, beta: float) -> np.ndarray:
    """-beta * log-ratio per real token, each score added on its row's last real token.

    The argument order of ``klbook_lib.rlhf.rewards.per_token_rewards``. Pads (mask 0) get 0
    whatever the log-probabilities hold there (-inf, NaN); a row without real tokens is all 0.
    """
    m = np.asarray(mask, float) > 0
    with np.errstate(invalid="ignore"):
        log_ratio = np.where(m, np.asarray(logprobs, float) - np.asarray(ref_logprobs, float), 0.0)
    rewards = -beta * log_ratio
    scores = np.asarray(scores, float)
    for i in range(m.shape[0]):
        idx = np.nonzero(m[i])[0]
        if idx.size:
            rewards[i, idx[-1]] += scores[i]
    return rewards + 0.0


def masked_gae(rewards, values, mask, gamma: float, lam: float) -> np.ndarray:
    """GAE over each row's real tokens (mask 1, in order); the value after the last one is 0.

    Pads get advantage 0 and their rewards and values (junk) are never read.
    """
    r, v = np.asarray(rewards, float), np.asarray(values, float)
    m = np.asarray(mask, float) > 0
    adv = np.zeros(r.shape)
    for i in range(r.shape[0]):
        idx = np.nonzero(m[i])[0]
        adv[i, idx] = gae(r[i, idx], v[i, idx], gamma, lam)
    return adv


def gae(rewards, values, gamma: float, lam: float) -> np.ndarray:
    """Generalised advantage estimates for one finished episode (value after the end is 0)."""
    r, v = np.asarray(rewards, float), np.asarray(values, float)
    adv = np.zeros_like(r)
    last = 0.0
    for t in reversed(range(len(r))):
        nxt = v[t + 1] if t + 1 < len(r) else 0.0
        delta = r[t] + gamma * nxt - v[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv


# ---------- ex08: ELBO and DPO ----------
def elbo_discrete(log_joint, q) -> float:
    """ELBO = sum_z q(z) (log p(x, z) - log q(z)), with 0 log 0 = 0."""
    lj, q = np.asarray(log_joint, float), np.asarray(q, float)
    m = q > 0
    return float(np.sum(q[m] * (lj[m] - np.log(q[m]))))


def dpo_loss(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta: float) -> np.ndarray:
    """Per-pair -log sigmoid(beta * ((lc - rc) - (lr - rr))), computed as softplus(-margin)."""
    margin = beta * ((np.asarray(logp_chosen, float) - np.asarray(ref_chosen, float))
                     - (np.asarray(logp_rejected, float) - np.asarray(ref_rejected, float)))
    return np.logaddexp(0.0, -margin)


def dpo_logit_gradient(logits, ref_logits, chosen, rejected, beta: float) -> np.ndarray:
    """Gradient, with respect to the logits of a categorical policy over responses, of the mean
    DPO loss of the pairs (chosen[i], rejected[i]): -(beta / B) sum_i sigmoid(-m_i) (e_c - e_r),
    with m_i the pair's margin (the softmax's normaliser cancels in log p_c - log p_r)."""
    lp = special.log_softmax(np.asarray(logits, float))
    lq = special.log_softmax(np.asarray(ref_logits, float))
    c, r = np.asarray(chosen, int), np.asarray(rejected, int)
    margin = beta * ((lp[c] - lq[c]) - (lp[r] - lq[r]))
    weight = special.expit(-margin)                       # sigmoid(-m), stable
    grad = np.zeros_like(lp)
    np.add.at(grad, c, -beta * weight / len(c))
    np.add.at(grad, r, beta * weight / len(c))
    return grad


# ---------- ex05: the parts of the broken trainer, fixed ----------
def trainer_part(part: str, *args):
    """The reference version of one part of exercise 5's trainer (torch in, numpy out)."""
    import torch

    if part == "token_logprobs":
        logits, tokens, rows, mask, temperature = args
        logp = torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64) / temperature, -1)
        lp = logp[torch.as_tensor(rows).long(), torch.as_tensor(tokens).long()]
        return torch.where(torch.as_tensor(mask).bool(), lp, torch.zeros_like(lp)).numpy()
    if part == "sequence_rewards":
        scores, logp, ref_logp, mask, beta = (np.asarray(a, float) if not np.isscalar(a) else a for a in args)
        return scores - beta * np.where(mask > 0, logp - ref_logp, 0.0).sum(axis=1)
    if part == "place_on_last_token":
        seq, mask = np.asarray(args[0], float), np.asarray(args[1], float) > 0
        out = np.zeros(mask.shape)
        for i in range(mask.shape[0]):
            idx = np.nonzero(mask[i])[0]
            if idx.size:
                out[i, idx[-1]] = seq[i]
        return out
    if part == "ppo_loss":
        new, old, adv, mask, clip = args
        new, old, adv = (np.asarray(a, float) for a in (new, old, adv))
        m = np.asarray(mask, float) > 0
        ratio = np.exp(np.where(m, new - old, 0.0))
        surr = np.minimum(ratio * adv, np.clip(ratio, 1 - clip, 1 + clip) * adv)
        return float(-np.where(m, surr, 0.0).sum() / m.sum())
    raise ValueError(f"part: unknown trainer part {part!r}")


# ---------- ex10: other divergences ----------
def js_divergence(p, q) -> float:
    p, q = np.asarray(p, float), np.asarray(q, float)
    m = (p + q) / 2
    return 0.5 * kl_categorical(p, m) + 0.5 * kl_categorical(q, m)


def tv_distance(p, q) -> float:
    return float(0.5 * np.sum(np.abs(np.asarray(p, float) - np.asarray(q, float))))


def wasserstein1(xs, p, q) -> float:
    """W1 between two distributions on the sorted points xs: integral of |F_p - F_q|."""
    xs = np.asarray(xs, float)
    cdf_gap = np.cumsum(np.asarray(p, float) - np.asarray(q, float))[:-1]
    return float(np.sum(np.abs(cdf_gap) * np.diff(xs)))


# ---------- ex11: review ----------
def kl_from_logprobs(logp, logq) -> np.ndarray:
    """KL(p || q) along the last axis from log-probabilities; entries with log p = -inf add 0."""
    lp, lq = np.asarray(logp, float), np.asarray(logq, float)
    with np.errstate(invalid="ignore"):
        terms = np.where(np.isneginf(lp), 0.0, np.exp(lp) * (lp - lq))
    return terms.sum(axis=-1)


# ---------- derive-then-verify: the grader's expected values come from autograd ----------
# (the closed forms above are checked against these in tests/test_exercise_tasks.py)
def kl_hessian_autograd(logits) -> np.ndarray:
    """autograd's Hessian of z -> KL(softmax(logits) || softmax(z)) at z = logits."""
    import torch

    z0 = torch.tensor(np.asarray(logits, float), dtype=torch.float64)
    lp0 = torch.log_softmax(z0, -1)

    def kl(z):
        return (lp0.exp() * (lp0 - torch.log_softmax(z, -1))).sum()

    return torch.autograd.functional.hessian(kl, z0).numpy()


def kl_gradients_autograd(logits, ref_logits) -> np.ndarray:
    """The six expected gradients of :func:`kl_gradients`, by autograd on the exact expectation.

    Each row is the gradient of a surrogate over all V tokens: in the reward,
    sum_a sg(p_a k_a) log p_a; in the loss, sum_a sg(p_a) k_a. Products with p_a are formed so
    that they stay finite for tiny p_a (p k3 = q - p + p l; p rho = exp(log q + log sg(p) - log p)).
    tests/grader/test_tasks.py checks it against :func:`klbook_lib.seqkl.expected_gradient`.
    """
    import torch

    z = torch.tensor(np.asarray(logits, float), dtype=torch.float64, requires_grad=True)
    lq = torch.log_softmax(torch.tensor(np.asarray(ref_logits, float), dtype=torch.float64), -1)
    lp = torch.log_softmax(z, -1)
    lp0 = lp.detach()
    p0, q = lp0.exp(), lq.exp()
    l, l0 = lp - lq, lp0 - lq
    surrogates = [(p0 * l0 * lp).sum(), (p0 * l0**2 / 2 * lp).sum(), ((q - p0 + p0 * l0) * lp).sum(),
                  (p0 * l).sum(), (p0 * l**2 / 2).sum(), (torch.exp(lq + lp0 - lp) - p0 + p0 * l).sum()]
    return np.array([torch.autograd.grad(s, z, retain_graph=True)[0].numpy() for s in surrogates])


def dpo_logit_gradient_autograd(logits, ref_logits, chosen, rejected, beta: float) -> np.ndarray:
    """autograd's gradient of the mean DPO loss of the pairs with respect to the policy's logits."""
    import torch

    z = torch.tensor(np.asarray(logits, float), dtype=torch.float64, requires_grad=True)
    lq = torch.log_softmax(torch.tensor(np.asarray(ref_logits, float), dtype=torch.float64), -1)
    lp = torch.log_softmax(z, -1)
    c, r = torch.as_tensor(np.asarray(chosen, int)), torch.as_tensor(np.asarray(rejected, int))
    margin = beta * ((lp[c] - lq[c]) - (lp[r] - lq[r]))
    loss = torch.nn.functional.softplus(-margin).mean()
    return torch.autograd.grad(loss, z)[0].numpy()
