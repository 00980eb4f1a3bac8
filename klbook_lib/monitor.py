"""Per-update KL statistics for a PPO training dashboard.

After every PPO update we compare the policy that collected the batch, ``pi_old``, with
the updated policy ``pi_theta`` on the batch's states ``s_i`` and sampled actions ``a_i``:

* the exact ``KL(pi_old(.|s_i) || pi_theta(.|s_i))`` per state, from the closed forms for
  categorical and diagonal-Gaussian policies (:func:`klbook_lib.divergences.kl_from_logits`,
  :func:`klbook_lib.divergences.gaussian_kl` with ``reduce="sum"``);
* the sample estimates from the log-ratio ``log r_i = log pi_theta(a_i|s_i) - log pi_old(a_i|s_i)``
  with ``a_i ~ pi_old``: ``k1 = -log r`` and ``k3 = (r - 1) - log r``
  (:func:`klbook_lib.estimators.k1_from_log_ratio`, :func:`klbook_lib.estimators.k3_from_log_ratio`);
  both are unbiased for ``KL(pi_old || pi_theta)``, k3 is never negative;
* mean / max / p90 / p99 over states (:func:`summarize`), an exponential moving average of
  the mean KL (:class:`EMA`), the clip fraction (:func:`clip_fraction`) and the ratio of
  the gradient norms of the KL-penalty term and the policy-gradient term
  (:func:`grad_norm_ratio`).

:class:`KLMonitor` bundles these into one dict per update (the keys of
``klbook_lib.ppo.train``'s history).

Beyond the update's KL: :func:`kl_to_uniform` and :func:`exploration_stats` (the KL of the
policy to the uniform policy, ``log|A| - H``, per state: an exploration gauge), and
:func:`batch_mean` / :func:`per_env_summary` (averaging a per-state quantity over a ``(T, N)``
batch of parallel copies per sample or per episode, and breaking it down per copy).
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch

from .estimators import k1_from_log_ratio, k3_from_log_ratio

__all__ = [
    "summarize", "EMA", "clip_fraction",
    "grad_norm_ratio", "KLMonitor", "kl_to_uniform", "exploration_stats", "episode_segments",
    "batch_mean", "per_env_summary",
]

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
    """Exponential moving average ``m <- decay * m + (1 - decay) * x``; the first value initialises ``m``.

    The weight of the new value is ``alpha = 1 - decay``; the average covers roughly the last
    ``1 / (1 - decay)`` values (its time constant): decay 0.9 averages over about 10 updates,
    and lags a change by about as many.
    """

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

    Averaging convention: every statistic is taken over the batch's *samples* (states), each
    weighing ``1 / (T * N)`` whatever environment copy or episode it came from; the mean is
    ``batch_mean(kl, done, by="sample")``, not the per-episode-then-batch average
    (``by="episode"``), which gives a short episode as much weight as a long one.
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
        rows = torch.stack([exact_kl, k1_from_log_ratio(logratio), k3_from_log_ratio(logratio)]).detach().to(torch.float64)
        q = torch.quantile(rows, torch.tensor([0.9, 0.99], dtype=torch.float64, device=rows.device), dim=1)
        table = torch.stack([rows.mean(1), rows.amax(1), q[0], q[1]], 1).tolist()
        out = {}
        for name, (mean, mx, p90, p99) in zip(("kl_exact", "k1", "k3"), table):
            out.update({f"{name}_mean": mean, f"{name}_max": mx, f"{name}_p90": p90, f"{name}_p99": p99})
        out["kl_ema"] = self.ema.update(out["kl_exact_mean"])
        return out


# =====================================================================================
# KL to the uniform policy: an exploration gauge
# =====================================================================================

def kl_to_uniform(logits: torch.Tensor) -> torch.Tensor:
    """``KL(pi(.|s) || uniform) = log|A| - H(pi(.|s))`` per row of a categorical policy's logits.

    0 for the uniform policy, ``log|A|`` (its maximum) for a deterministic one. Computed as
    ``sum_a pi(a) log pi(a) + log|A|`` with ``0 log 0 = 0``; returns the batch shape.
    """
    if logits.ndim < 1 or logits.shape[-1] < 2:
        raise ValueError(f"logits: need at least 2 actions in the last dimension, got shape {tuple(logits.shape)}")
    logp = torch.log_softmax(logits, -1)
    p = logp.exp()
    neg_entropy = torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)
    return (neg_entropy + math.log(logits.shape[-1])).clamp(min=0.0)


def exploration_stats(logits: torch.Tensor, near_deterministic: float = 0.9) -> dict[str, float]:
    """Per-state statistics of ``KL(pi(.|s) || uniform)`` over a batch of states (rows of ``logits``).

    Returns ``kl_uniform_{mean, min, p10, p50, p90, max}`` (linear-interpolated quantiles)
    and ``frac_near_deterministic``: the share of states whose KL exceeds
    ``near_deterministic * log|A|``. The mean alone hides states where the policy has
    already stopped exploring (or never started).
    """
    if not 0.0 < near_deterministic < 1.0:
        raise ValueError(f"near_deterministic: must lie in (0, 1), got {near_deterministic}")
    kl = kl_to_uniform(logits).detach().reshape(-1).to(torch.float64)
    if kl.numel() == 0:
        raise ValueError("logits: no states to summarise")
    qs = torch.quantile(kl, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64, device=kl.device)).tolist()
    limit = near_deterministic * math.log(logits.shape[-1])
    return {"kl_uniform_mean": kl.mean().item(), "kl_uniform_min": kl.min().item(),
            "kl_uniform_p10": qs[0], "kl_uniform_p50": qs[1], "kl_uniform_p90": qs[2],
            "kl_uniform_max": kl.max().item(),
            "frac_near_deterministic": (kl > limit).double().mean().item()}


# =====================================================================================
# Averaging over parallel environments: per sample or per episode
# =====================================================================================

def _check_time_env(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty (T, N) tensor (time x environment copy), "
                         f"got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")


def episode_segments(done: torch.Tensor) -> torch.Tensor:
    """Number the episode fragments of a rollout batch.

    ``done[t, n]`` is True where the episode of copy ``n`` ended at step ``t`` (terminated or
    truncated; the next sample of that copy starts a new episode). Returns a ``(T, N)`` long
    tensor: the id of the fragment each sample belongs to, ``0 .. K-1``, numbered copy by
    copy. A fragment is an episode's part inside the batch: it starts at ``t = 0`` or after
    a ``done`` and ends at a ``done`` or at ``t = T - 1``.
    """
    _check_time_env("done", done)
    d = done.to(torch.bool)
    # a new fragment starts at t = 0 and after every done (except after the last step)
    starts = torch.zeros_like(d)
    starts[0] = True
    starts[1:] = d[:-1]
    order = starts.t().reshape(-1).long()                    # copy-major order
    ids = torch.cumsum(order, 0) - 1
    return ids.reshape(d.shape[1], d.shape[0]).t().contiguous()


def batch_mean(values: torch.Tensor, done: torch.Tensor, by: str = "sample") -> float:
    """Average a per-sample quantity (e.g. the per-state KL) over a ``(T, N)`` rollout batch.

    ``by="sample"``: the mean over all ``T * N`` samples (the convention of
    :class:`KLMonitor`). ``by="episode"``: first the mean within every episode fragment
    (:func:`episode_segments`), then the unweighted mean of those fragment means; a fragment of
    one step then counts as much as one of ``T`` steps, so the result depends on where the
    episodes of the parallel copies happen to end.
    """
    _check_time_env("values", values)
    if done.shape != values.shape:
        raise ValueError(f"done: shape {tuple(done.shape)} differs from values shape {tuple(values.shape)}")
    v = values.detach().to(torch.float64)
    if by == "sample":
        return v.mean().item()
    if by != "episode":
        raise ValueError(f"by: must be 'sample' or 'episode', got {by!r}")
    seg = episode_segments(done).reshape(-1)
    k = int(seg.max().item()) + 1
    sums = torch.zeros(k, dtype=torch.float64, device=v.device).index_add_(0, seg, v.reshape(-1))
    counts = torch.zeros(k, dtype=torch.float64, device=v.device).index_add_(
        0, seg, torch.ones_like(v.reshape(-1)))
    return (sums / counts).mean().item()


def per_env_summary(values: torch.Tensor, done: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per environment copy: the mean and maximum of a per-sample quantity over a ``(T, N)`` batch.

    Returns tensors of length ``N``: ``mean``, ``max`` and, when ``done`` is given,
    ``episodes_finished`` (how many episodes of that copy ended in the batch). Record the
    source copy of every sample when the buffer is assembled and this breakdown shows
    whether one copy (or a group of copies) moves the batch KL.
    """
    _check_time_env("values", values)
    v = values.detach().to(torch.float64)
    out = {"mean": v.mean(0), "max": v.amax(0)}
    if done is not None:
        if done.shape != values.shape:
            raise ValueError(f"done: shape {tuple(done.shape)} differs from values shape {tuple(values.shape)}")
        out["episodes_finished"] = done.to(torch.long).sum(0)
    return out
