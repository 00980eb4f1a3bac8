"""Fitting one Gaussian ``Q = N(mu, sigma^2)`` to a 1-D target density ``P``.

The book's running example of forward versus reverse KL (``notation.md``: ``P`` is the
target, ``Q`` the model):

* forward KL, ``KL(P || Q) = E_{x~P}[log P(x) - log Q(x)]``: mass covering;
* reverse KL, ``KL(Q || P) = E_{x~Q}[log Q(x) - log P(x)]``: mode seeking;

and, for the chapter on other divergences, the same fit under Jensen-Shannon, total
variation, Pearson chi-squared, squared Hellinger, symmetric KL and Wasserstein-1.

Numerics. Integrals are computed on a fixed, fine, uniform grid with Simpson's rule
(``scipy.integrate.simpson``). The target is given as a *log* density (it may be
unnormalised; it is normalised on the grid), and every divergence is evaluated in the log
domain, so a target density that underflows to 0 in its tails never produces ``nan`` or a
spurious ``inf``; nothing is clipped. The parameters are ``(mu, log sigma)`` so the
optimiser cannot propose a negative standard deviation. Forward and reverse KL use
L-BFGS-B with exact gradients (derived below); the other divergences use Nelder-Mead.

The grid must cover the mass of the target and of every Gaussian the optimiser visits;
:func:`fit_gaussian` raises ``ValueError`` if the target's density at the grid ends is not
negligible (density times grid step above ``1e-6``) or if the fitted Gaussian leaves more
than ``1e-6`` of its mass outside the grid.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from scipy import integrate, optimize, special, stats

__all__ = [
    "gaussian_mixture_logpdf", "make_grid", "FitResult", "fit_gaussian",
    "divergence_to_gaussian", "divergence_map", "DIVERGENCES",
]

LOG2 = math.log(2.0)
DIVERGENCES = ("forward_kl", "reverse_kl", "symmetric_kl", "js", "tv", "chi2", "hellinger",
               "wasserstein1")
_ALIASES = {"forward": "forward_kl", "reverse": "reverse_kl"}


def gaussian_mixture_logpdf(x: np.ndarray | float, weights: Sequence[float],
                            means: Sequence[float], stds: Sequence[float]) -> np.ndarray:
    """``log sum_k w_k N(x; m_k, s_k^2)``, computed with logsumexp (finite far in the tails).

    Args:
        x: points (any shape).
        weights: non-negative mixture weights summing to 1 (tolerance 1e-6).
        means, stds: component means and positive standard deviations, same length.
    """
    w = np.asarray(weights, dtype=np.float64)
    m = np.asarray(means, dtype=np.float64)
    s = np.asarray(stds, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"weights: must be a non-empty 1-D sequence, got shape {w.shape}")
    if m.shape != w.shape:
        raise ValueError(f"means: shape {m.shape} does not match weights shape {w.shape}")
    if s.shape != w.shape:
        raise ValueError(f"stds: shape {s.shape} does not match weights shape {w.shape}")
    for name, a in (("weights", w), ("means", m), ("stds", s)):
        if not np.isfinite(a).all():
            raise ValueError(f"{name}: must be finite (no NaN or inf)")
    if (w < 0).any():
        raise ValueError(f"weights: must be non-negative, found {w.min():g}")
    if abs(w.sum() - 1) > 1e-6:
        raise ValueError(f"weights: must sum to 1 (tolerance 1e-6), sum is {w.sum():.8g}")
    if (s <= 0).any():
        raise ValueError(f"stds: must be positive, found {s.min():g}")
    xa = np.asarray(x, dtype=np.float64)
    if np.isnan(xa).any():
        raise ValueError("x: contains NaN")
    with np.errstate(divide="ignore"):
        logw = np.log(w)  # a zero weight gives -inf, which logsumexp handles
    comp = stats.norm.logpdf(xa[..., None], loc=m, scale=s) + logw
    return special.logsumexp(comp, axis=-1)


def make_grid(lo: float = -15.0, hi: float = 15.0, n: int = 6001) -> np.ndarray:
    """A uniform grid for Simpson's rule (``n`` odd)."""
    if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo):
        raise ValueError(f"grid: need finite lo < hi, got lo={lo}, hi={hi}")
    if n < 3 or n % 2 == 0:
        raise ValueError(f"grid: n must be odd and >= 3 for Simpson's rule, got {n}")
    return np.linspace(lo, hi, n)


@dataclass
class FitResult:
    """The fitted Gaussian ``N(mu, sigma^2)`` and how it was obtained.

    ``objective`` is the divergence at the optimum (nats for the KL family, JS and
    Hellinger; a probability for TV; units of x for Wasserstein-1).
    """

    mu: float
    sigma: float
    objective: float
    success: bool
    divergence: str
    init: tuple[float, float]
    nit: int = 0
    message: str = ""
    extra: dict = field(default_factory=dict)


