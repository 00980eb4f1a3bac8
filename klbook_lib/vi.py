"""Variational inference on a latent-variable model small enough to enumerate.

The model has a latent ``z`` taking ``K`` values ``z_1..z_K`` (a grid on the real line or
just labels), a prior ``p(z)`` and a Gaussian likelihood for one scalar observation,

    x | z = z_k  ~  N(mean_k, sigma^2).

Because ``z`` is finite, every quantity of variational inference is an exact sum:

    log p(x)     = log sum_k p(z_k) N(x; mean_k, sigma^2)       (the evidence)
    p(z | x)     = p(z) p(x | z) / p(x)                          (the posterior)
    ELBO(q)      = E_q[log p(x, z) - log q(z)]
    log p(x)     = ELBO(q) + KL(q || p(z | x))                   (for every q)

The last line is why maximising the ELBO over ``q`` is minimising the reverse KL from
``q`` (the model) to the posterior (the target). :func:`fit_elbo` does that by gradient
ascent in two families: all categorical distributions on the ``K`` values (which
contains the posterior, so the KL goes to 0) and discretised Gaussians on a grid (two
parameters; on a two-mode posterior the best member locks onto one mode and the KL
stays positive).

Two ready-made models: :func:`squared_latent_model` (a standard-normal latent observed
through ``z^2``, so ``x > 0`` has two explanations ``z = +-sqrt(x)`` and the posterior
is bimodal) and :func:`mixture_model` (``z`` is the component of a Gaussian mixture).

References: Blei, Kucukelbir and McAuliffe (2017), "Variational inference: a review
for statisticians"; Kingma and Welling (2014), "Auto-encoding variational Bayes".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import logsumexp
from tqdm import tqdm

from .divergences import kl_from_log_probs

__all__ = [
    "LatentModel",
    "squared_latent_model",
    "mixture_model",
    "log_evidence",
    "posterior",
    "elbo",
    "kl_to_posterior",
    "gaussian_on_grid",
    "ElboFit",
    "fit_elbo",
]

_LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class LatentModel:
    """A finite latent ``z`` with prior ``prior`` and likelihood ``x | z_k ~ N(mean_k, sigma^2)``.

    ``z`` holds the latent values (used for plots and for the Gaussian family),
    ``prior`` the prior probabilities, ``mean`` the likelihood mean for each value.
    """

    z: np.ndarray
    prior: np.ndarray
    mean: np.ndarray
    sigma: float

    def __post_init__(self) -> None:
        z = np.asarray(self.z, dtype=np.float64)
        prior = np.asarray(self.prior, dtype=np.float64)
        mean = np.asarray(self.mean, dtype=np.float64)
        if z.ndim != 1 or z.size < 2:
            raise ValueError(f"z: must be a 1-D array of at least 2 latent values, got shape {z.shape}")
        if prior.shape != z.shape:
            raise ValueError(f"prior: shape {prior.shape} does not match z shape {z.shape}")
        if mean.shape != z.shape:
            raise ValueError(f"mean: shape {mean.shape} does not match z shape {z.shape}")
        if np.any(prior <= 0) or not np.all(np.isfinite(prior)):
            raise ValueError(f"prior: probabilities must be positive and finite, found {prior.min():g}")
        if abs(prior.sum() - 1.0) > 1e-6:
            raise ValueError(f"prior: probabilities must sum to 1, they sum to {prior.sum():.8g}")
        if not np.all(np.isfinite(mean)):
            raise ValueError("mean: must be finite")
        if not (np.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma: must be a finite number > 0, got {self.sigma}")
        object.__setattr__(self, "z", z)
        object.__setattr__(self, "prior", prior / prior.sum())
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "sigma", float(self.sigma))

    @property
    def K(self) -> int:
        """Number of latent values."""
        return self.z.size

    def log_prior(self) -> np.ndarray:
        """``log p(z_k)`` for every ``k``."""
        return np.log(self.prior)

    def log_likelihood(self, x: float) -> np.ndarray:
        """``log p(x | z_k) = log N(x; mean_k, sigma^2)`` for every ``k``."""
        x = _check_x(x)
        return -0.5 * ((x - self.mean) / self.sigma) ** 2 - math.log(self.sigma) - 0.5 * _LOG_2PI

    def log_joint(self, x: float) -> np.ndarray:
        """``log p(x, z_k) = log p(z_k) + log p(x | z_k)``."""
        return self.log_prior() + self.log_likelihood(x)

    def sample(self, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``n`` draws ``(z, x)`` from the joint (returns latent values and observations)."""
        if n < 1:
            raise ValueError(f"n: must be >= 1, got {n}")
        rng = np.random.default_rng(seed)
        k = rng.choice(self.K, size=n, p=self.prior)
        return self.z[k], self.mean[k] + self.sigma * rng.standard_normal(n)


