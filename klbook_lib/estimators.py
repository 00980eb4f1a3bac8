"""Estimating KL(p || q) from samples x ~ p: the k1, k2 and k3 estimators.

Notation (as in the book). Samples come from the FIRST argument ``p`` of
``KL(p || q) = E_{x~p}[log p(x) - log q(x)]``. For each sample the estimators only
see two numbers, ``logp = log p(x)`` and ``logq = log q(x)``, through the
log-ratio

    lr = log q(x) - log p(x) = log r(x),    r(x) = q(x) / p(x).

Because ``E_{x~p}[r(x)] = 1``, the three estimators of Schulman's note
("Approximating KL divergence", 2020) are

    k1 = -lr                  unbiased; a single value can be negative;
    k2 = lr**2 / 2            biased; low variance; E[k2] ~ KL when p and q are close;
    k3 = (exp(lr) - 1) - lr   unbiased (E[r - 1] = 0) and never negative,
                              because exp(x) >= 1 + x for every real x.

All three work elementwise: they return one value per sample and the caller
averages (``.mean()``) over the samples it wants to pool. Inputs may be numpy
arrays (or Python floats) or torch tensors; the output has the same type.

In RL the pairs are, e.g., ``p = pi_old, q = pi_theta`` (PPO's monitored KL, samples
from the rollout policy) or ``p = pi_theta, q = pi_ref`` (the RLHF penalty, samples
from the current policy). Used as a *loss* and differentiated, the estimators do
not all give the gradient of the KL they estimate: see :func:`loss_gradients`.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .divergences import kl_from_logits

__all__ = [
    "log_ratio", "k1", "k2", "k3", "k1_from_log_ratio", "k2_from_log_ratio", "k3_from_log_ratio",
    "FROM_LOG_RATIO", "estimate_from_log_ratio", "kl_per_token", "ESTIMATORS", "k3_swapped", "exact_kl_categorical", "ema", "loss_gradients",
]


# --------------------------------------------------------------------------- helpers
def _is_torch(x: Any) -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is pinned in the book
        return False
    return isinstance(x, torch.Tensor)


def _to_common(a: Any, b: Any, name_a: str, name_b: str):
    """Return (a, b, is_torch) as two arrays/tensors of one kind and matching shape."""
    if _is_torch(a) or _is_torch(b):
        import torch

        ref = a if _is_torch(a) else b
        dtype = ref.dtype if ref.dtype.is_floating_point else torch.get_default_dtype()
        a = a.to(dtype) if _is_torch(a) else torch.as_tensor(np.asarray(a), dtype=dtype, device=ref.device)
        b = b.to(dtype) if _is_torch(b) else torch.as_tensor(np.asarray(b), dtype=dtype, device=ref.device)
        is_torch = True
    else:
        a, b = np.asarray(a), np.asarray(b)
        a = a if np.issubdtype(a.dtype, np.floating) else a.astype(float)
        b = b if np.issubdtype(b.dtype, np.floating) else b.astype(float)
        is_torch = False
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(
            f"{name_b}: shape {tuple(b.shape)} does not match {name_a} shape {tuple(a.shape)}"
        )
    return a, b, is_torch


def _check_finite_inputs(logp, logq, is_torch: bool) -> None:
    if is_torch:
        import torch

        lib_isnan, lib_isinf = torch.isnan, torch.isinf
        any_ = lambda t: bool(t.any().item())  # noqa: E731
    else:
        lib_isnan, lib_isinf = np.isnan, np.isinf
        any_ = lambda t: bool(np.any(t))  # noqa: E731
    for name, x in (("logp", logp), ("logq", logq)):
        if any_(lib_isnan(x)):
            raise ValueError(f"{name}: contains NaN")
        if any_(lib_isinf(x) & (x > 0)):
            raise ValueError(f"{name}: contains +inf; a log-probability or log-density must be finite")
    if any_(lib_isinf(logp)):
        raise ValueError("logp: contains -inf, but samples x ~ p must have p(x) > 0")


def _check_clamp(clamp: float | None) -> None:
    if clamp is None:
        return
    if not np.isfinite(clamp) or clamp < 0:
        raise ValueError(f"clamp: must be a non-negative finite number or None, got {clamp!r}")


def log_ratio(logp, logq, clamp: float | None = None):
    """The log-ratio ``lr = log q(x) - log p(x)`` for samples ``x ~ p``.

    ``clamp`` (optional, >= 0) bounds ``lr`` to ``[-clamp, clamp]``. This keeps
    ``exp(lr)`` finite in float32/float16, but it changes the estimator: a clamped
    estimator is biased (it under-counts the samples with a large ``|lr|``) and, used
    as a loss, has zero gradient wherever the clamp is active.
    """
    _check_clamp(clamp)
    logp, logq, is_torch = _to_common(logp, logq, "logp", "logq")
    _check_finite_inputs(logp, logq, is_torch)
    lr = logq - logp
    if clamp is not None:
        lr = lr.clamp(-clamp, clamp) if is_torch else np.clip(lr, -clamp, clamp)
    return lr


# --------------------------------------------------------------------------- the formulas
# The only place in the library where k1, k2 and k3 are written. These take the log-ratio
# lr = log q(x) - log p(x) (x ~ p) and check nothing: they are the fast path that training
# loops call on tensors they made themselves. k1/k2/k3 below check their inputs first.
def k1_from_log_ratio(lr):
    """k1 = -lr per sample, from ``lr = log q(x) - log p(x)``, ``x ~ p`` (no input checks)."""
    return -lr


def k2_from_log_ratio(lr):
    """k2 = lr**2 / 2 per sample, from ``lr = log q(x) - log p(x)``, ``x ~ p`` (no input checks)."""
    return 0.5 * lr * lr


def k3_from_log_ratio(lr):
    """k3 = (r - 1) - log r = expm1(lr) - lr per sample, ``lr = log r = log q(x) - log p(x)``.

    No input checks (the fast path for training loops). ``expm1`` is what makes it accurate:
    near ``lr = 0`` the value is about ``lr**2 / 2``, and ``(exp(lr) - 1) - lr`` (or
    ``(ratio - 1) - log_ratio`` with ``ratio = exp(lr)``) loses it to rounding: ``exp(lr)``
    carries an absolute error of about one unit in the last place of 1 (1e-16 in float64,
    6e-8 in float32), which swamps ``lr**2 / 2`` once ``|lr|`` is below about 1e-8 (float64)
    or 3e-4 (float32), and can even make k3 negative. ``expm1(lr)`` is correctly rounded
    relative to ``lr``, so the absolute error of ``expm1(lr) - lr`` stays a few units of
    ``eps * |lr|`` and the value is never negative. numpy or torch in, the same out;
    differentiable (``d k3 / d lr = expm1(lr)``).
    """
    if _is_torch(lr):
        import torch

        return torch.expm1(lr) - lr
    return np.expm1(lr) - lr


FROM_LOG_RATIO: dict[str, Callable] = {
    "k1": k1_from_log_ratio, "k2": k2_from_log_ratio, "k3": k3_from_log_ratio,
}


def estimate_from_log_ratio(lr, estimator: str):
    """The estimator named ``estimator`` (``"k1"``, ``"k2"`` or ``"k3"``) of each log-ratio ``lr``.

    ``lr = log q(x) - log p(x)`` with ``x ~ p``; estimates ``KL(p || q)`` per sample. No checks
    of ``lr`` (see :func:`k3_from_log_ratio`); an unknown name is a ``ValueError``.
    """
    if estimator not in FROM_LOG_RATIO:
        raise ValueError(f"estimator: must be one of {tuple(FROM_LOG_RATIO)}, got {estimator!r}")
    return FROM_LOG_RATIO[estimator](lr)


def kl_per_token(logprobs, ref_logprobs, estimator: str = "k1"):
    """Per-token k1, k2 or k3 of ``KL(pi_theta || pi_ref)`` from the log-probabilities of
    tokens sampled from ``pi_theta`` (torch tensors of one shape, e.g. ``[B, T]``).

    With ``l = logprobs - ref_logprobs`` (so ``pi_ref / pi_theta = exp(-l)``): ``k1 = l``
    (unbiased, can be negative for one token), ``k2 = l**2 / 2`` (biased, >= 0),
    ``k3 = exp(-l) - 1 + l`` (unbiased, >= 0). Elementwise, no masking, differentiable in
    ``logprobs``. The library's one per-token wrapper: the RLHF rewards
    (:mod:`klbook_lib.rlhf.rewards`, which re-exports it), the enumerable sequence model
    (:mod:`klbook_lib.seqkl`) and :mod:`klbook_lib.offpolicy` call it.
    """
    if not (_is_torch(logprobs) and _is_torch(ref_logprobs)):
        raise ValueError("logprobs, ref_logprobs: expected torch tensors")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"ref_logprobs: shape {tuple(ref_logprobs.shape)} does not match logprobs "
                         f"shape {tuple(logprobs.shape)}")
    # the estimators' log-ratio is log(pi_ref / pi_theta) = -l (tokens sampled from pi_theta)
    return estimate_from_log_ratio(ref_logprobs - logprobs, estimator)


def k1(logp, logq, clamp: float | None = None):
    """k1 = -lr = log p(x) - log q(x): the plain Monte Carlo estimate of KL(p || q).

    Unbiased: ``E_{x~p}[k1] = KL(p || q)``. A single value, and the mean of a small
    batch, can be negative although KL is never negative. With ``clamp`` the
    log-ratio is first bounded to ``[-clamp, clamp]`` (biased).
    """
    return k1_from_log_ratio(log_ratio(logp, logq, clamp))


def k2(logp, logq, clamp: float | None = None):
    """k2 = lr**2 / 2: a biased, low-variance estimate of KL(p || q).

    ``E_{x~p}[k2] = E[lr**2] / 2``. This equals KL(p || q) up to third order in the
    log-ratio, so it is close to KL when p and q are close and can be far off (in
    either direction) when they are not. Every value is >= 0.
    """
    return k2_from_log_ratio(log_ratio(logp, logq, clamp))


def k3(logp, logq, clamp: float | None = None):
    """k3 = (r - 1) - log r with r = q(x)/p(x): unbiased and never negative.

    Unbiased because ``E_{x~p}[r - 1] = 0``, so ``E[k3] = E[-log r] = KL(p || q)``.
    Non-negative because ``exp(x) >= 1 + x`` for all real x. Its variance is small
    when p and q are close; when q puts much more mass than p somewhere, ``r`` is
    heavy-tailed and the variance can be large or even infinite. ``exp(lr)``
    overflows for large ``lr`` (float32 above about 88, float16 above about 11):
    ``clamp`` prevents that at the price of a bias. Computed by :func:`k3_from_log_ratio`.
    """
    return k3_from_log_ratio(log_ratio(logp, logq, clamp))


ESTIMATORS: dict[str, Callable] = {"k1": k1, "k2": k2, "k3": k3}


def k3_swapped(logp, logq, clamp: float | None = None):
    """r log r - (r - 1) with r = q(x)/p(x): an estimate of the OTHER direction, KL(q || p).

    The samples still come from ``p`` (as for k1, k2, k3). Since ``E_{x~p}[r f(x)] =
    E_{x~q}[f(x)]``, ``E_p[r log r] = E_q[log q - log p] = KL(q || p)``; subtracting the
    zero-mean control variate ``r - 1`` keeps it unbiased and makes every value
    non-negative (``t log t >= t - 1`` for ``t > 0``). Schulman's note gives it as the
    estimator of the second direction. Its variance is finite only where ``E_p[r^2 log^2 r]``
    is, which fails sooner than for k3: it is heavy-tailed whenever q has much more mass
    than p somewhere.
    """
    lr = log_ratio(logp, logq, clamp)
    if _is_torch(lr):
        import torch

        r = torch.exp(lr)
        return r * lr - torch.expm1(lr)
    r = np.exp(lr)
    return r * lr - np.expm1(lr)


# --------------------------------------------------------------------------- exact KL
def exact_kl_categorical(logits_p, logits_q):
    """Exact KL(p || q) between categorical distributions given by logits.

    ``p = softmax(logits_p)`` and ``q = softmax(logits_q)`` along the last axis; the
    sum runs over the last axis (all categories), so the result has the batch shape.
    Logits of ``-inf`` mean probability zero: terms with ``p = 0`` contribute 0, and
    a category with ``p > 0`` but ``q = 0`` makes the KL ``+inf``.
    numpy in, numpy out; torch in, torch out (differentiable). The reference that the
    estimators are compared with; it is :func:`klbook_lib.divergences.kl_from_logits`
    over the last axis.
    """
    a, b, _ = _to_common(logits_p, logits_q, "logits_p", "logits_q")
    if a.ndim == 0:
        raise ValueError("logits_p: needs at least one axis of categories")
    return kl_from_logits(a, b, dim=-1)


# --------------------------------------------------------------------------- smoothing
def ema(values, alpha: float) -> np.ndarray:
    """Exponential moving average ``s_t = (1 - alpha) s_{t-1} + alpha v_t``, ``s_0 = v_0``.

    ``alpha`` in (0, 1] is the weight of the new value (the decay is ``1 - alpha``); 1 means
    no smoothing. The weights ``alpha (1 - alpha)^k`` of past values fall by a factor ``e``
    over about ``1/alpha`` values, its time constant: the book's convention is that an EMA
    averages over roughly the last ``1/alpha`` values (alpha = 0.1, decay 0.9: about 10),
    with a lag of the same order. Returns a float array.
    """
    if not (isinstance(alpha, (int, float, np.floating)) and 0 < alpha <= 1):
        raise ValueError(f"alpha: must be in (0, 1], got {alpha!r}")
    v = np.asarray(values.detach().cpu() if _is_torch(values) else values, dtype=float)
    if v.ndim != 1:
        raise ValueError(f"values: must be one-dimensional, got shape {v.shape}")
    if np.any(np.isnan(v)):
        raise ValueError("values: contains NaN")
    out = np.empty_like(v)
    if v.size == 0:
        return out
    s = v[0]
    for t, x in enumerate(v):
        s = x if t == 0 else (1.0 - alpha) * s + alpha * x
        out[t] = s
    return out


# --------------------------------------------------------------------------- gradients
def loss_gradients(logits_theta, logits_ref, n_samples: int, seed: int = 0) -> dict:
    """Monte Carlo gradients of the k-estimators used as a LOSS, on-policy.

    The policy is ``pi_theta = softmax(logits_theta)`` (one state, K actions), the
    reference ``pi_ref = softmax(logits_ref)``. We draw ``n_samples`` actions
    ``a ~ pi_theta`` and differentiate, with autograd, the sample mean of each loss
    with respect to ``logits_theta``. Every loss estimates KL(pi_theta || pi_ref)
    (``logp = log pi_theta(a)``, ``logq = log pi_ref(a)``, ``r = pi_ref / pi_theta``):

    ``"k1"``, ``"k2"``, ``"k3"``
        the estimators themselves, differentiated through ``log pi_theta(a)`` only
        (the sampling is not differentiated: the usual "add it to the loss").
    ``"k1_score"``
        score-function / REINFORCE form: ``k1.detach() * log pi_theta(a)`` (this is
        what putting k1 into the reward does).
    ``"k3_is"``
        k3 multiplied by the importance weight ``pi_theta(a) / pi_theta(a).detach()``
        (value 1, gradient ``grad log pi_theta(a)``).

    Also returned, from the closed forms through ``torch.distributions`` and
    autograd: ``"exact_reverse"`` = grad KL(pi_theta || pi_ref) and
    ``"exact_forward"`` = grad KL(pi_ref || pi_theta).

    Returns ``{name: {"mean": tensor(K), "se": tensor(K)}}`` for the Monte Carlo
    entries (``se`` = standard error of the mean gradient, from the per-sample
    gradients), ``{name: tensor(K)}`` for the exact ones, ``"n_samples"``, and
    ``"per_action"``: ``{name: tensor(K, K)}`` whose row ``a`` is the gradient one
    sample contributes when the sampled action is ``a``. Float64 throughout.
    """
    import torch

    if not isinstance(n_samples, (int, np.integer)) or n_samples < 2:
        raise ValueError(f"n_samples: must be an integer >= 2, got {n_samples!r}")
    zt = torch.as_tensor(logits_theta, dtype=torch.float64).detach()
    zr = torch.as_tensor(logits_ref, dtype=torch.float64).detach()
    if zt.ndim != 1 or zt.shape != zr.shape:
        raise ValueError(
            f"logits_ref: shape {tuple(zr.shape)} must equal logits_theta shape {tuple(zt.shape)}, both 1-D"
        )
    if not (torch.isfinite(zt).all() and torch.isfinite(zr).all()):
        raise ValueError("logits_theta: logits must be finite (so must logits_ref)")
    K = zt.shape[0]
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        actions = torch.multinomial(torch.softmax(zt, -1), int(n_samples), replacement=True, generator=gen)
    logq_all = torch.log_softmax(zr, -1)

    def action_losses(z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each loss as a K-vector: its value if action a were the sample."""
        logp_all = torch.log_softmax(z, -1)
        lr = logq_all - logp_all
        k3v = k3_from_log_ratio(lr)
        return {
            "k1": k1_from_log_ratio(lr),
            "k2": k2_from_log_ratio(lr),
            "k3": k3v,
            "k1_score": (-lr).detach() * logp_all,
            "k3_is": torch.exp(logp_all - logp_all.detach()) * k3v,
        }

    out: dict = {"n_samples": int(n_samples)}
    per_action: dict[str, torch.Tensor] = {}
    for name in action_losses(zt):
        # Mean gradient: autograd of the sample-mean loss (what a training loop does).
        z = zt.clone().requires_grad_(True)
        loss = action_losses(z)[name][actions].mean()
        (g,) = torch.autograd.grad(loss, z)
        # Standard error: a per-sample gradient depends only on the sampled action,
        # so the K per-action gradients (one Jacobian) give every sample's gradient.
        jac = torch.autograd.functional.jacobian(lambda z_, _n=name: action_losses(z_)[_n], zt)
        g_samples = jac[actions]  # (n_samples, K)
        se = g_samples.std(0, unbiased=True) / float(n_samples) ** 0.5
        out[name] = {"mean": g, "se": se}
        per_action[name] = jac

    from torch.distributions import Categorical, kl_divergence

    z = zt.clone().requires_grad_(True)
    (g_rev,) = torch.autograd.grad(kl_divergence(Categorical(logits=z), Categorical(logits=zr)), z)
    z = zt.clone().requires_grad_(True)
    (g_fwd,) = torch.autograd.grad(kl_divergence(Categorical(logits=zr), Categorical(logits=z)), z)
    out["exact_reverse"] = g_rev
    out["exact_forward"] = g_fwd
    out["per_action"] = per_action
    return out
