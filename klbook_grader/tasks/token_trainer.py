"""Exercise 5's "broken trainer": a toy token-level RLHF problem with exact answers.

The policy is a table of logits over the responses of a small autoregressive model
(:mod:`klbook_lib.seqkl`): a vocabulary of ``V = 4`` tokens, token ``0`` is EOS, at most
``T = 4`` tokens, so there are 121 responses of one to four tokens and 40 prefixes. Every
response has a fixed score (:func:`score_table`); the trainer maximises

    J(pi) = E_{y ~ pi}[score(y)] - BETA * KL(pi || pi_ref)

with PPO, sampling at temperature ``TEMPERATURE``: the policy with logits ``theta`` is
``softmax(theta / TEMPERATURE)`` at every prefix, and so is the reference. Because every
response can be listed, ``J``, the KL to the reference and the KL between two consecutive
policies are exact sums (:func:`evaluate_run`), and so is the best possible value
``J* = BETA * log E_ref[exp(score / BETA)]`` (:func:`optimum`).

The trainer itself (with its bugs) is in the exercise notebook; this module gives it the
problem (:func:`reference_logits`, :func:`sample`, :func:`scores`), the dashboard
(:func:`dashboard`) and the checks of a run (:func:`judge_trust_region`,
:func:`judge_objective`). A run is summarised by the snapshots of ``theta`` after every
update (an array ``[updates + 1, 40, 4]``, the first one before training) and the clip
fraction of every update, so the checks recompute everything from the parameters.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from klbook_lib import seqkl

V, T, EOS = 4, 4, 0
TEMPERATURE = 0.7
BETA = 0.3
REF_SEED, SCORE_SEED = 5, 6


@functools.lru_cache(maxsize=1)
def space() -> seqkl.SequenceSpace:
    """The 121 responses and 40 prefixes of the toy problem."""
    return seqkl.sequence_space(V, T, eos=EOS)


def reference_logits() -> torch.Tensor:
    """The reference policy's logits table ``[40, 4]`` (float64, a fresh copy)."""
    return seqkl.random_logits(space(), scale=1.5, seed=REF_SEED)


@functools.lru_cache(maxsize=1)
def _scores() -> torch.Tensor:
    g = torch.Generator().manual_seed(SCORE_SEED)
    return torch.randn(space().n_sequences, generator=g, dtype=torch.float64)


def score_table() -> torch.Tensor:
    """The score of each of the 121 responses (in the order of ``space().sequences``)."""
    return _scores().clone()