def _check_x(x) -> float:
    try:
        x = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"x: must be one real observation, got {x!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"x: must be finite, got {x}")
    return x


def squared_latent_model(K: int = 61, z_max: float = 3.0, sigma: float = 0.5) -> LatentModel:
    """``z ~ N(0, 1)`` restricted to ``K`` grid points in ``[-z_max, z_max]``, ``x | z ~ N(z^2, sigma^2)``.

    An observation ``x > 0`` is equally well explained by ``+sqrt(x)`` and ``-sqrt(x)``,
    so the posterior has two mirror-image modes.
    """
    if K < 3:
        raise ValueError(f"K: need at least 3 grid points, got {K}")
    if not z_max > 0:
        raise ValueError(f"z_max: must be > 0, got {z_max}")
    z = np.linspace(-z_max, z_max, K)
    prior = np.exp(-0.5 * z**2)
    return LatentModel(z=z, prior=prior / prior.sum(), mean=z**2, sigma=sigma)


def mixture_model(weights, means, sigma: float = 1.0) -> LatentModel:
    """A Gaussian mixture: ``z`` is the component index ``0..K-1`` with prior ``weights``."""
    weights = np.asarray(weights, dtype=np.float64)
    means = np.asarray(means, dtype=np.float64)
    if weights.ndim != 1 or weights.size < 2:
        raise ValueError(f"weights: must be a 1-D array of at least 2 mixture weights, got shape {weights.shape}")
    return LatentModel(z=np.arange(weights.size, dtype=np.float64), prior=weights, mean=means, sigma=sigma)


# --------------------------------------------------------------------------- exact quantities

def log_evidence(model: LatentModel, x: float) -> float:
    """``log p(x) = log sum_k p(z_k) p(x | z_k)`` (exact, by enumeration, log-sum-exp)."""
    return float(logsumexp(model.log_joint(x)))


def posterior(model: LatentModel, x: float) -> np.ndarray:
    """``p(z_k | x) = p(x, z_k) / p(x)`` for every ``k``."""
    lj = model.log_joint(x)
    return np.exp(lj - logsumexp(lj))


def _check_q(q, K: int) -> np.ndarray:
    q = np.asarray(q, dtype=np.float64)
    if q.shape != (K,):
        raise ValueError(f"q: must have one probability per latent value, shape ({K},), got {q.shape}")
    if not np.all(np.isfinite(q)):
        raise ValueError("q: probabilities must be finite")
    if np.any(q < 0):
        raise ValueError(f"q: probabilities must be non-negative, found {q.min():g}")
    if abs(q.sum() - 1.0) > 1e-6:
        raise ValueError(f"q: probabilities must sum to 1, they sum to {q.sum():.8g}")
    return q / q.sum()


def _log(q: np.ndarray) -> np.ndarray:
    """``log q`` with ``log 0 = -inf`` and no warning."""
    with np.errstate(divide="ignore"):
        return np.log(q)


def elbo(q, model: LatentModel, x: float) -> float:
    """``ELBO(q) = E_q[log p(x, z) - log q(z)] = E_q[log p(x, z)] + H(q)``."""
    q = _check_q(q, model.K)
    # sum_z q (log q - log p(x, z)), the categorical KL's sum against the unnormalised joint
    return -float(kl_from_log_probs(_log(q), model.log_joint(x)))


def kl_to_posterior(q, model: LatentModel, x: float) -> float:
    """The reverse KL ``KL(q || p(z | x))`` from the approximation ``q`` to the posterior."""
    q = _check_q(q, model.K)
    lj = model.log_joint(x)
    return float(kl_from_log_probs(_log(q), lj - logsumexp(lj)))


# --------------------------------------------------------------------------- families and fitting

def gaussian_on_grid(z, m, log_s):
    """A Gaussian ``N(m, s^2)`` restricted to the grid ``z`` and renormalised (numpy or torch)."""
    if isinstance(m, torch.Tensor) or isinstance(log_s, torch.Tensor):
        zt = torch.as_tensor(np.asarray(z), dtype=torch.float64)
        return torch.softmax(-0.5 * ((zt - m) / torch.exp(log_s)) ** 2, dim=0)
    logits = -0.5 * ((np.asarray(z, dtype=np.float64) - m) / math.exp(log_s)) ** 2
    return np.exp(logits - logsumexp(logits))


