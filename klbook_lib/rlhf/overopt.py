"""Reward-model over-optimisation: best-of-n, its KL, and the scaling-law fits of Gao et al.

Gao, Schulman and Hilton (2022) optimise a policy against a *proxy* reward model trained
on labels from a *gold* reward, and plot the gold score against the distance
``d = sqrt(KL(pi || pi_init))`` travelled from the initial policy. Their fitted forms are

    best-of-n:  R_bon(d) = d (alpha_bon - beta_bon d)
    RL:         R_RL(d)  = d (alpha_RL - beta_RL log d)

with ``R(0) = 0`` (scores measured relative to the initial policy). In this book the gold
reward is the corpus's hidden ``true_reward`` and the proxies are Bradley-Terry reward
models trained on fewer or more labelled pairs.

Best of n
---------
``bon_kl_bound(n)``                ``log n - (n - 1) / n``, the KL of best-of-n when no two
                                   samples tie (a continuous score); an upper bound otherwise
``bon_distribution(p, s, n)``      the exact best-of-n distribution on a discrete space, ties
                                   broken uniformly at random
``bon_kl(p, s, n)``                its exact ``KL(pi_bon || pi)``
``bon_weights(m, n)``              weights of the unbiased best-of-n estimator on ``m`` ranked samples
``bon_estimate(selector, values, ns)``  expected ``values`` of the best-of-n pick (by ``selector``)
                                   estimated from pools of ``m >= n`` samples

Fits
----
``fit_bon(d, r)``, ``fit_rl(d, r)``  least-squares fits of the two forms (linear in alpha, beta)

Proxy reward models and sample pools (cached next to the pipeline)
------------------------------------------------------------------
``train_proxy_reward_model(pipe, n_pairs, ...)``  a reward model trained on the first ``n_pairs``
                                   training pairs of the pipeline, cached by its settings
``sample_pool(pipe, prompts, m, ...)``  ``m`` responses from ``pi_ref`` per prompt, cached
``gold_reward_model(rm, tok, prompts)``  a drop-in "reward model" that scores the true reward
``rl_seed_histories(pipe, proxy, beta, steps, seeds)``  PPO runs against a proxy (or the gold) on many seeds in one process
                                   (:func:`klbook_lib.rlhf.seeds.train_seeds`), cached together
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..divergences import kl_from_log_probs
from .checks import check_seeds
from .pipeline import atomic_build, cache_dir_for, cached_json

__all__ = [
    "bon_kl_bound", "bon_distribution", "bon_kl", "bon_weights", "bon_estimate",
    "ScalingFit", "fit_bon", "fit_rl", "train_proxy_reward_model", "sample_pool",
    "gold_reward_model", "rl_seed_histories", "RL_KEYS",
]


# --------------------------------------------------------------------------- checks
def _check_n(n, name: str = "n") -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{name}: must be a positive integer, got {n!r}")
    return int(n)


def _check_rl_args(proxy, beta, steps) -> tuple:
    """``(proxy, beta, steps)`` of an RL run, checked: ``proxy`` "gold" or a pair count."""
    if proxy != "gold":
        proxy = _check_n(proxy, "proxy")
    beta = float(beta)
    if not beta >= 0:
        raise ValueError(f"beta: must be >= 0, got {beta}")
    return proxy, beta, _check_n(steps, "steps")


def _check_probs_scores(probs, scores) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probs, dtype=float)
    s = np.asarray(scores, dtype=float)
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"probs: expected a non-empty 1-d array, got shape {p.shape}")
    if s.shape != p.shape:
        raise ValueError(f"scores: shape {s.shape} does not match probs shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"probs: must be finite and non-negative, found {p[~(np.isfinite(p) & (p >= 0))][0]}")
    if not math.isclose(p.sum(), 1.0, rel_tol=0, abs_tol=1e-9):
        raise ValueError(f"probs: must sum to 1, got {p.sum()!r}")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores: must be finite")
    return p, s


# --------------------------------------------------------------------------- best of n
def bon_kl_bound(n) -> float:
    """``log n - (n - 1) / n``: the KL of best-of-n from the sampling policy without ties.

    Used by Gao et al. (2022) as the KL of best-of-n. It is exact when the selecting score
    is continuous (no two samples tie) and an upper bound on a discrete space, where big
    atoms and ties make the true KL smaller (Beirami et al. 2024): see :func:`bon_kl`.
    """
    n = _check_n(n)
    return math.log(n) - (n - 1) / n


def bon_distribution(probs, scores, n) -> np.ndarray:
    """The distribution of the best of ``n`` i.i.d. draws from ``probs``, ranked by ``scores``.

    Ties (outcomes with equal scores, or one outcome drawn twice) are broken uniformly at
    random among the tied draws. With ``F(s) = P(score <= s)`` and ``F(s-) = P(score < s)``,
    an outcome ``y`` with score ``s`` is picked with probability
    ``p(y) * (F(s)**n - F(s-)**n) / (F(s) - F(s-))``.
    """
    p, s = _check_probs_scores(probs, scores)
    n = _check_n(n)
    out = np.zeros_like(p)
    for value in np.unique(s):
        tied = s == value
        group = p[tied].sum()
        if group == 0:
            continue
        below = p[s < value].sum()
        upto = below + group
        out[tied] = p[tied] * (upto**n - below**n) / group
    return out


def bon_kl(probs, scores, n) -> float:
    """Exact ``KL(pi_bon || pi)`` of best-of-``n`` on a discrete space (nats)."""
    p, _ = _check_probs_scores(probs, scores)
    q = bon_distribution(probs, scores, n)
    with np.errstate(divide="ignore"):
        return float(kl_from_log_probs(np.log(q), np.log(p)))


def bon_weights(m, n) -> np.ndarray:
    """Weights ``w_i = C(i - 1, n - 1) / C(m, n)``, ``i = 1..m``, of the samples ranked in ascending order.

    Among all ``C(m, n)`` subsets of size ``n`` of ``m`` ranked samples, a fraction ``w_i``
    has the ``i``-th smallest as its maximum. Averaging a value with these weights gives
    the mean over all subsets of the value of each subset's best element: an unbiased
    estimate of the best-of-``n`` expectation from one pool of ``m`` i.i.d. samples (a
    U-statistic: every subset of i.i.d. samples is itself an i.i.d. sample of size ``n``).
    Computed in log space.
    """
    m, n = _check_n(m, "m"), _check_n(n)
    if n > m:
        raise ValueError(f"n: must be at most m={m}, got {n}")
    i = np.arange(1, m + 1)
    w = np.zeros(m)
    ok = i >= n
    lg = math.lgamma
    log_c = np.array([lg(k) - lg(n) - lg(k - n + 1) for k in i[ok]])      # log C(i-1, n-1)
    log_total = lg(m + 1) - lg(n + 1) - lg(m - n + 1)                    # log C(m, n)
    w[ok] = np.exp(log_c - log_total)
    return w / w.sum()


def bon_estimate(selector, values, ns: Sequence[int]) -> np.ndarray:
    """Unbiased estimates of ``E[values of the best-of-n pick]`` for every ``n`` in ``ns``.

    ``selector`` and ``values`` are ``[m]`` (one pool) or ``[P, m]`` (one pool of ``m``
    samples per prompt); the pick of a subset is its element with the largest ``selector``
    (ties broken by a stable sort, which matters only when tied samples have different
    ``values``). Returns ``[len(ns)]`` for one pool, else ``[P, len(ns)]``.
    """
    sel = np.asarray(selector, dtype=float)
    val = np.asarray(values, dtype=float)
    if sel.shape != val.shape:
        raise ValueError(f"values: shape {val.shape} does not match selector shape {sel.shape}")
    if sel.ndim not in (1, 2) or sel.shape[-1] == 0:
        raise ValueError(f"selector: expected shape [m] or [P, m], got {sel.shape}")
    if not (np.all(np.isfinite(sel)) and np.all(np.isfinite(val))):
        raise ValueError("selector and values: must be finite")
    single = sel.ndim == 1
    sel2, val2 = np.atleast_2d(sel), np.atleast_2d(val)
    m = sel2.shape[1]
    order = np.argsort(sel2, axis=1, kind="stable")
    ranked = np.take_along_axis(val2, order, axis=1)
    ns = [_check_n(n, "ns") for n in ns]
    W = np.stack([bon_weights(m, n) for n in ns], axis=1)               # [m, len(ns)]
    out = ranked @ W
    return out[0] if single else out


# --------------------------------------------------------------------------- fits
@dataclass(frozen=True)
class ScalingFit:
    """A least-squares fit of ``R(d) = d (alpha - beta g(d))`` with ``g(d) = d`` (BoN) or ``log d`` (RL)."""

    form: str            # "bon" or "rl"
    alpha: float
    beta: float
    rmse: float
    n_points: int

    def predict(self, d) -> np.ndarray:
        d = np.asarray(d, dtype=float)
        return d * (self.alpha - self.beta * _g(self.form, d))

    def peak(self) -> tuple[float, float]:
        """``(d*, R(d*))`` of the fitted curve's maximum (``inf`` when beta <= 0: no turnover)."""
        if self.beta <= 0:
            return math.inf, math.inf
        if self.form == "bon":
            d = self.alpha / (2 * self.beta)
        else:
            d = math.exp(self.alpha / self.beta - 1)
        return d, float(self.predict(d))


