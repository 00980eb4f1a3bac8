"""Off-policy sequence masking and the kept sampling mask (chapter 14), exact on the enumerable
policy of :mod:`klbook_lib.seqkl`.

Two more pieces of DeepSeek-V3.2's off-policy toolkit, as TRL 1.16.0 implements or discusses them.

1. **Off-policy sequence masking** (TRL ``GRPOConfig.off_policy_mask_threshold``;
   ``GRPOTrainer.get_off_policy_mask``): a response is dropped from the policy loss when its
   advantage is negative *and* the mean over its tokens of ``log mu(a_t|s_t) - log pi(a_t|s_t)``
   (``mu`` the sampler, ``pi`` the learner) exceeds a threshold ``delta``; every response with a
   non-negative advantage is kept. :func:`off_policy_sequence_mask` is that rule,
   :func:`expected_masked_pg_gradient` the exact expected policy gradient it leaves.
2. **The kept sampling mask.** A sampler with ``top_p < 1`` or ``top_k > 0`` draws from the
   policy truncated to a kept set ``K(s)`` at each prefix and renormalised,
   ``mu(a|s) = pi(a|s) / S(s)`` on ``K(s)`` with ``S(s) = sum_{a in K(s)} pi(a|s)`` the kept mass.
   A trainer that scores the full vocabulary sees the per-token ratio ``pi/mu = S(s)`` on every
   sampled token (TRL issue 6789); DeepSeek-V3.2 instead applies the sampler's kept set to the
   learner as well ("keep sampling mask"). :func:`kept_tokens`, :func:`kept_mass`,
   :func:`truncated_token_logprobs` and :func:`expected_truncated_pg_gradient` compute each choice
   exactly; :func:`truncated_objective_gradient` is the gradient of ``E_{y ~ pi^K}[A(y)]`` with the
   kept sets held fixed, by automatic differentiation of the exact sum.

All expectations are finite sums over ``space.sequences``; gradients are with respect to the
learner's logits table ``[n_prefixes, vocab_size]``.
"""
from __future__ import annotations

import math

import torch

from . import offpolicy, seqkl

__all__ = ["TRUNCATION_METHODS", "kept_tokens", "kept_mass", "truncated_token_logprobs",
           "expected_truncated_pg_gradient", "truncated_objective_gradient", "off_policy_sequence_mask",
           "expected_masked_pg_gradient", "ess_fraction"]

#: how a trainer scores the tokens a truncated sampler drew: full-vocabulary log-probabilities
#: with no weight, full-vocabulary log-probabilities with the sequence importance weight pi/mu
#: (a product of kept masses), or log-probabilities renormalised over the sampler's kept set
TRUNCATION_METHODS = ("full", "full_is", "kept")


# the checks of a sequence space and of a logits table are seqkl's
_check_space, _check_table = seqkl.check_space, seqkl.check_logits


def _check_keep(keep, space: seqkl.SequenceSpace) -> torch.Tensor:
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool:
        raise ValueError("keep: expected a bool torch.Tensor (see kept_tokens)")
    if tuple(keep.shape) != (space.n_prefixes, space.vocab_size):
        raise ValueError(f"keep: expected shape [{space.n_prefixes}, {space.vocab_size}], got {list(keep.shape)}")
    if not bool(keep.any(1).all()):
        raise ValueError("keep: every prefix must keep at least one token")
    return keep


_check_advantage = seqkl.check_advantage


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_(True)


