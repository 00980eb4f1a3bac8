"""The per-token KL reward of RLHF.

In RLHF with PPO the response ``y = (a_1, ..., a_T)`` to a prompt ``x`` is an episode:
the state ``s_t`` is the prompt plus the tokens generated so far, the action ``a_t`` is
the next token. The objective

    E_{y ~ pi_theta(.|x)} [ r(x, y) ] - beta * KL(pi_theta(.|x) || pi_ref(.|x))

is turned into a dense reward by splitting the sequence KL into per-token terms,

    R_t = -beta * k(t) + 1[t = T] * r(x, y),

where ``k(t)`` estimates the token KL from the sampled token and ``r(x, y)`` is the
reward-model score, paid once on the last real token of the response (the EOS when
there is one, never a pad). With ``k = k1 = log pi_theta(a_t|s_t) - log pi_ref(a_t|s_t)``
the sum over tokens is the log-ratio of the whole sequence, whose expectation under
``pi_theta`` is exactly the sequence-level reverse KL ``KL(pi_theta || pi_ref)``.

Everything works on padded batches: ``response_mask[b, t] = 1`` marks a real response
token, ``0`` a pad (or a prompt token). Left padding and right padding are both
supported because the last real token is found from the mask, not from a length.

Functions
---------
``kl_per_token``       k1 / k2 / k3 from per-token log-probabilities (:mod:`klbook_lib.estimators`)
``per_token_rewards``  the reward tensor R_t a PPO loop feeds to GAE
``last_token_index``   index of the last real response token of every row
``exact_token_kl``     KL(pi_theta(.|s_t) || pi_ref(.|s_t)) over the whole vocabulary
``sequence_sum``       per-sequence sum of a per-token quantity over the mask
``masked_mean``        mean over real tokens only (pads excluded)
``token_logprobs``     log pi(a_t|s_t) of given tokens from logits (with temperature)
``gae_unmasked``       GAE run over every column, pads included, as TRL's PPO trainer does
"""
from __future__ import annotations

import math

import torch

from ..divergences import kl_from_log_probs
from ..estimators import kl_per_token  # re-exported: the one per-token k1/k2/k3
from .checks import check_batch_tensor, check_logits_pair, check_logprob_pair, check_mask

ESTIMATORS = ("k1", "k2", "k3")

__all__ = [
    "ESTIMATORS",
    "kl_per_token",
    "per_token_rewards",
    "last_token_index",
    "exact_token_kl",
    "sequence_sum",
    "masked_mean",
    "token_logprobs",
    "gae_unmasked",
    "kl_statistics",
    "standard_error",
]