@dataclass
class ElboFit:
    """Result of :func:`fit_elbo`: the final ``q``, its parameters and the history.

    ``history`` is a dict of lists: ``step``, ``elbo``, ``kl`` (``KL(q || p(z|x))``)
    and ``gap`` (``log p(x) - ELBO``, equal to ``kl``).
    """

    q: np.ndarray
    params: dict
    history: dict
    log_evidence: float


FAMILIES = ("categorical", "gaussian")


def fit_elbo(
    model: LatentModel,
    x: float,
    family: str = "categorical",
    steps: int = 500,
    lr: float | None = None,
    init: dict | None = None,
    seed: int = 0,
    record_every: int = 5,
    progress: bool = False,
) -> ElboFit:
    """Maximise ``ELBO(q)`` over a family by gradient ascent (Adam) on exact sums.

    family:
        ``"categorical"``: ``q = softmax(logits)`` over the ``K`` latent values (contains
        the posterior). ``init={"logits": ...}`` or standard-normal logits from ``seed``.
        ``"gaussian"``: ``q = gaussian_on_grid(model.z, m, log_s)`` (two parameters).
        ``init={"m": ..., "log_s": ...}`` or ``m ~ N(0, 1)``, ``log_s = 0`` from ``seed``.
    lr: Adam step size; ``None`` means 0.3 for "categorical" (the logits of unlikely
    values must travel far) and 0.05 for "gaussian".
    The ELBO is computed exactly (a sum over the ``K`` values), so the ascent is
    deterministic; the returned history records ELBO and KL every ``record_every`` steps.
    """
    if family not in FAMILIES:
        raise ValueError(f"family: must be one of {FAMILIES}, got {family!r}")
    if steps < 0:
        raise ValueError(f"steps: must be >= 0, got {steps}")
    if lr is None:
        lr = 0.3 if family == "categorical" else 0.05
    if not lr > 0:
        raise ValueError(f"lr: must be > 0, got {lr}")
    x = _check_x(x)
    gen = torch.Generator().manual_seed(seed)
    init = dict(init or {})
    if family == "categorical":
        logits0 = init.get("logits")
        if logits0 is None:
            logits0 = torch.randn(model.K, generator=gen, dtype=torch.float64)
        logits = torch.tensor(np.asarray(logits0, dtype=np.float64), requires_grad=True)
        if logits.shape != (model.K,):
            raise ValueError(f"init: logits must have shape ({model.K},), got {tuple(logits.shape)}")
        params = {"logits": logits}

        def log_q():
            return torch.log_softmax(params["logits"], dim=0)
    else:
        m0 = init.get("m", float(torch.randn(1, generator=gen, dtype=torch.float64)))
        s0 = init.get("log_s", 0.0)
        params = {"m": torch.tensor(float(m0), dtype=torch.float64, requires_grad=True),
                  "log_s": torch.tensor(float(s0), dtype=torch.float64, requires_grad=True)}
        zt = torch.as_tensor(model.z, dtype=torch.float64)

        def log_q():
            return torch.log_softmax(-0.5 * ((zt - params["m"]) / torch.exp(params["log_s"])) ** 2, dim=0)

    log_joint = torch.as_tensor(model.log_joint(x), dtype=torch.float64)
    log_px = log_evidence(model, x)
    opt = torch.optim.Adam(list(params.values()), lr=lr)
    hist: dict = {"step": [], "elbo": [], "kl": [], "gap": []}

    def current_q() -> np.ndarray:
        with torch.no_grad():
            return log_q().exp().numpy().copy()

    def record(t: int) -> None:
        q = current_q()
        e = elbo(q, model, x)
        hist["step"].append(t)
        hist["elbo"].append(e)
        hist["kl"].append(kl_to_posterior(q, model, x))
        hist["gap"].append(log_px - e)

    record(0)
    for t in tqdm(range(1, steps + 1), disable=not progress, desc=f"ELBO ({family})"):
        lq = log_q()
        loss = kl_from_log_probs(lq, log_joint)  # -ELBO = sum_z q (log q - log p(x, z)), exact
        opt.zero_grad()
        loss.backward()
        opt.step()
        if t % record_every == 0 or t == steps:
            record(t)
    final = {k: v.detach().numpy().copy() if v.ndim else float(v.detach()) for k, v in params.items()}
    return ElboFit(q=current_q(), params=final, history=hist, log_evidence=log_px)
