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
``kl_per_token``       k1 / k2 / k3 from per-token log-probabilities
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
]


# --------------------------------------------------------------------------- checks
def _check_mask(response_mask: torch.Tensor, shape: torch.Size | None = None) -> torch.Tensor:
    """Validate a [B, T] 0/1 mask and return it as a bool tensor."""
    if not isinstance(response_mask, torch.Tensor):
        raise ValueError(f"response_mask: expected a torch.Tensor, got {type(response_mask).__name__}")
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask: expected shape [B, T], got {tuple(response_mask.shape)}")
    if shape is not None and response_mask.shape != shape:
        raise ValueError(
            f"response_mask: shape {tuple(response_mask.shape)} does not match the "
            f"log-probabilities' shape {tuple(shape)}"
        )
    if response_mask.dtype != torch.bool:
        binary = (response_mask == 0) | (response_mask == 1)
        if not bool(binary.all()):
            bad = response_mask[~binary].flatten()[0].item()
            raise ValueError(f"response_mask: must contain only 0 and 1, found {bad}")
        response_mask = response_mask == 1
    empty = ~response_mask.any(dim=1)
    if bool(empty.any()):
        rows = torch.nonzero(empty).flatten().tolist()
        raise ValueError(
            f"response_mask: row(s) {rows} have an empty response (mask all zero); "
            "every sequence needs at least one response token to carry its score"
        )
    return response_mask


def _check_logprobs(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name}: expected shape [B, T], got {tuple(x.shape)}")


def _check_logprob_pair(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> None:
    """Both log-prob tensors valid and of the same shape."""
    _check_logprobs("logprobs", logprobs)
    _check_logprobs("ref_logprobs", ref_logprobs)
    if ref_logprobs.shape != logprobs.shape:
        raise ValueError(
            f"ref_logprobs: shape {tuple(ref_logprobs.shape)} does not match logprobs "
            f"shape {tuple(logprobs.shape)}"
        )


# --------------------------------------------------------------------------- estimators
def kl_per_token(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1"
) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from the sampled token's log-probs.

    With the log-ratio ``l = log pi_theta(a_t|s_t) - log pi_ref(a_t|s_t)`` of a token
    sampled from ``pi_theta`` (so ``r = pi_ref / pi_theta = exp(-l)``):

    - ``k1 = l``                      unbiased, can be negative for a single token;
    - ``k2 = l**2 / 2``               biased, always >= 0;
    - ``k3 = (r - 1) - log r = exp(-l) - 1 + l``   unbiased, always >= 0.

    Elementwise; no masking (see :func:`per_token_rewards`).
    """
    _check_logprob_pair(logprobs, ref_logprobs)
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"estimator: must be one of {ESTIMATORS}, got {estimator!r}")


def last_token_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real response token in every row of a [B, T] 0/1 mask.

    Works for left- and right-padded batches: it is the largest ``t`` with
    ``response_mask[b, t] == 1``, found from the mask and not from a sequence length.
    """
    mask = _check_mask(response_mask)
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
    _check_logprob_pair(logprobs, ref_logprobs)
    mask = _check_mask(response_mask, logprobs.shape)
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
    for name, x in (("logits", logits), ("ref_logits", ref_logits)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{name}: expected a [B, T, V] tensor, got {shape}")
    if ref_logits.shape != logits.shape:
        raise ValueError(
            f"ref_logits: shape {tuple(ref_logits.shape)} does not match logits "
            f"shape {tuple(logits.shape)}"
        )
    mask = _check_mask(response_mask, logits.shape[:2])
    logp = torch.log_softmax(logits.float() if logits.dtype in (torch.float16, torch.bfloat16)
                             else logits, dim=-1)
    logq = torch.log_softmax(ref_logits.to(logp.dtype), dim=-1)
    p = logp.exp()
    terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
    kl = terms.sum(dim=-1)
    return torch.where(mask, kl, torch.zeros_like(kl))


def sequence_sum(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Sum of a per-token quantity over each row's real response tokens: [B, T] -> [B].

    ``sequence_sum(exact_token_kl(...), mask)`` is the sequence-level KL of the sampled
    prefixes; ``sequence_sum(kl_per_token(lp, ref_lp), mask)`` the sequence log-ratio.
    """
    _check_logprobs("values", values)
    mask = _check_mask(response_mask, values.shape)
    return torch.where(mask, values, torch.zeros_like(values)).sum(dim=1)


def masked_mean(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Mean of a per-token quantity over all real tokens of the batch (pads excluded)."""
    _check_logprobs("values", values)
    mask = _check_mask(response_mask, values.shape)
    return torch.where(mask, values, torch.zeros_like(values)).sum() / mask.sum()


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
    _check_logprobs("rewards", rewards)
    _check_logprobs("values", values)
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