# --------------------------------------------------------------------------- masks
def last_token_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real response token in every row of a [B, T] 0/1 mask.

    Works for left- and right-padded batches: it is the largest ``t`` with
    ``response_mask[b, t] == 1``, found from the mask and not from a sequence length.
    """
    mask = check_mask(response_mask)
    T = mask.shape[1]
    positions = torch.arange(T, device=mask.device).expand_as(mask)
    return torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=1).values


def per_token_rewards(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
    estimator: str = "k1",
    score_clip: float | None = None,
) -> torch.Tensor:
    """The per-token RLHF reward ``R_t = -beta * k(t) + 1[t = last real token] * score``.

    Args:
        logprobs: ``log pi_theta(a_t|s_t)`` of the sampled response tokens, [B, T].
        ref_logprobs: ``log pi_ref(a_t|s_t)`` of the same tokens, [B, T].
        scores: reward-model score of each whole sequence, [B].
        response_mask: 1 on real response tokens, 0 on pads (left or right), [B, T].
        beta: KL coefficient, >= 0.
        estimator: ``"k1"`` (the log-ratio, the usual choice), ``"k2"`` or ``"k3"``.
        score_clip: if given, scores are clipped to ``[-score_clip, score_clip]``.

    Returns:
        [B, T] tensor: zero on every padded position, the KL penalty on every real token,
        and the (clipped) score added on the last real token of each row.
    """
    check_logprob_pair(logprobs, ref_logprobs)
    mask = check_mask(response_mask, logprobs.shape)
    if not isinstance(scores, torch.Tensor):
        scores = torch.as_tensor(scores, dtype=logprobs.dtype, device=logprobs.device)
    if scores.shape != (logprobs.shape[0],):
        raise ValueError(
            f"scores: expected shape [B] = ({logprobs.shape[0]},), got {tuple(scores.shape)}"
        )
    if bool(torch.isnan(scores).any()):
        rows = torch.nonzero(torch.isnan(scores)).flatten().tolist()
        raise ValueError(f"scores: NaN score in row(s) {rows}")
    beta = float(beta)
    if math.isnan(beta) or beta < 0:
        raise ValueError(f"beta: the KL coefficient must be >= 0, got {beta}")
    if score_clip is not None and not float(score_clip) > 0:
        raise ValueError(f"score_clip: must be a positive number or None, got {score_clip}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator: must be one of {ESTIMATORS}, got {estimator!r}")

    kl = kl_per_token(logprobs, ref_logprobs, estimator)
    real_kl = torch.where(mask, kl, torch.zeros_like(kl))
    if bool(torch.isnan(real_kl).any()):
        raise ValueError("logprobs: NaN log-ratio on a real response token")
    rewards = -beta * real_kl  # torch.where, not a product: a pad may hold -inf or NaN

    s = scores.to(rewards.dtype)
    if score_clip is not None:
        s = s.clamp(-float(score_clip), float(score_clip))
    last = last_token_index(mask)
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    rewards[rows, last] = rewards[rows, last] + s
    return rewards


# --------------------------------------------------------------------------- exact KL
def exact_token_kl(
    logits: torch.Tensor, ref_logits: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """Exact ``KL(pi_theta(.|s_t) || pi_ref(.|s_t))`` at every response position.

    Sums over the whole vocabulary: ``sum_v p(v) (log p(v) - log q(v))`` with
    ``log p = log_softmax(logits)``, ``log q = log_softmax(ref_logits)``. Both logits are
    [B, T, V] and must already be at the same temperature. Tokens the policy gives zero
    probability (``-inf`` logits, e.g. after top-k) contribute 0; a token the policy can
    emit but the reference cannot gives ``+inf``. Returns [B, T], zero on pads.
    """
    check_logits_pair("logits", logits, "ref_logits", ref_logits)
    mask = check_mask(response_mask, logits.shape[:2])
    logp = torch.log_softmax(logits.float() if logits.dtype in (torch.float16, torch.bfloat16)
                             else logits, dim=-1)
    logq = torch.log_softmax(ref_logits.to(logp.dtype), dim=-1)
    kl = kl_from_log_probs(logp, logq, dim=-1)
    return torch.where(mask, kl, torch.zeros_like(kl))


def sequence_sum(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Sum of a per-token quantity over each row's real response tokens: [B, T] -> [B].

    ``sequence_sum(exact_token_kl(...), mask)`` is the sequence-level KL of the sampled
    prefixes; ``sequence_sum(kl_per_token(lp, ref_lp), mask)`` the sequence log-ratio.
    """
    check_batch_tensor("values", values)
    mask = check_mask(response_mask, values.shape)
    return torch.where(mask, values, torch.zeros_like(values)).sum(dim=1)