def _simpson(y: np.ndarray, x: np.ndarray) -> float:
    return float(integrate.simpson(y, x=x))


class _Target:
    """The target on the grid: normalised log density, density and CDF."""

    def __init__(self, log_target: Callable[[np.ndarray], np.ndarray], x: np.ndarray):
        logp = np.asarray(log_target(x), dtype=np.float64)
        if logp.shape != x.shape:
            raise ValueError(f"log_target: returned shape {logp.shape} for a grid of shape "
                             f"{x.shape}")
        if np.isnan(logp).any() or (logp == np.inf).any():
            raise ValueError("log_target: returned NaN or +inf on the grid")
        top = logp.max()
        if not np.isfinite(top):
            raise ValueError("log_target: is -inf everywhere on the grid")
        z = _simpson(np.exp(logp - top), x)
        self.logp = logp - (top + math.log(z))  # normalised on the grid
        self.p = np.exp(self.logp)
        self.x = x
        self.cdf = np.concatenate([[0.0], integrate.cumulative_simpson(self.p, x=x)])
        self.cdf = np.clip(self.cdf / self.cdf[-1], 0.0, 1.0)
        self.edge_mass = float(self.p[0] + self.p[-1]) * float(x[1] - x[0])


def _gauss_log(x: np.ndarray, mu: float, sigma: float) -> np.ndarray:
    z = (x - mu) / sigma
    return -0.5 * z * z - math.log(sigma) - 0.5 * math.log(2 * math.pi)


def _xlogy_exp(loga: np.ndarray, diff: np.ndarray) -> np.ndarray:
    """``exp(loga) * diff`` with ``0 * (anything finite or inf) = 0`` where exp underflows."""
    a = np.exp(loga)
    with np.errstate(invalid="ignore"):
        return np.where(a > 0, a * diff, 0.0)


def _objective(name: str, t: _Target, mu: float, sigma: float) -> float:
    x, logp, p = t.x, t.logp, t.p
    logq = _gauss_log(x, mu, sigma)
    if name == "forward_kl":
        return _simpson(_xlogy_exp(logp, logp - logq), x)
    if name == "reverse_kl":
        return _simpson(_xlogy_exp(logq, logq - logp), x)
    if name == "symmetric_kl":
        return _objective("forward_kl", t, mu, sigma) + _objective("reverse_kl", t, mu, sigma)
    if name == "js":
        logm = np.logaddexp(logp, logq) - LOG2
        return 0.5 * _simpson(_xlogy_exp(logp, logp - logm) + _xlogy_exp(logq, logq - logm), x)
    if name == "tv":
        return 0.5 * _simpson(np.abs(p - np.exp(logq)), x)
    if name == "chi2":  # Pearson chi^2(P || Q) = int p^2 / q - 1 (Q = model in the denominator)
        with np.errstate(over="ignore"):  # +inf is the right value when Q's tails are too light
            return _simpson(np.exp(2 * logp - logq), x) - 1.0
    if name == "hellinger":  # squared Hellinger int (sqrt p - sqrt q)^2 = 2 - 2 int sqrt(pq)
        return 2.0 - 2.0 * _simpson(np.exp(0.5 * (logp + logq)), x)
    if name == "wasserstein1":  # int |F_P - F_Q| dx
        return _simpson(np.abs(t.cdf - stats.norm.cdf(x, mu, sigma)), x)
    raise AssertionError(name)  # pragma: no cover (names are validated by the caller)


def _kl_grad(name: str, t: _Target, mu: float, sigma: float) -> np.ndarray:
    """Exact gradient of forward/reverse KL w.r.t. (mu, log sigma).

    With z = (x - mu)/sigma: d log q / d mu = z / sigma, d log q / d log sigma = z^2 - 1.
    Forward: d/dtheta [-int p log q] = -int p * dlogq.
    Reverse: d/dtheta int q (log q - log p) = int q * dlogq * (log q - log p)
    (the term int q * dlogq vanishes because Q integrates to 1).
    """
    x, logp = t.x, t.logp
    logq = _gauss_log(x, mu, sigma)
    z = (x - mu) / sigma
    d_mu, d_ls = z / sigma, z * z - 1.0
    if name == "forward_kl":
        w = np.exp(logp)
        return np.array([-_simpson(w * d_mu, x), -_simpson(w * d_ls, x)])
    w = _xlogy_exp(logq, logq - logp)
    return np.array([_simpson(w * d_mu, x), _simpson(w * d_ls, x)])