def _g(form: str, d: np.ndarray) -> np.ndarray:
    if form == "bon":
        return d
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d > 0, np.log(np.where(d > 0, d, 1.0)), 0.0)   # d log d -> 0 at d = 0


def _fit(form: str, d, r, weights=None) -> ScalingFit:
    d = np.asarray(d, dtype=float).ravel()
    r = np.asarray(r, dtype=float).ravel()
    if d.shape != r.shape:
        raise ValueError(f"r: {r.size} values for {d.size} distances d")
    if d.size < 2:
        raise ValueError(f"d: need at least 2 points to fit alpha and beta, got {d.size}")
    if not (np.all(np.isfinite(d)) and np.all(np.isfinite(r))):
        raise ValueError("d and r: must be finite")
    if np.any(d < 0):
        raise ValueError(f"d: distances sqrt(KL) must be >= 0, found {d[d < 0][0]}")
    X = np.stack([d, -d * _g(form, d)], axis=1)
    w = np.ones_like(d) if weights is None else np.asarray(weights, dtype=float).ravel()
    if w.shape != d.shape or np.any(w < 0):
        raise ValueError("weights: must be non-negative, one per point")
    sw = np.sqrt(w)
    coef, *_ = np.linalg.lstsq(X * sw[:, None], r * sw, rcond=None)
    resid = r - X @ coef
    return ScalingFit(form, float(coef[0]), float(coef[1]),
                      float(np.sqrt(np.average(resid**2, weights=w))), int(d.size))