def _index(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    try:
        return space().index_of(tokens, mask)
    except ValueError:
        raise ValueError("tokens, mask: not responses of the toy problem") from None


def scores(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The score of each sampled response ``[B]`` (float64)."""
    return _scores()[_index(tokens, mask)]


def sample(theta: torch.Tensor, n: int, generator: torch.Generator) -> tuple:
    """``n`` responses from ``softmax(theta / TEMPERATURE)``: ``(tokens, rows, mask)``, each
    ``[n, T]``: the tokens (0 on pads), the row of ``theta`` (the prefix) before each token, and
    ``True`` on real tokens (responses are right-padded; EOS is a real token)."""
    sp = space()
    idx = seqkl.sample(sp, theta.detach().double() / TEMPERATURE, n, generator)
    return sp.sequences[idx].clone(), sp.prefix_index[idx].clone(), sp.mask[idx].clone()


def objective(theta: torch.Tensor) -> dict:
    """Exact ``E[score]``, ``KL(pi || pi_ref)`` and ``J`` of the policy with logits ``theta``."""
    sp = space()
    logits = torch.as_tensor(theta, dtype=torch.float64) / TEMPERATURE
    ref = reference_logits() / TEMPERATURE
    p = seqkl.sequence_logprobs(sp, logits).exp()
    reward = float(p @ _scores())
    kl = float(seqkl.exact_kl(sp, logits, ref))
    return {"reward": reward, "kl": kl, "J": reward - BETA * kl}


def optimum() -> dict:
    """The maximum of ``J``: ``pi*(y) ~ pi_ref(y) exp(score(y) / BETA)``, with its reward and KL."""
    sp = space()
    lref = seqkl.sequence_logprobs(sp, reference_logits() / TEMPERATURE)
    logw = lref + _scores() / BETA
    lse = torch.logsumexp(logw, 0)
    p = (logw - lse).exp()
    kl = float((p * (logw - lse - lref)).sum())
    reward = float(p @ _scores())
    return {"reward": reward, "kl": kl, "J": float(BETA * lse)}


def _snapshots(run) -> tuple[torch.Tensor, np.ndarray]:
    snaps = torch.as_tensor(np.asarray(run[0], dtype=np.float64))
    clip = np.asarray(run[1], dtype=np.float64).reshape(-1)
    sp = space()
    if snaps.ndim != 3 or tuple(snaps.shape[1:]) != (sp.n_prefixes, V) or len(snaps) < 2:
        raise ValueError(f"snapshots: expected an array [updates + 1, {sp.n_prefixes}, {V}], "
                         f"got shape {tuple(snaps.shape)}")
    if len(clip) != len(snaps) - 1:
        raise ValueError(f"clip fractions: expected {len(snaps) - 1} (one per update), got {len(clip)}")
    if not bool(torch.isfinite(snaps).all()) or not np.all(np.isfinite(clip)):
        raise ValueError("the run holds NaN or infinite values")
    return snaps, clip


def evaluate_run(run) -> dict:
    """Exact curves of a run ``[snapshots, clip fractions]``: per update ``J``, ``reward``, ``kl``
    (to the reference), ``update_kl`` (``KL(pi_old || pi_new)`` of that update) and ``clip_frac``."""
    snaps, clip = _snapshots(run)
    sp = space()
    rows = [objective(s) for s in snaps]
    upd = [float(seqkl.exact_kl(sp, a / TEMPERATURE, b / TEMPERATURE)) for a, b in zip(snaps[:-1], snaps[1:])]
    return {"J": np.array([r["J"] for r in rows]), "reward": np.array([r["reward"] for r in rows]),
            "kl": np.array([r["kl"] for r in rows]), "update_kl": np.array(upd), "clip_frac": clip}


def dashboard(run, title: str = "training run"):
    """A figure of the exact curves of a run: objective, KL to the reference, KL of each update
    and clip fraction. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt

    c = evaluate_run(run)
    best = optimum()
    fig, ax = plt.subplots(2, 2, figsize=(9, 5.5))
    ax[0, 0].plot(c["J"], label="J = reward - beta KL")
    ax[0, 0].plot(c["reward"], label="reward", alpha=0.7)
    ax[0, 0].axhline(best["J"], color="k", ls=":", label="best J")
    ax[0, 0].set_ylabel("objective (exact)")
    ax[0, 0].legend(fontsize=8, loc="lower right")
    ax[0, 1].plot(c["kl"])
    ax[0, 1].axhline(best["kl"], color="k", ls=":", label="KL of the best policy")
    ax[0, 1].set_ylabel("KL(pi || pi_ref) (nats)")
    ax[0, 1].legend(fontsize=8)
    ax[1, 0].semilogy(np.arange(1, len(c["update_kl"]) + 1), np.maximum(c["update_kl"], 1e-8))
    ax[1, 0].set_ylabel("KL(pi_old || pi_new) per update")
    ax[1, 1].plot(np.arange(1, len(c["clip_frac"]) + 1), c["clip_frac"])
    ax[1, 1].set_ylabel("clip fraction")
    for a in ax[1]:
        a.set_xlabel("update")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


#: Checks of a patched run. The fixed trainer's largest update KL is 0.12 to 0.26 and its last
#: five policies close 94 to 97 per cent of the gap to J* (ten seeds); each bug of the exercise
#: fails one of these checks or its own probe (the instructor's tests/grader/test_exercise_traps.py).
MAX_UPDATE_KL = 0.4
MIN_GAP_CLOSED = 0.85
LAST = 5


def fresh_batches(run) -> tuple[bool, str]:
    """Whether the updates of a run trained on fresh samples: some update after the first changed
    a row of ``theta`` (a prefix) that the first left alone. On-policy PPO samples a new batch from
    the current policy at every update, so over 30 updates it reaches prefixes the first batch
    missed; a run that reuses one batch changes only the rows that batch visits (a row without
    gradient stays put under Adam). A first update that changed every row cannot tell: it passes."""
    snaps, _ = _snapshots(run)
    moved = (snaps[1:] - snaps[:-1]).abs().amax(-1) > 0          # [updates, prefixes]
    first = moved[0]
    if bool(first.all()) or len(moved) < 2:
        return True, "fresh samples: cannot tell"
    if bool((moved[1:] & ~first).any()):
        return True, "fresh samples at every update"
    return False, (f"after the first update no update changed a prefix the first left alone "
                   f"({int(first.sum())} of {len(first)} prefixes): every update trained on the same "
                   "responses (on-policy PPO samples a fresh batch from the current policy at every update)")


def _gap_closed(c: dict) -> float:
    j0 = float(c["J"][0])
    return (float(np.mean(c["J"][-LAST:])) - j0) / (optimum()["J"] - j0)


def judge_trust_region(run) -> tuple[float, str]:
    """Credit 1 if every update's exact ``KL(pi_old || pi_new)`` is at most :data:`MAX_UPDATE_KL`,
    the clip fraction was positive on average but below one half (the clip acted), the run
    made progress (half of the gap to the best ``J`` closed: a run that never moves has tiny
    updates too) and its updates trained on fresh samples (:func:`fresh_batches`)."""
    try:
        c = evaluate_run(run)
    except (TypeError, ValueError, IndexError) as exc:
        return 0.0, f"not a training run [snapshots, clip fractions]: {exc}"
    worst, frac, closed = float(c["update_kl"].max()), float(c["clip_frac"].mean()), _gap_closed(c)
    fresh, why = fresh_batches(run)
    ok = worst <= MAX_UPDATE_KL and 0.0 < frac < 0.5 and closed >= 0.5 and fresh
    return float(ok), (f"largest KL of one update {worst:.3g} (needs <= {MAX_UPDATE_KL:g}), mean clip "
                       f"fraction {frac:.3f} (needs to lie strictly between 0 and 0.5), "
                       f"{closed:.0%} of the gap to the best J closed (needs 50%)"
                       + ("" if fresh else f"; {why}"))


def judge_objective(run) -> tuple[float, str]:
    """Credit 1 if the mean exact ``J`` of the last :data:`LAST` policies closes at least
    :data:`MIN_GAP_CLOSED` of the gap between the reference's ``J`` and the best ``J``, the
    run started from the reference policy and trained on fresh samples (:func:`fresh_batches`)."""
    try:
        c = evaluate_run(run)
    except (TypeError, ValueError, IndexError) as exc:
        return 0.0, f"not a training run [snapshots, clip fractions]: {exc}"
    j0, best = float(c["J"][0]), optimum()["J"]
    j_end = float(np.mean(c["J"][-LAST:]))
    closed = (j_end - j0) / (best - j0)
    start_ok = bool(np.allclose(np.asarray(run[0], dtype=np.float64)[0], reference_logits().numpy()))
    fresh, why = fresh_batches(run)
    ok = closed >= MIN_GAP_CLOSED and start_ok and fresh
    return float(ok), (f"mean J of the last {LAST} policies {j_end:.3f}: {closed:.0%} of the way from the "
                       f"reference's {j0:.3f} to the best {best:.3f} (needs {MIN_GAP_CLOSED:.0%}), exact KL "
                       f"to pi_ref at the end {c['kl'][-1]:.3f}"
                       + ("" if start_ok else "; the run did not start from the reference policy")
                       + ("" if fresh else f"; {why}"))


def prepare(part: str, args: list) -> list:
    """Convert the grader's float arguments of a trainer part to the types the trainer uses
    (index and mask tensors), so that every part can be called with plain data."""
    out = list(args)
    if part == "token_logprobs":          # logits, tokens, rows, mask, temperature
        out[1], out[2] = torch.as_tensor(out[1]).long(), torch.as_tensor(out[2]).long()
        out[3] = torch.as_tensor(out[3]).bool()
    elif part in ("sequence_rewards", "place_on_last_token", "ppo_loss"):
        k = {"sequence_rewards": 3, "place_on_last_token": 1, "ppo_loss": 3}[part]
        out[k] = torch.as_tensor(out[k]).bool()
    return out