def divergence_to_gaussian(log_target: Callable[[np.ndarray], np.ndarray], mu: float,
                           sigma: float, divergence: str = "forward_kl",
                           grid: np.ndarray | None = None) -> float:
    """The divergence between the target ``P`` and ``N(mu, sigma^2)`` on the grid.

    ``divergence`` names are those of :data:`DIVERGENCES` (``"forward"`` and ``"reverse"``
    are accepted for the two KLs). KL-type names take ``P`` as the target: ``forward_kl`` is
    ``KL(P||Q)``, ``reverse_kl`` is ``KL(Q||P)``, ``chi2`` is Pearson's ``chi^2(P||Q)``.
    """
    name = _check_name(divergence)
    if not (np.isfinite(mu) and np.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma: need finite mu and sigma > 0, got mu={mu}, sigma={sigma}")
    x = make_grid() if grid is None else _check_grid(grid)
    return _objective(name, _Target(log_target, x), float(mu), float(sigma))


def divergence_map(log_target: Callable[[np.ndarray], np.ndarray], mus: np.ndarray,
                   sigmas: np.ndarray, divergence: str = "reverse_kl",
                   grid: np.ndarray | None = None) -> np.ndarray:
    """The divergence between ``P`` and ``N(mu, sigma^2)`` for every pair of a 2-D mesh.

    Returns an array of shape ``(len(sigmas), len(mus))`` (rows: sigma), ready for
    ``plt.contour(mus, sigmas, values)``. Same conventions as :func:`divergence_to_gaussian`;
    the target is evaluated once.
    """
    name = _check_name(divergence)
    mus = np.asarray(mus, dtype=np.float64)
    sigmas = np.asarray(sigmas, dtype=np.float64)
    if mus.ndim != 1 or not np.isfinite(mus).all():
        raise ValueError("mus: must be a finite 1-D array")
    if sigmas.ndim != 1 or not np.isfinite(sigmas).all() or (sigmas <= 0).any():
        raise ValueError("sigmas: must be a 1-D array of finite positive numbers")
    x = make_grid() if grid is None else _check_grid(grid)
    t = _Target(log_target, x)
    return np.array([[_objective(name, t, float(m), float(s)) for m in mus] for s in sigmas])


def _check_name(divergence: str) -> str:
    name = _ALIASES.get(divergence, divergence)
    if name not in DIVERGENCES:
        raise ValueError(f"direction: must be 'forward', 'reverse' or one of {DIVERGENCES}, "
                         f"got {divergence!r}")
    return name


def _check_grid(grid: np.ndarray) -> np.ndarray:
    x = np.asarray(grid, dtype=np.float64)
    if x.ndim != 1 or x.size < 3 or x.size % 2 == 0:
        raise ValueError(f"grid: must be a 1-D array of odd length >= 3, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("grid: must be finite")
    dx = np.diff(x)
    if not (dx > 0).all() or not np.allclose(dx, dx[0], rtol=1e-8):
        raise ValueError("grid: must be increasing and uniformly spaced")
    return x


def fit_gaussian(log_target: Callable[[np.ndarray], np.ndarray], direction: str = "forward",
                 init: tuple[float, float] = (0.0, 1.0), grid: np.ndarray | None = None,
                 tol: float = 1e-10, maxiter: int = 2000, method: str = "auto",
                 flow_time: float = 50.0) -> FitResult:
    """Fit ``Q = N(mu, sigma^2)`` to the target ``P`` by minimising a divergence.

    Args:
        log_target: vectorised log density of ``P`` (may be unnormalised).
        direction: ``"forward"`` (``KL(P||Q)``, mass covering), ``"reverse"``
            (``KL(Q||P)``, mode seeking), or any name in :data:`DIVERGENCES`.
        init: starting ``(mu0, sigma0)``; reverse KL and the other non-convex objectives
            converge to a mode that depends on it.
        grid: uniform grid of odd length (default ``make_grid()``: [-15, 15], 6001 points).
        tol: optimiser tolerance: the projected-gradient tolerance of L-BFGS-B (forward and
            reverse KL) or the objective tolerance of Nelder-Mead (the others).
        method: ``"auto"`` (L-BFGS-B for the two KLs, Nelder-Mead otherwise) or ``"flow"``
            (forward/reverse KL only): first integrate the gradient flow
            ``d(mu, log sigma)/dt = -grad`` for ``flow_time`` time units, then polish with
            L-BFGS-B. A quasi-Newton step can jump over a ridge into another basin; the
            flow cannot, so use it to map which start leads to which local optimum.

    Returns:
        :class:`FitResult`. ``success`` is the optimiser's flag; a ``ValueError`` is raised if
        the grid cuts off the target or more than ``1e-6`` of the fitted Gaussian's mass.
    """
    name = _check_name(direction)
    mu0, sigma0 = (float(v) for v in init)
    if not (np.isfinite(mu0) and np.isfinite(sigma0) and sigma0 > 0):
        raise ValueError(f"init: need finite (mu0, sigma0) with sigma0 > 0, got {init}")
    x = make_grid() if grid is None else _check_grid(grid)
    t = _Target(log_target, x)
    if t.edge_mass > 1e-6:
        raise ValueError("grid: the target has non-negligible density at the grid ends; widen it")
    theta0 = np.array([mu0, math.log(sigma0)])
    span = float(x[-1] - x[0])
    # keep sigma between a few grid steps and the grid width so Simpson's rule stays accurate
    ls_lo, ls_hi = math.log(5 * (x[1] - x[0])), math.log(span / 4)
    if not ls_lo < theta0[1] < ls_hi:
        raise ValueError(f"init: sigma0={sigma0} is outside the range the grid resolves "
                         f"({math.exp(ls_lo):.3g}, {math.exp(ls_hi):.3g})")
    bounds = [(float(x[0]), float(x[-1])), (ls_lo, ls_hi)]

    def f(theta):
        return _objective(name, t, theta[0], math.exp(theta[1]))

    if method not in ("auto", "flow"):
        raise ValueError(f"method: must be 'auto' or 'flow', got {method!r}")
    if method == "flow" and name not in ("forward_kl", "reverse_kl"):
        raise ValueError(f"method: 'flow' needs the exact gradient of forward or reverse KL, "
                         f"not {name!r}")
    extra: dict = {}
    if method == "flow":
        # follow the gradient flow d theta / dt = -grad f(theta) until it settles, so the
        # mode reached is the basin of attraction of init, not an artefact of long
        # line-search steps; then polish with L-BFGS-B below.
        def rhs(_t, th):
            th = np.clip(th, [b[0] for b in bounds], [b[1] for b in bounds])
            return -_kl_grad(name, t, th[0], math.exp(th[1]))

        sol = integrate.solve_ivp(rhs, (0.0, flow_time), theta0, method="RK45",
                                  rtol=1e-4, atol=1e-6)
        extra["flow_end"] = (float(sol.y[0, -1]), float(math.exp(sol.y[1, -1])))
        extra["flow_nfev"] = int(sol.nfev)
        theta0 = np.clip(sol.y[:, -1], [b[0] for b in bounds], [b[1] for b in bounds])
    if name in ("forward_kl", "reverse_kl"):
        res = optimize.minimize(
            lambda th: (f(th), _kl_grad(name, t, th[0], math.exp(th[1]))),
            theta0, jac=True, method="L-BFGS-B", bounds=bounds,
            options={"ftol": 1e-15, "gtol": tol, "maxiter": maxiter})
    else:
        # Nelder-Mead (TV and W1 are not differentiable at their optimum). Points outside the
        # box score +inf instead of being clipped onto it: clipping can flatten the simplex
        # against a bound, where it then stalls. Restart from the result until it stops
        # improving (the standard remedy for a prematurely collapsed simplex).
        def f_box(theta):
            if not (bounds[0][0] <= theta[0] <= bounds[0][1]
                    and bounds[1][0] <= theta[1] <= bounds[1][1]):
                return math.inf
            return f(theta)

        start, nit, res = theta0, 0, None
        for _ in range(5):
            simplex = start + np.array([[0.0, 0.0], [0.5, 0.0], [0.0, 0.3]])
            res = optimize.minimize(f_box, start, method="Nelder-Mead",
                                    options={"xatol": 1e-8, "fatol": tol, "maxiter": maxiter,
                                             "maxfev": 4 * maxiter, "initial_simplex": simplex})
            nit += int(res.nit)
            improved = np.linalg.norm(res.x - start) > 1e-7
            start = res.x
            if not improved:
                break
        res.nit = nit
    mu, sigma = float(res.x[0]), float(math.exp(res.x[1]))
    lost = stats.norm.cdf(x[0], mu, sigma) + stats.norm.sf(x[-1], mu, sigma)
    if lost > 1e-6:
        raise ValueError(f"grid: the fitted Gaussian N({mu:.3g}, {sigma:.3g}^2) leaves "
                         f"{lost:.2g} of its mass off the grid; widen it")
    return FitResult(mu=mu, sigma=sigma, objective=float(res.fun), success=bool(res.success),
                     divergence=name, init=(mu0, sigma0), nit=int(res.nit),
                     message=str(res.message), extra=extra)