def fit_bon(d, r, weights=None) -> ScalingFit:
    """Fit ``r = d (alpha - beta d)`` (Gao et al.'s best-of-n form) by weighted least squares."""
    return _fit("bon", d, r, weights)


def fit_rl(d, r, weights=None) -> ScalingFit:
    """Fit ``r = d (alpha - beta log d)`` (Gao et al.'s RL form) by weighted least squares."""
    return _fit("rl", d, r, weights)


# --------------------------------------------------------------------------- proxies and pools
def train_proxy_reward_model(pipe, n_pairs: int, steps: int | None = None, batch_size: int | None = None,
                             lr: float | None = None, seed: int = 0, progress: bool = False):
    """A proxy reward model trained on the first ``n_pairs`` of ``pipe.train_pairs``; cached.

    The backbone starts from the SFT model, as the pipeline's own reward model does, and
    the steps, batch size and learning rate default to the pipeline's settings, so proxies
    differ only in how many labelled pairs they saw (several epochs over a small set).
    Returns ``(reward_model, info)``; ``info`` has ``n_pairs``, ``heldout_accuracy`` (on the
    pipeline's held-out pairs) and ``seconds``. Asked for all the training pairs with the
    pipeline's own settings and seed, the proxy *is* the pipeline's reward model: a copy of
    it is returned without training it again (``info["pipeline_reward_model"]``).
    """
    from . import pipeline as P
    from .models import ScalarHeadModel
    from .reward_model import pairwise_accuracy, train_reward_model

    n_pairs = _check_n(n_pairs, "n_pairs")
    if n_pairs > len(pipe.train_pairs):
        raise ValueError(f"n_pairs: the pipeline has {len(pipe.train_pairs)} training pairs, asked for {n_pairs}")
    s = P.SETTINGS[pipe.preset]
    steps = s["rm_steps"] if steps is None else _check_n(steps, "steps")
    batch_size = s["rm_batch"] if batch_size is None else _check_n(batch_size, "batch_size")
    lr = s["rm_lr"] if lr is None else float(lr)
    if not lr > 0:
        raise ValueError(f"lr: must be positive, got {lr}")
    settings = dict(n_pairs=n_pairs, steps=steps, batch_size=batch_size, lr=lr, seed=int(seed))
    if (n_pairs == len(pipe.train_pairs) and (steps, batch_size, lr) == (s["rm_steps"], s["rm_batch"], s["rm_lr"])
            and int(seed) == pipe.seed and pipe.init_from is None):
        # exactly the pipeline's own reward model (same data, settings, start and seed): no retraining
        rm = copy.deepcopy(pipe.reward_model).eval()
        for p in rm.parameters():
            p.requires_grad_(False)
        return rm, {**settings, "heldout_accuracy": float(pipe.metrics["rm_heldout_accuracy"]), "seconds": 0.0,
                    "pipeline_reward_model": True}
    here = Path(P.__file__).parent
    final = cache_dir_for("proxy-rm", pipe, settings, [here / "reward_model.py", __file__])

    def build(tmp: Path) -> None:
        import time
        t0 = time.time()
        rm, hist = train_reward_model(pipe.sft_model, pipe.tokenizer, pipe.train_pairs[:n_pairs], None,
                                      steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                                      device=pipe.device, progress=progress)
        acc = pairwise_accuracy(rm, pipe.tokenizer, pipe.heldout_pairs)
        rm.to("cpu").save(tmp / "reward_model")
        info = {**settings, "heldout_accuracy": acc, "seconds": time.time() - t0,
                "final_loss": float(np.mean([h["loss"] for h in hist[-10:]]))}
        (tmp / "meta.json").write_text(json.dumps(info))

    atomic_build(final, build)
    info = json.loads((final / "meta.json").read_text())
    rm = ScalarHeadModel.load(final / "reward_model", device=pipe.device)
    for p in rm.parameters():
        p.requires_grad_(False)
    return rm, info


