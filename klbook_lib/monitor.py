"""Per-update KL statistics for a PPO training dashboard.

After every PPO update we compare the policy that collected the batch, ``pi_old``, with
the updated policy ``pi_theta`` on the batch's states ``s_i`` and sampled actions ``a_i``:

* the exact ``KL(pi_old(.|s_i) || pi_theta(.|s_i))`` per state, from the closed forms for
  categorical and diagonal-Gaussian policies (:func:`categorical_kl`, :func:`gaussian_kl`);
* the sample estimates from the log-ratio ``log r_i = log pi_theta(a_i|s_i) - log pi_old(a_i|s_i)``
  with ``a_i ~ pi_old``: ``k1 = -log r`` and ``k3 = (r - 1) - log r`` (:func:`k1`, :func:`k3`);
  both are unbiased for ``KL(pi_old || pi_theta)``, k3 is never negative;
* mean / max / p90 / p99 over states (:func:`summarize`), an exponential moving average of
  the mean KL (:class:`EMA`), the clip fraction (:func:`clip_fraction`) and the ratio of
  the gradient norms of the KL-penalty term and the policy-gradient term
  (:func:`grad_norm_ratio`).

:class:`KLMonitor` bundles these into one dict per update (the keys of
``klbook_lib.ppo.train``'s history).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch

__all__ = [
    "categorical_kl", "gaussian_kl", "k1", "k3", "summarize", "EMA", "clip_fraction",
    "grad_norm_ratio", "KLMonitor",
]

_REDUCES = ("sum", "mean")


def categorical_kl(old_logits: torch.Tensor, new_logits: torch.Tensor) -> torch.Tensor:
    """Exact ``KL(pi_old || pi_new)`` per row for categorical distributions given by logits.

    ``sum_a pi_old(a) (log pi_old(a) - log pi_new(a))`` over the last dimension.
    Logits need not be normalised. Returns a tensor with the batch shape.
    """
    if old_logits.shape != new_logits.shape:
        raise ValueError(f"new_logits: shape {tuple(new_logits.shape)} differs from old_logits "
                         f"shape {tuple(old_logits.shape)}")
    logp = torch.log_softmax(old_logits, -1)
    logq = torch.log_softmax(new_logits, -1)
    p = logp.exp()
    # terms with p = 0 contribute 0 (0 log 0 = 0), even where logq = -inf
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
    return terms.sum(-1)


def gaussian_kl(mu_old: torch.Tensor, std_old: torch.Tensor, mu_new: torch.Tensor,
                std_new: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
    """Exact ``KL(N(mu_old, std_old^2) || N(mu_new, std_new^2))`` for diagonal Gaussians.

    Per action dimension ``log(s_new/s_old) + (s_old^2 + (mu_old - mu_new)^2) / (2 s_new^2) - 1/2``;
    ``reduce="sum"`` over the last (action) dimension gives the KL of the joint
    distribution. ``reduce="mean"`` divides it by the number of action dimensions: that is
    *not* a KL of the policy, it exists to reproduce a common bug.
    """
    if reduce not in _REDUCES:
        raise ValueError(f"reduce: must be one of {_REDUCES}, got {reduce!r}")
    if (std_old <= 0).any() or (std_new <= 0).any():
        raise ValueError("std_old, std_new: standard deviations must be positive")
    per_dim = (torch.log(std_new / std_old)
               + (std_old ** 2 + (mu_old - mu_new) ** 2) / (2 * std_new ** 2) - 0.5)
    return per_dim.sum(-1) if reduce == "sum" else per_dim.mean(-1)


def k1(logratio: torch.Tensor) -> torch.Tensor:
    """``k1 = -log r`` per sample, with ``log r = log pi_new(a) - log pi_old(a)``, ``a ~ pi_old``."""
    return -logratio


def k3(logratio: torch.Tensor) -> torch.Tensor:
    """``k3 = (r - 1) - log r`` per sample; non-negative, unbiased for ``KL(pi_old || pi_new)``."""
    return torch.expm1(logratio) - logratio


def summarize(values: torch.Tensor, prefix: str) -> dict[str, float]:
    """``{prefix_mean, prefix_max, prefix_p90, prefix_p99}`` of a 1-d tensor (linear-interpolated quantiles)."""
    v = values.detach().reshape(-1).to(torch.float64)
    if v.numel() == 0:
        raise ValueError("values: cannot summarise an empty tensor")
    q = torch.quantile(v, torch.tensor([0.9, 0.99], dtype=torch.float64, device=v.device))
    out = torch.stack([v.mean(), v.max(), q[0], q[1]]).tolist()
    return {f"{prefix}_mean": out[0], f"{prefix}_max": out[1],
            f"{prefix}_p90": out[2], f"{prefix}_p99": out[3]}


class EMA:
    """Exponential moving average ``m <- decay * m + (1 - decay) * x``; the first value initialises ``m``."""

    def __init__(self, decay: float = 0.9):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay: must be in [0, 1), got {decay}")
        self.decay = decay
        self.value: float | None = None

    def update(self, x: float) -> float:
        x = float(x)
        if not math.isfinite(x):
            raise ValueError(f"x: EMA input must be finite, got {x}")
        self.value = x if self.value is None else self.decay * self.value + (1 - self.decay) * x
        return self.value


def clip_fraction(ratio: torch.Tensor, clip: float) -> float:
    """Fraction of samples with ``|r - 1| > clip`` (where the clipped surrogate is flat)."""
    if clip < 0:
        raise ValueError(f"clip: must be non-negative, got {clip}")
    return ((ratio - 1.0).abs() > clip).float().mean().item()


def _flat_grad_norm(loss: torch.Tensor, params: Sequence[torch.Tensor]) -> float:
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    sq = [g.pow(2).sum() for g in grads if g is not None]
    return math.sqrt(float(torch.stack(sq).sum())) if sq else 0.0


def grad_norm_ratio(penalty_loss: torch.Tensor, pg_loss: torch.Tensor,
                    params: Iterable[torch.Tensor]) -> float:
    """``||grad penalty_loss|| / ||grad pg_loss||`` over ``params`` (graphs are retained).

    How strongly the KL penalty pulls compared with the policy gradient: near 0 the penalty
    is idle, above 1 it dominates the update. Returns ``inf`` when the policy gradient is 0
    and the penalty's is not, ``0`` when both are 0.
    """
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("params: no parameter requires a gradient")
    num = _flat_grad_norm(penalty_loss, params)
    den = _flat_grad_norm(pg_loss, params)
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


class KLMonitor:
    """Collects the per-update statistics described in the module docstring.

    ``record(...)`` returns one flat dict; ``kl_ema`` is carried across updates.
    """

    def __init__(self, ema_decay: float = 0.9):
        self.ema = EMA(ema_decay)

    def record(self, exact_kl: torch.Tensor, logratio: torch.Tensor) -> dict[str, float]:
        """Statistics of a batch: exact KL per state and log-ratios of the sampled actions.

        ``exact_kl[i] = KL(pi_old(.|s_i) || pi_new(.|s_i))``;
        ``logratio[i] = log pi_new(a_i|s_i) - log pi_old(a_i|s_i)``.
        """
        if exact_kl.shape != logratio.shape:
            raise ValueError(f"logratio: shape {tuple(logratio.shape)} differs from exact_kl "
                             f"shape {tuple(exact_kl.shape)}")
        # the three summaries of summarize(), computed together (one quantile call)
        rows = torch.stack([exact_kl, k1(logratio), k3(logratio)]).detach().to(torch.float64)
        q = torch.quantile(rows, torch.tensor([0.9, 0.99], dtype=torch.float64, device=rows.device), dim=1)
        table = torch.stack([rows.mean(1), rows.amax(1), q[0], q[1]], 1).tolist()
        out = {}
        for name, (mean, mx, p90, p99) in zip(("kl_exact", "k1", "k3"), table):
            out.update({f"{name}_mean": mean, f"{name}_max": mx, f"{name}_p90": p90, f"{name}_p99": p99})
        out["kl_ema"] = self.ema.update(out["kl_exact_mean"])
        return out