# --------------------------------------------------------------------------- the kept sampling mask
def kept_tokens(space: seqkl.SequenceSpace, logits: torch.Tensor, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """The tokens a top-k / top-p sampler can draw at each prefix, bool ``[n_prefixes, vocab_size]``.

    ``top_k > 0`` keeps the ``top_k`` most likely tokens (``0``: all). ``top_p < 1`` then keeps the
    smallest set of the most likely tokens whose probability reaches ``top_p`` (the token that
    crosses it included, so the most likely token is always kept). Ties are broken by token index.
    """
    space = _check_space(space)
    logits = _check_table("logits", logits, space).detach()
    try:
        top_p = float(top_p)
    except (TypeError, ValueError):
        raise ValueError(f"top_p: expected a number, got {top_p!r}") from None
    if not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p: must lie in (0, 1], got {top_p}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k: expected an int >= 0, got {top_k!r}")
    probs = torch.softmax(logits.to(torch.float64), -1)
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices
    sorted_p = probs.gather(-1, order)
    rank = torch.arange(space.vocab_size).expand_as(sorted_p)
    keep_sorted = torch.ones_like(sorted_p, dtype=torch.bool)
    if top_k > 0:
        keep_sorted &= rank < top_k
    if top_p < 1:
        mass_before = torch.cumsum(sorted_p, -1) - sorted_p
        keep_sorted &= mass_before < top_p
    keep = torch.zeros_like(keep_sorted)
    keep.scatter_(-1, order, keep_sorted)
    return keep


def kept_mass(space: seqkl.SequenceSpace, logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``S(s) = sum_{a in K(s)} pi(a|s)`` for every prefix, ``[n_prefixes]``."""
    space = _check_space(space)
    logits = _check_table("logits", logits, space)
    keep = _check_keep(keep, space)
    return (torch.softmax(logits, -1) * keep).sum(-1)


def truncated_token_logprobs(space: seqkl.SequenceSpace, logits: torch.Tensor,
                             keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``log pi^K(a_t|s_t)``, the policy renormalised over the kept set, for every token of every
    sequence, ``[N, T]`` (``0`` on pads and on tokens outside the kept set), and ``valid`` ``[N]``:
    ``True`` for the sequences whose every token is kept (the others have probability zero
    under ``pi^K``). Differentiable in ``logits`` with the kept set held fixed."""
    space = _check_space(space)
    logits = _check_table("logits", logits, space)
    keep = _check_keep(keep, space)
    masked = torch.where(keep, logits, torch.full_like(logits, -math.inf))
    logp = torch.where(keep, logits - torch.logsumexp(masked, -1, keepdim=True), torch.zeros_like(logits))
    kept_tok = keep[space.prefix_index, space.sequences] | ~space.mask
    lp = logp[space.prefix_index, space.sequences]
    lp = torch.where(space.mask & kept_tok, lp, torch.zeros_like(lp))
    return lp, kept_tok.all(1)


def _truncated_probs(space, logits, keep) -> torch.Tensor:
    lp, valid = truncated_token_logprobs(space, logits.detach(), keep)
    return torch.where(valid, lp.sum(1).exp(), torch.zeros(space.n_sequences, dtype=lp.dtype))


def expected_truncated_pg_gradient(space: seqkl.SequenceSpace, logits: torch.Tensor, advantage,
                                   keep: torch.Tensor, method: str = "kept") -> torch.Tensor:
    """``E_{y ~ pi^K}[ A(y) w(y) sum_t grad log q(a_t|s_t) ]`` exactly, where the batch is drawn by the
    truncated sampler ``pi^K`` (``pi_theta`` restricted to ``keep`` and renormalised; the sampler has
    the learner's weights) and

    - ``"full"``: ``q = pi_theta`` over the whole vocabulary, ``w = 1``;
    - ``"full_is"``: ``q = pi_theta``, ``w = pi_theta(y)/pi^K(y) = prod_t S(s_t)`` detached (the
      importance weight a trainer with full-vocabulary log-probabilities computes against
      a truncated sampler's renormalised log-probabilities, untruncated);
    - ``"kept"``: ``q = pi^K``, the sampler's kept set applied to the learner, ``w = 1``.
    """
    space = _check_space(space)
    if method not in TRUNCATION_METHODS:
        raise ValueError(f"method: must be one of {TRUNCATION_METHODS}, got {method!r}")
    theta = _leaf(_check_table("logits", logits, space))
    keep = _check_keep(keep, space)
    a = _check_advantage(space, advantage).to(theta.dtype)
    mu = _truncated_probs(space, theta, keep).to(theta.dtype)
    if method == "kept":
        lp, _ = truncated_token_logprobs(space, theta, keep)
        w = torch.ones_like(mu)
    else:
        lp = seqkl.token_logprobs(space, theta)
        if method == "full":
            w = torch.ones_like(mu)
        else:
            lk, valid = truncated_token_logprobs(space, theta.detach(), keep)
            w = torch.where(valid, (lp.detach() - lk).sum(1).exp(), torch.zeros_like(mu))
    value = (mu * a * w * lp.sum(1)).sum()
    return torch.autograd.grad(value, theta)[0]


def truncated_objective_gradient(space: seqkl.SequenceSpace, logits: torch.Tensor, advantage,
                                 keep: torch.Tensor) -> torch.Tensor:
    """``grad_theta sum_y pi^K_theta(y) A(y)`` with the kept sets held fixed, by automatic
    differentiation of the exact sum (no score function)."""
    space = _check_space(space)
    theta = _leaf(_check_table("logits", logits, space))
    keep = _check_keep(keep, space)
    a = _check_advantage(space, advantage).to(theta.dtype)
    lp, valid = truncated_token_logprobs(space, theta, keep)
    probs = torch.where(valid, lp.sum(1).exp(), torch.zeros_like(a))
    return torch.autograd.grad((probs * a).sum(), theta)[0]


# --------------------------------------------------------------------------- off-policy sequence masking
def _check_threshold(threshold) -> float:
    try:
        threshold = float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"threshold: expected a number, got {threshold!r}") from None
    if not (math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold: must be a finite number > 0, got {threshold}")
    return threshold


def off_policy_sequence_mask(space: seqkl.SequenceSpace, learner_logits: torch.Tensor,
                             sampler_logits: torch.Tensor, advantage, threshold: float) -> torch.Tensor:
    """TRL 1.16.0's ``get_off_policy_mask`` for every sequence, float ``[N]`` of 0/1: keep a response
    if its advantage is ``>= 0`` or the mean over its tokens of ``log mu - log pi`` is ``<= threshold``."""
    space = _check_space(space)
    lp = seqkl.token_logprobs(space, _check_table("learner_logits", learner_logits, space).detach())
    lm = seqkl.token_logprobs(space, _check_table("sampler_logits", sampler_logits, space).detach())
    a = _check_advantage(space, advantage)
    delta = _check_threshold(threshold)
    n_tok = space.mask.sum(1).clamp(min=1).to(lp.dtype)
    mean_kl = (lm - lp).sum(1) / n_tok
    return ((a >= 0) | (mean_kl <= delta)).to(torch.float64)


def expected_masked_pg_gradient(space: seqkl.SequenceSpace, logits: torch.Tensor, sampler_logits: torch.Tensor,
                                advantage, threshold: float | None, correction: str = "seq_is",
                                is_threshold: float = 2.0) -> torch.Tensor:
    """``E_{y ~ mu}[ m(y) A(y) sum_t c_t grad log pi_theta(a_t|s_t) ]`` exactly: the policy gradient
    with the importance correction ``c`` of :func:`klbook_lib.offpolicy.correction_weights` and the
    off-policy sequence mask ``m`` (``threshold=None``: no mask, ``m = 1``)."""
    space = _check_space(space)
    theta = _leaf(_check_table("logits", logits, space))
    sampler_logits = _check_table("sampler_logits", sampler_logits, space)
    a = _check_advantage(space, advantage).to(theta.dtype)
    if threshold is None:
        m = torch.ones_like(a)
    else:
        m = off_policy_sequence_mask(space, theta, sampler_logits, a, threshold)
    c = offpolicy.correction_weights(space, theta, sampler_logits, correction, is_threshold)
    mu = seqkl.sequence_logprobs(space, sampler_logits.detach()).exp()
    lp = seqkl.token_logprobs(space, theta)
    value = (mu * m * a * (c * lp).sum(1)).sum()
    return torch.autograd.grad(value, theta)[0]


def ess_fraction(probs: torch.Tensor, weights: torch.Tensor) -> float:
    """Kish's effective sample size fraction ``E[w]^2 / E[w^2]`` of weights ``w(y)`` under the
    distribution ``probs`` over sequences (exact sums)."""
    if not isinstance(probs, torch.Tensor) or not isinstance(weights, torch.Tensor):
        raise ValueError("probs, weights: expected torch.Tensors")
    if probs.shape != weights.shape or probs.dim() != 1:
        raise ValueError(f"probs, weights: expected two 1-D tensors of one shape, got {list(probs.shape)} "
                         f"and {list(weights.shape)}")
    if bool((probs < 0).any()) or abs(float(probs.sum()) - 1) > 1e-9:
        raise ValueError("probs: expected a probability vector (non-negative, summing to 1)")
    if bool((weights < 0).any()) or not bool(torch.isfinite(weights).all()):
        raise ValueError("weights: expected finite non-negative weights")
    second = float((probs * weights**2).sum())
    if second == 0:
        raise ValueError("weights: every weight is zero where probs is positive")
    return float((probs * weights).sum()) ** 2 / second