def sample_pool(pipe, prompts: Sequence[str], m: int, seed: int = 0, max_new_tokens: int = 16,
                batch_size: int = 512, policy=None) -> list[list[str]]:
    """``m`` responses of ``pi_ref`` (or ``policy``) to every prompt: ``[len(prompts)][m]`` strings.

    Sampled by hand from the full softmax (:func:`klbook_lib.rlhf.ppo.sample_responses`).
    Pools of ``pi_ref`` are cached next to the pipeline; a given ``policy`` is never cached.
    """
    from . import ppo

    m = _check_n(m, "m")
    prompts = list(prompts)
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts: need a non-empty sequence of strings")

    def compute() -> dict:
        flat = [p for p in prompts for _ in range(m)]
        gen = torch.Generator().manual_seed(seed)
        model = pipe.ref_model if policy is None else policy
        out: list[str] = []
        for i in range(0, len(flat), batch_size):
            ro = ppo.sample_responses(model, pipe.tokenizer, flat[i:i + batch_size], max_new_tokens, 1.0, gen)
            out += ro.responses
        return {"responses": [out[k * m:(k + 1) * m] for k in range(len(prompts))]}

    if policy is not None:
        return compute()["responses"]
    settings = dict(prompts=prompts, m=m, seed=int(seed), max_new_tokens=int(max_new_tokens),
                    batch_size=int(batch_size))
    here = Path(ppo.__file__).parent
    return cached_json("pool", pipe, settings, compute, [here / "ppo.py", __file__])["responses"]