def masked_mean(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Mean of a per-token quantity over all real tokens of the batch (pads excluded)."""
    check_batch_tensor("values", values)
    mask = check_mask(response_mask, values.shape)
    return torch.where(mask, values, torch.zeros_like(values)).sum() / mask.sum()


def standard_error(x: torch.Tensor) -> float:
    """Standard error of a batch mean: sample standard deviation / sqrt(n) (0 for one sample)."""
    x = x.double()
    return float(x.std() / math.sqrt(len(x))) if len(x) > 1 else 0.0


@torch.no_grad()
def kl_statistics(logits: torch.Tensor, ref_logits: torch.Tensor, logprobs: torch.Tensor,
                  ref_logprobs: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """The KL, entropy and reference-NLL statistics of a batch of sampled responses.

    KL is ``KL(pi_theta || pi_ref)`` along the sampled prefixes: ``kl_exact_*`` sums over the
    vocabulary at every position (:func:`exact_token_kl`), ``k1_*`` and ``k3_*`` use only the
    sampled tokens (:func:`kl_per_token`); ``*_seq`` are sums over a response's tokens
    averaged over the batch, ``*_token`` means over all response tokens. ``entropy_*`` is the
    policy's entropy per position, ``ref_nll_token`` the mean ``-log pi_ref`` of the sampled
    tokens, ``response_length`` the mean number of real tokens, ``kl_exact_seq_se`` and
    ``k1_seq_se`` the standard errors of the two sequence means (:func:`standard_error`).
    The PPO and GRPO loops log these.
    """
    mask = check_mask(response_mask, logprobs.shape)
    exact = exact_token_kl(logits, ref_logits, mask)
    k1 = kl_per_token(logprobs, ref_logprobs, "k1")
    k3 = kl_per_token(logprobs, ref_logprobs, "k3")
    logp = torch.log_softmax(logits, -1)
    ent = -(logp.exp() * logp).sum(-1)
    exact_seq = sequence_sum(exact, mask).double()
    k1_seq = sequence_sum(k1, mask).double()
    return {
        "kl_exact_seq": float(exact_seq.mean()),
        "kl_exact_token": float(masked_mean(exact, mask)),
        "k1_seq": float(k1_seq.mean()),
        "k1_token": float(masked_mean(k1, mask)),
        "k3_seq": float(sequence_sum(k3, mask).mean()),
        "k3_token": float(masked_mean(k3, mask)),
        "entropy_token": float(masked_mean(ent, mask)),
        "entropy_seq": float(sequence_sum(ent, mask).mean()),
        "ref_nll_token": float(-masked_mean(ref_logprobs, mask)),
        "response_length": float(mask.float().sum(1).mean()),
        "kl_exact_seq_se": standard_error(exact_seq),
        "k1_seq_se": standard_error(k1_seq),
    }


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``log pi(a_t|s_t)`` of the given tokens under ``softmax(logits / temperature)``.

    ``logits`` [B, T, V] are the logits that *predict* position t (already shifted),
    ``tokens`` [B, T] the tokens at those positions. Use the same ``temperature`` for the
    policy and the reference model, and the one used for sampling.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise ValueError("logits: expected a [B, T, V] tensor")
    if not isinstance(tokens, torch.Tensor) or tokens.shape != logits.shape[:2]:
        raise ValueError(
            f"tokens: expected shape {tuple(logits.shape[:2])}, got "
            f"{tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__}"
        )
    if not float(temperature) > 0:
        raise ValueError(f"temperature: must be > 0, got {temperature}")
    logp = torch.log_softmax(logits / float(temperature), dim=-1)
    return logp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


# --------------------------------------------------------------------------- advantages
def gae_unmasked(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over *every* column of a padded batch.

    ``A_t = delta_t + gamma * lam * A_{t+1}`` with ``delta_t = R_t + gamma * V_{t+1} - V_t``,
    run from the last column to the first with nothing masked; ``V`` after the last column is
    0. This is the recursion of TRL's ``PPOTrainer`` (``trl/experimental/ppo/ppo_trainer.py``
    in TRL 1.9.0; the same loop as ``PPOv2Trainer`` in TRL 0.11), which masks the advantages
    only afterwards. A reward placed on a pad therefore still flows back into
    the real tokens, discounted by ``gamma * lam`` per step. The book's masked GAE
    (``klbook_lib.rlhf.ppo.gae``) stops at the last real token instead.

    Args:
        rewards: ``R_t``, [B, T] (whatever the pads hold counts).
        values: ``V(s_t)``, [B, T].
        gamma, lam: discount and GAE parameter, both in [0, 1].

    Returns:
        ``(advantages, returns)``, both [B, T], ``returns = advantages + values``; the caller
        masks them.
    """
    check_batch_tensor("rewards", rewards)
    check_batch_tensor("values", values)
    if values.shape != rewards.shape:
        raise ValueError(f"values: shape {tuple(values.shape)} does not match rewards shape "
                         f"{tuple(rewards.shape)}")
    for name, x in (("gamma", gamma), ("lam", lam)):
        x = float(x)
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"{name}: must be in [0, 1], got {x}")
    gamma, lam = float(gamma), float(lam)
    T = rewards.shape[1]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        next_value = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
    return adv, adv + values
