"""KL divergence and its relatives between explicitly known distributions.

Conventions (see ``notation.md``):

* ``kl(p, q)`` is :math:`D_{\\mathrm{KL}}(P\\,\\|\\,Q) = \\sum_x P(x) \\log \\frac{P(x)}{Q(x)}`, an
  expectation under the FIRST argument. If ``q`` is the model and ``p`` the target it is the
  *forward* KL; if ``p`` is the model and ``q`` the target it is the *reverse* KL. In PPO
  ``kl(pi_old, pi_theta)``; in RLHF ``kl(pi_theta, pi_ref)``.
* Logarithms are natural, so every divergence is in nats.
* Discrete distributions are probability vectors along ``axis`` (default: the last axis);
  leading axes are a batch.

Backends: numpy arrays in give numpy arrays out; torch tensors in give torch tensors out
(differentiable where the formula is). Mixing a tensor with an array or a Python number
converts the non-tensor to a tensor of the tensor's dtype and device.

Validation: every public function raises ``ValueError`` naming the offending argument for

* NaN anywhere,
* negative probabilities,
* a probability vector whose sum differs from 1 by more than :func:`sum_tolerance` of its
  dtype, ``max(1e-6, sqrt(eps))``: ``1e-6`` for float64, about ``3.5e-4`` for float32
  (a float32 softmax over a large vocabulary can be off by more than ``1e-6``),
* mismatched shapes of ``p`` and ``q`` (no silent broadcasting between the two arguments),
* a non-positive standard deviation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Union

import numpy as np
from scipy import special

try:  # torch is a dependency of the book, but keep numpy-only use possible
    import torch
except ImportError:  # pragma: no cover
    torch = None

ArrayLike = Any  # numpy array, torch tensor, or nested Python sequence

__all__ = [
    "sum_tolerance", "kl", "kl_from_logits", "kl_from_log_probs", "gaussian_kl", "js", "symmetric_kl",
    "total_variation", "f_divergence", "FGenerator", "F_KL", "F_REVERSE_KL", "F_JS", "F_TV",
    "F_CHI2", "F_GENERATORS", "wasserstein_1d",
]


# --------------------------------------------------------------------------- helpers
def _is_torch(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _to_backend(*xs: Any) -> tuple[bool, list]:
    """Convert all inputs to one backend: torch if any input is a tensor, else numpy float."""
    tensors = [x for x in xs if _is_torch(x)]
    if tensors:
        ref = tensors[0]
        dtype = ref.dtype if ref.is_floating_point() else torch.get_default_dtype()
        out = []
        for x in xs:
            if _is_torch(x):
                out.append(x if x.is_floating_point() else x.to(dtype))
            else:
                out.append(torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=dtype,
                                           device=ref.device))
        return True, out
    out = []
    for x in xs:
        a = np.asarray(x)
        if not np.issubdtype(a.dtype, np.floating):
            a = a.astype(np.float64)
        out.append(a)
    return False, out


def sum_tolerance(dtype: Any) -> float:
    """Absolute tolerance on ``|sum(p) - 1|`` for a probability vector of ``dtype``.

    ``max(1e-6, sqrt(eps))``: ``1e-6`` for float64, ``~3.5e-4`` for float32,
    ``~0.03`` for float16 and ``~0.09`` for bfloat16.
    """
    if torch is not None and isinstance(dtype, torch.dtype):
        eps = torch.finfo(dtype).eps
    else:
        eps = float(np.finfo(np.dtype(dtype)).eps)
    return max(1e-6, math.sqrt(eps))


def _check_no_nan(name: str, x: Any, use_torch: bool) -> None:
    if use_torch:
        x = x.detach()
    bad = bool(torch.isnan(x).any()) if use_torch else bool(np.isnan(x).any())
    if bad:
        raise ValueError(f"{name}: contains NaN")


def _check_same_shape(name_a: str, a: Any, name_b: str, b: Any) -> None:
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(
            f"{name_b}: shape {tuple(b.shape)} does not match {name_a} shape {tuple(a.shape)} "
            "(no broadcasting between the two distributions)")


def _check_axis(name: str, x: Any, axis: int) -> None:
    if x.ndim == 0:
        raise ValueError(f"{name}: must have at least one dimension, got a scalar")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis: {axis} is out of range for {name} with {x.ndim} dimensions")


def _check_prob(name: str, x: Any, axis: int, use_torch: bool) -> None:
    _check_no_nan(name, x, use_torch)
    _check_axis(name, x, axis)
    if use_torch:
        x = x.detach()
        xmin = float(x.min()) if x.numel() else 0.0
        if xmin < 0:
            raise ValueError(f"{name}: probabilities must be non-negative, found {xmin:g}")
        if bool(torch.isinf(x).any()):
            raise ValueError(f"{name}: probabilities must be finite, found inf")
        dev = (x.sum(dim=axis) - 1).abs()
        worst = float(dev.max()) if dev.numel() else 0.0
    else:
        xmin = float(x.min()) if x.size else 0.0
        if xmin < 0:
            raise ValueError(f"{name}: probabilities must be non-negative, found {xmin:g}")
        if bool(np.isinf(x).any()):
            raise ValueError(f"{name}: probabilities must be finite, found inf")
        dev = np.abs(x.sum(axis=axis) - 1)
        worst = float(dev.max()) if dev.size else 0.0
    tol = sum_tolerance(x.dtype)
    if worst > tol:
        raise ValueError(
            f"{name}: probabilities must sum to 1 along axis {axis} (tolerance {tol:.1e}), "
            f"found a sum off by {worst:.3g}")


def _prep_pair(p: ArrayLike, q: ArrayLike, axis: int) -> tuple[bool, Any, Any]:
    use_torch, (p, q) = _to_backend(p, q)
    _check_same_shape("p", p, "q", q)
    _check_prob("p", p, axis, use_torch)
    _check_prob("q", q, axis, use_torch)
    return use_torch, p, q


# --------------------------------------------------------------------------- KL
def _kl_terms_torch(p: Any, q: Any) -> Any:
    """Elementwise p*log(p/q) with 0*log(0/q)=0 and +inf where q=0<p; NaN-free gradients."""
    pos = p > 0
    safe_p = torch.where(pos, p, torch.ones_like(p))
    safe_q = torch.where(q > 0, q, torch.ones_like(q))
    terms = torch.where(pos, p * (torch.log(safe_p) - torch.log(safe_q)), torch.zeros_like(p))
    inf = torch.full_like(p, math.inf)
    return torch.where(pos & (q == 0), inf, terms)


def kl(p: ArrayLike, q: ArrayLike, axis: int = -1) -> Any:
    """Discrete KL divergence :math:`D_{KL}(P\\|Q)=\\sum_x p(x)\\log(p(x)/q(x))` in nats.

    ``0 * log(0 / q) = 0`` exactly (also for ``q = 0``); the result is ``+inf`` where some
    ``q(x) = 0 < p(x)`` (``P`` puts mass outside the support of ``Q``).

    Args:
        p: probabilities of the distribution the expectation is taken under.
        q: probabilities of the second distribution, same shape as ``p``.
        axis: the axis holding the outcomes (``dim`` for tensors); other axes are a batch.

    Returns:
        KL with ``axis`` reduced away; numpy for numpy input, torch for torch input.
    """
    use_torch, p, q = _prep_pair(p, q, axis)
    if use_torch:
        return _kl_terms_torch(p, q).sum(dim=axis)
    return special.rel_entr(p, q).sum(axis=axis)


def _log_softmax_np(x: np.ndarray, axis: int) -> np.ndarray:
    return x - special.logsumexp(x, axis=axis, keepdims=True)


def kl_from_logits(logits_p: ArrayLike, logits_q: ArrayLike, dim: int = -1) -> Any:
    """KL between the categoricals ``softmax(logits_p)`` and ``softmax(logits_q)``.

    Computed from ``log_softmax`` (a logsumexp shift), never ``log(softmax(.))``, so logits of
    any size give finite, accurate results. A logit of ``-inf`` masks an outcome: masked
    outcomes of ``P`` contribute 0, an outcome masked in ``Q`` but not in ``P`` gives ``+inf``.

    Args:
        logits_p: unnormalised log-probabilities of ``P`` (the expectation is under ``P``).
        logits_q: unnormalised log-probabilities of ``Q``, same shape.
        dim: the axis of the outcomes (vocabulary, actions).
    """
    use_torch, (lp, lq) = _to_backend(logits_p, logits_q)
    _check_same_shape("logits_p", lp, "logits_q", lq)
    for name, x in (("logits_p", lp), ("logits_q", lq)):
        _check_no_nan(name, x, use_torch)
        _check_axis(name, x, dim)
        pinf = bool((x == math.inf).any())
        if pinf:
            raise ValueError(f"{name}: logits must not be +inf")
        allmasked = (x == -math.inf).all(dim=dim) if use_torch else np.all(x == -np.inf, axis=dim)
        if bool(allmasked.any()):
            raise ValueError(f"{name}: every logit along dim {dim} is -inf (no outcome left)")
    if use_torch:
        return kl_from_log_probs(torch.log_softmax(lp, dim=dim), torch.log_softmax(lq, dim=dim), dim)
    return kl_from_log_probs(_log_softmax_np(lp, dim), _log_softmax_np(lq, dim), dim)


def kl_from_log_probs(logp: ArrayLike, logq: ArrayLike, dim: int = -1) -> Any:
    """``KL(P || Q) = sum_x P(x) (log P(x) - log Q(x))`` from normalised log-probabilities.

    The one place in the library where the categorical KL is written; :func:`kl_from_logits`
    (which checks its inputs and normalises) and every training loop call it. No input checks:
    ``logp`` and ``logq`` must already be log-probabilities along ``dim`` (``log_softmax``
    output), of one backend and shape. An outcome with ``P = 0`` contributes 0 (``0 log 0 = 0``,
    also where ``log Q = -inf``); one with ``P > 0`` and ``Q = 0`` makes the KL ``+inf``.
    numpy in, numpy out; torch in, torch out (differentiable).
    """
    if _is_torch(logp):
        p = logp.exp()
        live = p > 0
        zeros = torch.zeros_like(logp)
        diff = torch.where(live, logp, zeros) - torch.where(live, logq, zeros)
        terms = torch.where(live, p * diff, zeros)
        terms = torch.where(live & torch.isinf(logq), torch.full_like(p, math.inf), terms)
        return terms.sum(dim=dim)
    p = np.exp(logp)
    live = p > 0
    with np.errstate(invalid="ignore"):
        terms = np.where(live, p * (logp - logq), 0.0)
    return terms.sum(axis=dim)


# --------------------------------------------------------------------------- Gaussians
def gaussian_kl(mu_p: ArrayLike, std_p: ArrayLike, mu_q: ArrayLike, std_q: ArrayLike,
                reduce: str | None = None) -> Any:
    """Closed-form :math:`D_{KL}(\\mathcal N(\\mu_p,\\sigma_p^2)\\,\\|\\,\\mathcal N(\\mu_q,\\sigma_q^2))`.

    .. math::
        \\log\\frac{\\sigma_q}{\\sigma_p} + \\frac{\\sigma_p^2 + (\\mu_p-\\mu_q)^2}{2\\sigma_q^2}
        - \\frac12

    elementwise. A mean may broadcast with its own standard deviation (a state-independent
    ``log_std`` of shape ``(A,)`` with means ``(B, A)``), but the shapes of ``P`` and ``Q``
    must then agree.

    Args:
        reduce: ``None`` (elementwise), ``"sum"`` or ``"mean"`` over the last axis. For a
            diagonal Gaussian policy over ``A`` action dimensions, ``"sum"`` is the true KL of
            the joint distribution (KL adds up over independent coordinates). ``"mean"`` is
            that joint KL divided by ``A``: a target KL (``d_targ``, ``target_kl``) stated
            for per-dimension means is ``A`` times larger as a joint KL, so the same
            threshold gets looser as the action space grows. Say which one you report.
    """
    if reduce not in (None, "sum", "mean"):
        raise ValueError(f"reduce: must be None, 'sum' or 'mean', got {reduce!r}")
    use_torch, (mp, sp, mq, sq) = _to_backend(mu_p, std_p, mu_q, std_q)
    names = ("mu_p", "std_p", "mu_q", "std_q")
    for name, x in zip(names, (mp, sp, mq, sq)):
        _check_no_nan(name, x, use_torch)
    for name, x in (("std_p", sp), ("std_q", sq)):
        x = x.detach() if use_torch else x
        if bool((x <= 0).any()):
            bad = float(x.min())
            raise ValueError(f"{name}: standard deviations must be positive, found {bad:g}")
        if bool((x == math.inf).any()):
            raise ValueError(f"{name}: standard deviations must be finite")
    for name, x in (("mu_p", mp), ("mu_q", mq)):
        if bool(((x == math.inf) | (x == -math.inf)).any()):
            raise ValueError(f"{name}: means must be finite")
    try:
        shape_p = np.broadcast_shapes(tuple(mp.shape), tuple(sp.shape))
    except ValueError:
        raise ValueError(f"std_p: shape {tuple(sp.shape)} does not broadcast with mu_p "
                         f"shape {tuple(mp.shape)}") from None
    try:
        shape_q = np.broadcast_shapes(tuple(mq.shape), tuple(sq.shape))
    except ValueError:
        raise ValueError(f"std_q: shape {tuple(sq.shape)} does not broadcast with mu_q "
                         f"shape {tuple(mq.shape)}") from None
    if shape_p != shape_q:
        raise ValueError(f"mu_q/std_q: shape {shape_q} does not match the shape {shape_p} "
                         "of mu_p/std_p (no broadcasting between the two distributions)")
    if reduce is not None and len(shape_p) == 0:
        raise ValueError(f"reduce: {reduce!r} needs at least one (action) axis, got scalars")
    log = torch.log if use_torch else np.log
    out = log(sq / sp) + (sp ** 2 + (mp - mq) ** 2) / (2 * sq ** 2) - 0.5
    if use_torch:
        out = out.expand(shape_p) if tuple(out.shape) != shape_p else out
    else:
        out = np.broadcast_to(out, shape_p)
    if reduce == "sum":
        return out.sum(-1) if use_torch else out.sum(axis=-1)
    if reduce == "mean":
        return out.mean(-1) if use_torch else out.mean(axis=-1)
    return out if use_torch else np.array(out)


# --------------------------------------------------------------------------- relatives
def js(p: ArrayLike, q: ArrayLike, axis: int = -1) -> Any:
    """Jensen-Shannon divergence in nats: ``0.5*KL(P||M) + 0.5*KL(Q||M)``, ``M = (P+Q)/2``.

    Symmetric, always finite, and at most ``log 2`` (reached when the supports are disjoint).
    Its square root is a metric.
    """
    use_torch, p, q = _prep_pair(p, q, axis)
    m = 0.5 * (p + q)
    if use_torch:
        return 0.5 * _kl_terms_torch(p, m).sum(dim=axis) + 0.5 * _kl_terms_torch(q, m).sum(dim=axis)
    return 0.5 * special.rel_entr(p, m).sum(axis=axis) + 0.5 * special.rel_entr(q, m).sum(axis=axis)


def symmetric_kl(p: ArrayLike, q: ArrayLike, axis: int = -1) -> Any:
    """Jeffreys' symmetrised KL, ``KL(P||Q) + KL(Q||P)`` (no factor 1/2).

    Infinite as soon as either distribution puts mass where the other has none.
    """
    return kl(p, q, axis=axis) + kl(q, p, axis=axis)


def total_variation(p: ArrayLike, q: ArrayLike, axis: int = -1) -> Any:
    """Total variation distance ``0.5 * sum |p - q|`` = the largest difference ``P(A) - Q(A)``.

    Lies in ``[0, 1]``.
    """
    use_torch, p, q = _prep_pair(p, q, axis)
    if use_torch:
        return 0.5 * (p - q).abs().sum(dim=axis)
    return 0.5 * np.abs(p - q).sum(axis=axis)


# --------------------------------------------------------------------------- f-divergences
@dataclass(frozen=True)
class FGenerator:
    """A generator ``f`` of the f-divergence ``D_f(P||Q) = sum_x q(x) f(p(x)/q(x))``.

    ``f`` is convex on ``[0, inf)`` with ``f(1) = 0`` and must accept ``t = 0`` (the limit
    value, possibly ``+inf``). ``slope_at_inf`` is ``lim_{t->inf} f(t)/t``: the cost per unit
    of ``P``-mass where ``q = 0`` (the convention ``0 * f(p/0) = p * slope_at_inf``).
    """

    name: str
    f: Callable[[np.ndarray], np.ndarray]
    slope_at_inf: float

    def __call__(self, t: np.ndarray) -> np.ndarray:
        return self.f(t)


def _f_kl(t):
    return special.xlogy(t, t)


def _f_reverse_kl(t):
    with np.errstate(divide="ignore"):
        return -np.log(t)


def _f_js(t):
    return 0.5 * (special.xlogy(t, t) - special.xlogy(1 + t, (1 + t) / 2))


def _f_tv(t):
    return 0.5 * np.abs(t - 1)


def _f_chi2(t):
    return (t - 1) ** 2


F_KL = FGenerator("kl", _f_kl, math.inf)                 # t log t  -> KL(P||Q)
F_REVERSE_KL = FGenerator("reverse_kl", _f_reverse_kl, 0.0)  # -log t -> KL(Q||P)
F_JS = FGenerator("js", _f_js, 0.5 * math.log(2))        # -> Jensen-Shannon
F_TV = FGenerator("tv", _f_tv, 0.5)                      # |t-1|/2 -> total variation
F_CHI2 = FGenerator("chi2", _f_chi2, math.inf)           # (t-1)^2 -> Pearson chi^2(P||Q)

F_GENERATORS: dict[str, FGenerator] = {
    g.name: g for g in (F_KL, F_REVERSE_KL, F_JS, F_TV, F_CHI2)
}


def f_divergence(p: ArrayLike, q: ArrayLike,
                 f: Union[str, FGenerator, Callable[[np.ndarray], np.ndarray]],
                 axis: int = -1) -> Any:
    """The f-divergence ``D_f(P||Q) = sum_x q(x) f(p(x) / q(x))`` (an expectation under ``Q``).

    Args:
        f: a name in :data:`F_GENERATORS` (``"kl"``, ``"reverse_kl"``, ``"js"``, ``"tv"``,
            ``"chi2"``), an :class:`FGenerator`, or a plain vectorised callable. A plain
            callable must satisfy ``f(1) = 0`` and ``q > 0`` wherever ``p > 0`` (its slope
            at infinity is unknown); use an :class:`FGenerator` otherwise.

    Conventions: ``0 * f(0/0) = 0``; where ``q = 0 < p`` the term is ``p * slope_at_inf``.
    Computed in numpy (float64); torch input returns a (non-differentiable) tensor.
    """
    use_torch, p_in, q_in = _prep_pair(p, q, axis)
    if use_torch:
        ref = p_in
        p_np = p_in.detach().cpu().double().numpy()
        q_np = q_in.detach().cpu().double().numpy()
    else:
        p_np, q_np = p_in.astype(np.float64), q_in.astype(np.float64)
    if isinstance(f, str):
        if f not in F_GENERATORS:
            raise ValueError(f"f: unknown generator {f!r}; choose from {sorted(F_GENERATORS)}")
        gen: FGenerator | None = F_GENERATORS[f]
        func = gen.f
    elif isinstance(f, FGenerator):
        gen, func = f, f.f
    elif callable(f):
        gen, func = None, f
        f1 = float(np.asarray(f(np.array([1.0])), dtype=np.float64).ravel()[0])
        if not abs(f1) <= 1e-10:
            raise ValueError(f"f: a generator must satisfy f(1) = 0, got f(1) = {f1:g}")
    else:
        raise ValueError(f"f: must be a generator name, an FGenerator or a callable, got {f!r}")
    qpos = q_np > 0
    outside = (~qpos) & (p_np > 0)
    if gen is None and bool(outside.any()):
        raise ValueError("q: is zero where p > 0; a plain callable f has no known slope at "
                         "infinity, pass an FGenerator")
    t = np.where(qpos, p_np / np.where(qpos, q_np, 1.0), 1.0)
    with np.errstate(invalid="ignore"):
        fv = np.asarray(func(t), dtype=np.float64)
        terms = np.where(qpos, q_np * fv, 0.0)
        if gen is not None:
            slope = gen.slope_at_inf
            extra = np.where(outside, p_np * slope if slope != 0 else 0.0, 0.0)
            terms = terms + extra
    out = terms.sum(axis=axis)
    if use_torch:
        return torch.as_tensor(out, dtype=ref.dtype, device=ref.device)
    return out


# --------------------------------------------------------------------------- Wasserstein
def _check_1d_sample(name: str, x: np.ndarray) -> None:
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{name}: must be a non-empty 1-D array, got shape {x.shape}")
    if np.isnan(x).any():
        raise ValueError(f"{name}: contains NaN")
    if np.isinf(x).any():
        raise ValueError(f"{name}: must be finite")


def wasserstein_1d(u_values: ArrayLike, v_values: ArrayLike,
                   u_weights: ArrayLike | None = None, v_weights: ArrayLike | None = None) -> float:
    """Wasserstein-1 (earth mover's) distance between two distributions on the real line.

    ``W1(U, V) = integral |F_U(x) - F_V(x)| dx`` with ``F`` the cumulative distribution
    functions. ``u_values`` are the atoms of ``U`` with optional non-negative ``u_weights``
    (normalised here; default uniform, i.e. an empirical sample), likewise for ``V``. Unlike
    KL it stays finite for distributions with disjoint supports and grows with how far the
    mass must move. Returns a Python float (in the units of the values).
    """
    u = np.asarray(u_values.detach().cpu() if _is_torch(u_values) else u_values, dtype=np.float64)
    v = np.asarray(v_values.detach().cpu() if _is_torch(v_values) else v_values, dtype=np.float64)
    _check_1d_sample("u_values", u)
    _check_1d_sample("v_values", v)

    def weights(name: str, w: Any, n: int) -> np.ndarray:
        if w is None:
            return np.full(n, 1.0 / n)
        w = np.asarray(w.detach().cpu() if _is_torch(w) else w, dtype=np.float64)
        if w.shape != (n,):
            raise ValueError(f"{name}: shape {w.shape} does not match its values' shape ({n},)")
        if np.isnan(w).any() or np.isinf(w).any():
            raise ValueError(f"{name}: must be finite (no NaN or inf)")
        if (w < 0).any():
            raise ValueError(f"{name}: weights must be non-negative, found {w.min():g}")
        total = w.sum()
        if not total > 0:
            raise ValueError(f"{name}: weights must have a positive sum")
        return w / total

    uw = weights("u_weights", u_weights, u.size)
    vw = weights("v_weights", v_weights, v.size)
    ui, vi = np.argsort(u), np.argsort(v)
    u, uw, v, vw = u[ui], uw[ui], v[vi], vw[vi]
    grid = np.sort(np.concatenate([u, v]))
    deltas = np.diff(grid)
    # CDFs evaluated just right of each grid point (step functions, right-continuous)
    ucdf = np.concatenate([[0.0], np.cumsum(uw)])[np.searchsorted(u, grid[:-1], side="right")]
    vcdf = np.concatenate([[0.0], np.cumsum(vw)])[np.searchsorted(v, grid[:-1], side="right")]
    return float(np.sum(np.abs(ucdf - vcdf) * deltas))