def gold_reward_model(reward_model, tokenizer, prompts: Sequence[str]):
    """A drop-in reward model whose ``score`` is the hidden true reward (the gold reward itself).

    For the control run of the over-optimisation chapter: PPO optimising the gold reward
    directly. ``score(input_ids, attention_mask)`` decodes each row, removes the longest of
    ``prompts`` it starts with and returns :func:`klbook_lib.rlhf.data.true_reward` of the
    rest. The network (``forward``) is a copy of ``reward_model``'s, so the PPO value model,
    which starts as a copy of the reward model, starts where it does in the proxy runs.
    """
    from . import data as D
    from .models import ScalarHeadModel

    prompts = sorted(set(prompts), key=len, reverse=True)
    if not prompts:
        raise ValueError("prompts: need at least one prompt")

    class GoldScorer(ScalarHeadModel):
        def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            out = []
            for ids, m in zip(input_ids.tolist(), attention_mask.tolist()):
                text = tokenizer.decode([t for t, k in zip(ids, m) if k], skip_special_tokens=True)
                prompt = next((p for p in prompts if text.startswith(p)), None)
                if prompt is None:
                    raise ValueError(f"input_ids: a row does not start with any known prompt: {text[:40]!r}")
                out.append(D.true_reward(text[len(prompt):]))
            return torch.tensor(out, dtype=torch.float32, device=input_ids.device)

    gold = GoldScorer(reward_model.config)
    gold.load_state_dict(reward_model.state_dict())
    gold.to(next(reward_model.parameters()).device).eval()
    for p in gold.parameters():
        p.requires_grad_(False)
    return gold


RL_KEYS = ("kl_exact_seq", "kl_exact_seq_se", "score", "score_se", "true_reward", "true_reward_se",
           "response_length", "distinct_fraction", "entropy_token", "eos_fraction")


def _proxy_model(pipe, proxy):
    if proxy == "gold":
        return gold_reward_model(pipe.reward_model, pipe.tokenizer, pipe.prompts)
    rm, _ = train_proxy_reward_model(pipe, proxy)
    return rm


def rl_seed_histories(pipe, proxy, beta: float, steps: int, seeds: Sequence[int], config=None) -> list[dict]:
    """PPO-RLHF against a proxy (or ``"gold"``) on every seed of ``seeds``; cached as one entry.

    The runs are PPO-RLHF (:func:`klbook_lib.rlhf.ppo.run_rlhf`; policy a copy of ``pi_ref``, value model a copy
    of the reward model, fixed ``beta``), trained by :func:`klbook_lib.rlhf.seeds.train_seeds`
    with every speed-up on (sampler KV cache, ``log pi_old`` from the sampler, fused GELU),
    which gives each seed the run it would have alone. Returns one dict of lists per seed,
    with the keys of :data:`RL_KEYS`, in the order of ``seeds``.
    """
    import dataclasses

    from . import ppo
    from .seeds import train_seeds

    proxy, beta, steps = _check_rl_args(proxy, beta, steps)
    seeds = check_seeds(seeds)
    cfg = config or ppo.PPOConfig()
    if cfg.reward_fn is not None or cfg.advantage_fn is not None:
        raise ValueError("config: pluggable reward_fn/advantage_fn runs are not cached; call seeds.train_seeds")
    settings = dict(proxy=proxy, beta=beta, steps=steps, seeds=seeds,
                    config={k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("reward_fn", "advantage_fn")})
    here = Path(ppo.__file__).parent

    def compute() -> dict:
        run_pipe = dataclasses.replace(pipe, reward_model=_proxy_model(pipe, proxy))
        hists = train_seeds(run_pipe, seeds, beta=beta, steps=steps, config=cfg, fast=True)
        return {"runs": [{k: [float(it[k]) for it in h] for k in RL_KEYS} for h in hists]}

    code = [here / "ppo.py", here / "rewards.py", here / "reward_model.py", here / "seeds.py", __file__]
    return cached_json("rl-seeds", pipe, settings, compute, code)["runs"]
