"""Off-policy KL: attached ratios, train-inference mismatch, and trust regions.

Three ideas of chapter 14, computed exactly on the enumerable policy of :mod:`klbook_lib.seqkl`
(every sum over responses is a finite sum) and, for the trust-region rules, on plain tensors.

Notation. ``pi_theta`` is the learner, ``pi_ref`` the frozen reference, ``pi_old`` (or ``mu``)
the policy that sampled the batch. Per token ``rho_t = pi_theta(a_t|s_t) / pi_old(a_t|s_t)``
and, for a response, ``W(y) = prod_t rho_t = pi_theta(y) / pi_old(y)``.

1. **Attached-ratio KL terms** (DeepSeek-V3.2's unbiased KL estimate, TRL's
   ``use_bias_correction_kl``): the per-token loss ``rho_t * k_t`` with the ratio *not*
   detached, so the gradient flows through it. ``seqkl.surrogate(..., weights="token")``
   detaches it instead. Per sample, ``grad(rho_t * k3_t) = rho_t * k1_t * grad log pi_theta``,
   so its expectation at each position is ``grad KL(pi_theta(.|s_t) || pi_ref(.|s_t))``
   under ``pi_old``'s prefixes (:func:`partial_kl_gradient`): the reverse-KL gradient at one
   position, the partial gradient over responses.
2. **Train-inference mismatch.** :func:`perturb_logits` makes a sampler ``mu`` from the
   learner's logits (rounded to bfloat16/float16, or with noise); :func:`mismatch_metrics`
   gives the per-token KL and chi^2 and the sequence chi^2 exactly; :func:`expected_pg_gradient`
   and :func:`sampled_pg_gradient` the policy gradient of ``E_{pi_theta}[A]`` from ``mu``'s
   samples with the corrections of :data:`IS_CORRECTIONS` (token-level truncated or masked
   IS, sequence-level IS, truncated or masked).
3. **Sequence ratios and trust regions.** :func:`gspo_ratio` is GSPO's length-normalised
   ratio ``W(y)**(1/|y|)``; :func:`trust_region_mask` the per-token rules of PPO's ratio
   clipping and of DPPO's binary TV and binary KL masks; :func:`masked_pg_loss` the policy
   loss those masks gate.
4. **On-policy distillation** (Thinking Machines' recipe; tinker-cookbook's ``incorporate_kl_penalty``):
   the student ``pi_theta`` samples, the teacher ``pi_T`` scores every sampled token, and the
   per-token advantage is ``A_t = -sum_{u >= t} gamma^(u-t) (log pi_theta(a_u|s_u) - log pi_T(a_u|s_u))``,
   detached (:func:`distillation_advantages`). With ``gamma = 0`` (the recipe's default) the
   expected gradient is the partial gradient ``sum_t E_{s_t ~ pi_theta}[grad KL(pi_theta(.|s_t) || pi_T(.|s_t))]``;
   with ``gamma = 1`` it is ``grad KL(pi_theta || pi_T)`` of whole responses
   (:func:`expected_distillation_gradient`, :func:`sampled_distillation_gradient`,
   :func:`distill_run`).

Functions
---------
``attached_ratio_surrogate``   per-sequence ``sum_t c(theta) k_t`` with an attached ratio ``c``
``expected_attached_gradient`` its exact expected gradient under ``pi_old``
``partial_kl_gradient``        ``sum_t E_{s_t ~ mu}[grad KL(pi_theta(.|s_t) || pi_ref(.|s_t))]``
``perturb_logits``             a low-precision or noisy copy of a logits table (the sampler)
``mismatch_metrics``           exact per-token KL, chi^2, sequence chi^2 and ESS between learner and sampler
``batch_mismatch_metrics``     the same quantities estimated from one sampled batch (as verl logs them)
``correction_weights``         the detached weight of every token of every sequence for one correction
``expected_pg_gradient``       exact expected policy gradient from the sampler's responses
``sampled_pg_gradient``        the same from one sampled batch
``gspo_ratio``                 (pi_theta(y) / pi_old(y)) ** (1 / |y|) from per-token log-probs
``trust_region_mask``          which sampled tokens keep their gradient under a trust-region rule
``masked_pg_loss``             ``-mean(A * rho.detach() * mask * log pi_theta)``
``bandit_run``                 PPO-clip vs DPPO masks on a one-position policy, with exact per-update KL
``distillation_advantages``    ``A_t``: minus the discounted future sum of per-token log-ratios student/teacher
``distillation_surrogate``     per-sequence ``-sum_t A_t log pi_theta(a_t|s_t)`` (a loss)
``expected_distillation_gradient``  its exact expected gradient over the student's own responses
``sampled_distillation_gradient``   the same from ``n`` sampled responses
``distillation_gradient_variance``  exact ``E||g_1 - g||^2`` of the one-response estimate ``g_1``
``distill_run``                a tabular student trained by sampled distillation gradients, with exact KL per step
"""
from __future__ import annotations

import math

import torch

from . import seqkl
from .divergences import kl_from_log_probs
from .estimators import k3_from_log_ratio, kl_per_token

__all__ = [
    "LEVELS", "IS_CORRECTIONS", "PERTURBATIONS", "TRUST_REGION_RULES",
    "attached_ratio_surrogate", "expected_attached_gradient", "partial_kl_gradient",
    "perturb_logits", "mismatch_metrics", "batch_mismatch_metrics", "correction_weights",
    "expected_pg_gradient", "sampled_pg_gradient", "gspo_ratio", "trust_region_mask",
    "masked_pg_loss", "bandit_run", "distillation_advantages", "distillation_surrogate",
    "expected_distillation_gradient", "sampled_distillation_gradient", "distillation_gradient_variance", "distill_run",
]

#: how the attached ratio is formed: per token, GSPO's geometric mean over the response, or the product
LEVELS = ("token", "geometric", "sequence")
#: corrections for a sampler mu != pi_theta (token/sequence level; truncated, masked, or plain IS)
IS_CORRECTIONS = ("none", "token_tis", "token_mis", "seq_is", "seq_tis", "seq_mis")
PERTURBATIONS = ("bfloat16", "float16", "noise")
#: PPO's ratio clipping and DPPO's binary total-variation and binary KL masks
TRUST_REGION_RULES = ("ratio", "tv", "binary_kl")


# --------------------------------------------------------------------------- checks
# the checks of a sequence space and of a logits table are seqkl's
_check_space, _check_table = seqkl.check_space, seqkl.check_logits


def _check_choice(name: str, value, choices) -> str:
    if value not in choices:
        raise ValueError(f"{name}: must be one of {tuple(choices)}, got {value!r}")
    return value


def _check_positive(name: str, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number, got {value!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {value}")
    return value


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_(True)


def _sequence_probs(space: seqkl.SequenceSpace, logits: torch.Tensor) -> torch.Tensor:
    return seqkl.sequence_logprobs(space, logits.detach()).exp()


# --------------------------------------------------------------------------- 1. attached ratios
def attached_ratio_surrogate(space: seqkl.SequenceSpace, logits: torch.Tensor, ref_logits: torch.Tensor,
                             behaviour_logits: torch.Tensor | None = None, estimator: str = "k3",
                             level: str = "token") -> torch.Tensor:
    """One value per sequence, [N]: ``sum_t c_t(theta) * k_t(theta)`` with the ratio attached.

    ``c_t`` is the token ratio ``rho_t`` (``level="token"``: DeepSeek-V3.2's unbiased KL
    estimate, TRL's ``use_bias_correction_kl`` with per-token importance sampling), GSPO's
    ``W(y)**(1/|y|)`` for every token (``"geometric"``: TRL's flag with
    ``importance_sampling_level="sequence"``) or ``W(y)`` (``"sequence"``). The ratio is
    computed from ``logits`` and is differentiated; ``behaviour_logits`` (``pi_old``) is
    detached; ``None`` means on-policy (the ratio's value is 1, its gradient is not zero).
    ``k_t`` is ``estimators.kl_per_token`` of ``estimator``. Pads contribute nothing.
    """
    space = _check_space(space)
    _check_choice("estimator", estimator, seqkl.ESTIMATORS)
    _check_choice("level", level, LEVELS)
    lp = seqkl.token_logprobs(space, _check_table("logits", logits, space))
    lq = seqkl.token_logprobs(space, _check_table("ref_logits", ref_logits, space)).detach()
    if behaviour_logits is None:
        lo = lp.detach()
    else:
        lo = seqkl.token_logprobs(space, _check_table("behaviour_logits", behaviour_logits, space)).detach()
    mask = space.mask
    k = torch.where(mask, kl_per_token(lp, lq, estimator), torch.zeros_like(lp))
    log_ratio = torch.where(mask, lp - lo, torch.zeros_like(lp))
    if level == "token":
        return (log_ratio.exp() * k).sum(1)
    total = log_ratio.sum(1)
    if level == "geometric":
        total = total / space.lengths.to(total.dtype)
    return total.exp() * k.sum(1)


def expected_attached_gradient(space: seqkl.SequenceSpace, logits: torch.Tensor, ref_logits: torch.Tensor,
                               behaviour_logits: torch.Tensor | None = None, estimator: str = "k3",
                               level: str = "token") -> torch.Tensor:
    """The exact expected gradient (w.r.t. the logits table) of :func:`attached_ratio_surrogate`
    for responses sampled from ``pi_old`` = ``behaviour_logits`` (or from pi_theta when ``None``)."""
    space = _check_space(space)
    theta = _leaf(_check_table("logits", logits, space))
    source = theta if behaviour_logits is None else _check_table("behaviour_logits", behaviour_logits, space)
    mu = _sequence_probs(space, source)
    value = (mu * attached_ratio_surrogate(space, theta, ref_logits, behaviour_logits, estimator, level)).sum()
    return torch.autograd.grad(value, theta)[0]


def partial_kl_gradient(space: seqkl.SequenceSpace, logits: torch.Tensor, ref_logits: torch.Tensor,
                        prefix_logits: torch.Tensor | None = None) -> torch.Tensor:
    """``sum_t E_{s_t ~ mu}[ grad_theta KL(pi_theta(.|s_t) || pi_ref(.|s_t)) ]``, the prefixes
    drawn from ``mu`` = ``prefix_logits`` (held fixed) or from pi_theta itself when ``None``.

    This is the gradient of the per-position reverse KL with the prefix distribution held
    fixed: the *partial* gradient of chapter 7; with one position it is the full
    ``grad KL(pi_theta || pi_ref)``. Computed from :func:`seqkl.position_kl`, not from a surrogate.
    """
    space = _check_space(space)
    theta = _leaf(_check_table("logits", logits, space))
    source = theta if prefix_logits is None else _check_table("prefix_logits", prefix_logits, space)
    mu = _sequence_probs(space, source)
    value = (mu[:, None] * seqkl.position_kl(space, theta, ref_logits)).sum()
    return torch.autograd.grad(value, theta)[0]


# --------------------------------------------------------------------------- 2. mismatch
def perturb_logits(logits: torch.Tensor, how: str = "bfloat16", scale: float = 0.0,
                   seed: int | torch.Generator = 0) -> torch.Tensor:
    """A sampler's copy of the learner's logits, returned in the learner's dtype.

    ``how="bfloat16"`` or ``"float16"`` rounds every logit to that format (8 or 11
    significant bits) and back: the rounding a low-precision copy applies to its output.
    ``"noise"`` adds ``scale * N(0, 1)`` to every logit (seeded): a stand-in for the errors a
    low-precision forward pass accumulates before the output layer.
    """
    if not isinstance(logits, torch.Tensor) or not logits.dtype.is_floating_point:
        raise ValueError("logits: expected a floating-point torch.Tensor")
    _check_choice("how", how, PERTURBATIONS)
    x = logits.detach()
    if how == "bfloat16":
        return x.to(torch.bfloat16).to(x.dtype)
    if how == "float16":
        return x.to(torch.float16).to(x.dtype)
    scale = float(scale)
    if not (math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale: must be a finite number >= 0, got {scale}")
    g = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(int(seed))
    return x + scale * torch.randn(x.shape, generator=g, dtype=x.dtype)


def mismatch_metrics(space: seqkl.SequenceSpace, learner_logits: torch.Tensor,
                     sampler_logits: torch.Tensor) -> dict[str, float]:
    """Exact mismatch between the learner ``pi`` and the sampler ``mu``, over ``mu``'s responses.

    - ``kl_token``: ``E_mu[sum_t KL(mu(.|s_t) || pi(.|s_t))] / E_mu[|y|]``, the per-token KL
      whose batch estimate verl logs as ``rollout_corr/kl`` (mean of ``log mu - log pi``);
    - ``chi2_token``: ``E_mu[sum_t (rho_t**2 - 1)] / E_mu[|y|]`` with ``rho_t = pi/mu`` per
      token (verl's ``chi2_token``: mean ratio squared minus one);
    - ``kl_seq``: ``KL(mu || pi)`` of whole responses;
    - ``chi2_seq``: ``E_mu[W**2] - 1``, ``W = pi(y)/mu(y)`` (verl's ``chi2_seq``);
    - ``ess_seq``: ``1 / (1 + chi2_seq)``, the fraction of a batch that sequence weights keep;
    - ``mean_length``: ``E_mu[|y|]``.
    """
    space = _check_space(space)
    lp = seqkl.token_logprobs(space, _check_table("learner_logits", learner_logits, space).detach())
    lm = seqkl.token_logprobs(space, _check_table("sampler_logits", sampler_logits, space).detach())
    mu = lm.sum(1).exp()
    mask = space.mask.to(lp.dtype)
    length = float((mu * mask.sum(1)).sum())
    pos_kl = seqkl.position_kl(space, sampler_logits.detach(), learner_logits.detach())
    rho2 = torch.where(space.mask, (2 * (lp - lm)).exp(), torch.ones_like(lp))
    chi2_seq = float((mu * (2 * (lp - lm).sum(1)).exp()).sum()) - 1.0
    return {"kl_token": float((mu[:, None] * pos_kl).sum()) / length,
            "chi2_token": float((mu[:, None] * mask * (rho2 - 1)).sum()) / length,
            "kl_seq": float(seqkl.exact_kl(space, sampler_logits.detach(), learner_logits.detach())),
            "chi2_seq": chi2_seq, "ess_seq": 1.0 / (1.0 + chi2_seq), "mean_length": length}


def batch_mismatch_metrics(space: seqkl.SequenceSpace, learner_logits: torch.Tensor,
                           sampler_logits: torch.Tensor, index: torch.Tensor) -> dict[str, float]:
    """The estimates of :func:`mismatch_metrics` from one batch of ``mu``'s responses
    (``index`` into ``space.sequences``, e.g. from :func:`seqkl.sample`), as verl computes them:
    ``kl_token = mean_tokens(log mu - log pi)``, ``k3_token = mean_tokens(rho - 1 - log rho)``,
    ``chi2_token = mean_tokens(rho**2) - 1``, ``chi2_seq = mean(W**2) - 1``, and Kish's
    ``ess_seq = (sum W)**2 / (n sum W**2)``."""
    space = _check_space(space)
    if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.numel() == 0:
        raise ValueError("index: expected a non-empty 1-D tensor of sequence indices")
    lp = seqkl.token_logprobs(space, _check_table("learner_logits", learner_logits, space).detach())[index]
    lm = seqkl.token_logprobs(space, _check_table("sampler_logits", sampler_logits, space).detach())[index]
    m = space.mask[index]
    lr = (lp - lm)[m]
    W = (lp - lm).sum(1).exp()
    return {"kl_token": float((-lr).mean()), "k3_token": float(k3_from_log_ratio(lr).mean()),
            "chi2_token": float((2 * lr).exp().mean()) - 1.0, "chi2_seq": float((W**2).mean()) - 1.0,
            "ess_seq": float(W.sum() ** 2 / (len(W) * (W**2).sum()))}


def correction_weights(space: seqkl.SequenceSpace, learner_logits: torch.Tensor, sampler_logits: torch.Tensor,
                       correction: str, threshold: float = 2.0) -> torch.Tensor:
    """The detached weight ``c_t`` of every token of every sequence, [N, T] (``0`` on pads).

    With ``rho_t = pi(a_t|s_t)/mu(a_t|s_t)`` and ``W = prod_t rho_t``, and ``C = threshold``:
    ``"none"``: 1; ``"token_tis"``: ``min(rho_t, C)`` (verl ``rollout_is="token"``, TRL
    ``token_truncate``); ``"token_mis"``: ``rho_t`` if ``rho_t <= C`` else 0 (TRL ``token_mask``);
    ``"seq_is"``: ``W``; ``"seq_tis"``: ``min(W, C)`` (verl ``rollout_is="sequence"``, TRL
    ``sequence_truncate``); ``"seq_mis"``: ``W`` if ``W <= C`` else 0 (TRL ``sequence_mask``).
    """
    space = _check_space(space)
    _check_choice("correction", correction, IS_CORRECTIONS)
    C = _check_positive("threshold", threshold)
    lp = seqkl.token_logprobs(space, _check_table("learner_logits", learner_logits, space).detach())
    lm = seqkl.token_logprobs(space, _check_table("sampler_logits", sampler_logits, space).detach())
    mask = space.mask
    rho = torch.where(mask, (lp - lm).exp(), torch.zeros_like(lp))
    W = (lp - lm).sum(1, keepdim=True).exp().expand_as(lp)
    if correction == "none":
        c = torch.ones_like(lp)
    elif correction == "token_tis":
        c = rho.clamp(max=C)
    elif correction == "token_mis":
        c = torch.where(rho <= C, rho, torch.zeros_like(rho))
    elif correction == "seq_is":
        c = W
    elif correction == "seq_tis":
        c = W.clamp(max=C)
    else:
        c = torch.where(W <= C, W, torch.zeros_like(W))
    return torch.where(mask, c, torch.zeros_like(c))


_check_advantage = seqkl.check_advantage


def _pg_gradient(space, logits, sampler_logits, advantage, correction, threshold, weight_of_sequence):
    theta = _leaf(_check_table("logits", logits, space))
    c = correction_weights(space, theta, sampler_logits, correction, threshold)
    a = _check_advantage(space, advantage).to(theta.dtype)
    lp = seqkl.token_logprobs(space, theta)
    value = (weight_of_sequence * a * (c * lp).sum(1)).sum()
    return torch.autograd.grad(value, theta)[0]


def expected_pg_gradient(space: seqkl.SequenceSpace, logits: torch.Tensor, sampler_logits: torch.Tensor,
                         advantage, correction: str = "none", threshold: float = 2.0) -> torch.Tensor:
    """``E_{y ~ mu}[ A(y) sum_t c_t grad log pi_theta(a_t|s_t) ]`` exactly, w.r.t. the logits table.

    ``A`` holds one advantage per sequence (a reward minus a constant baseline); ``c_t`` is
    :func:`correction_weights`. With ``"seq_is"`` it equals ``grad E_{pi_theta}[A]`` (the
    learner's true policy gradient); the others are biased when ``mu != pi_theta``.
    """
    space = _check_space(space)
    mu = _sequence_probs(space, _check_table("sampler_logits", sampler_logits, space))
    return _pg_gradient(space, logits, sampler_logits, advantage, correction, threshold, mu)


def sampled_pg_gradient(space: seqkl.SequenceSpace, logits: torch.Tensor, sampler_logits: torch.Tensor,
                        advantage, index: torch.Tensor, correction: str = "none",
                        threshold: float = 2.0) -> torch.Tensor:
    """The batch estimate ``(1/n) sum_i A(y_i) sum_t c_t grad log pi_theta`` for the responses
    ``index`` (into ``space.sequences``, sampled from ``mu``, e.g. by :func:`seqkl.sample`)."""
    space = _check_space(space)
    if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.numel() == 0:
        raise ValueError("index: expected a non-empty 1-D tensor of sequence indices")
    if int(index.min()) < 0 or int(index.max()) >= space.n_sequences:
        raise ValueError(f"index: sequence indices must lie in [0, {space.n_sequences})")
    counts = torch.bincount(index, minlength=space.n_sequences).to(torch.float64) / index.numel()
    return _pg_gradient(space, logits, sampler_logits, advantage, correction, threshold, counts)


# --------------------------------------------------------------------------- 3. trust regions
def gspo_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence ratio ``(pi_theta(y)/pi_old(y)) ** (1/|y|)`` = ``exp(mean_t log rho_t)``, [B].

    ``logprobs``, ``old_logprobs``: [B, T] per-token log-probabilities; ``mask``: [B, T], True on
    real tokens (each row needs at least one). Differentiable in ``logprobs``.
    """
    if not all(isinstance(x, torch.Tensor) for x in (logprobs, old_logprobs, mask)):
        raise ValueError("logprobs, old_logprobs, mask: expected torch tensors")
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape or logprobs.dim() != 2:
        raise ValueError(f"logprobs, old_logprobs, mask: expected three [B, T] tensors of one shape, got "
                         f"{list(logprobs.shape)}, {list(old_logprobs.shape)}, {list(mask.shape)}")
    m = mask.bool()
    n = m.sum(1)
    if bool((n == 0).any()):
        raise ValueError("mask: every row needs at least one real token")
    lr = torch.where(m, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    return (lr.sum(1) / n.to(lr.dtype)).exp()


def trust_region_mask(prob: torch.Tensor, old_prob: torch.Tensor, advantage: torch.Tensor, rule: str = "ratio",
                      low: float = 0.2, high: float = 0.2) -> torch.Tensor:
    """Which sampled tokens keep their policy gradient, as a bool tensor shaped like ``prob``.

    ``prob`` = pi_theta(a_t|s_t) and ``old_prob`` = pi_old(a_t|s_t) of the sampled tokens,
    ``advantage`` their advantages (broadcastable). A token is dropped when it has already
    moved too far *in the direction its advantage pushes it*:

    - ``"ratio"`` (PPO/GRPO clipping): ``rho > 1 + high`` with ``A > 0``, ``rho < 1 - low`` with ``A < 0``;
    - ``"tv"`` (DPPO binary TV): ``pi - pi_old > high`` with ``A > 0``, ``pi - pi_old < -low`` with ``A < 0``;
    - ``"binary_kl"`` (DPPO binary KL): the KL between the two Bernoulli distributions
      ``(pi_old, 1 - pi_old)`` and ``(pi, 1 - pi)`` exceeds ``high`` while ``pi > pi_old``
      with ``A > 0``, or exceeds ``low`` while ``pi < pi_old`` with ``A < 0``.

    These follow the authors' code (sail-sg/Stable-RL, ``_compute_token_mask_for_policy_loss``).
    """
    _check_choice("rule", rule, TRUST_REGION_RULES)
    low, high = _check_positive("low", low), _check_positive("high", high)
    if not isinstance(prob, torch.Tensor) or not isinstance(old_prob, torch.Tensor):
        raise ValueError("prob, old_prob: expected torch tensors")
    for name, x in (("prob", prob), ("old_prob", old_prob)):
        x = x.detach()
        if not bool(((x >= 0) & (x <= 1)).all()):
            raise ValueError(f"{name}: probabilities must lie in [0, 1]")
    p, q = prob.detach(), old_prob.detach()
    a = torch.as_tensor(advantage, dtype=p.dtype).expand_as(p) if not isinstance(advantage, torch.Tensor) \
        else advantage.detach().to(p.dtype).expand_as(p)
    if rule == "ratio":
        rho = p / q
        up, down = rho > 1 + high, rho < 1 - low
    elif rule == "tv":
        up, down = (p - q) > high, (p - q) < -low
    else:
        eps = 1e-12
        kl = q * (torch.log(q + eps) - torch.log(p + eps)) + \
            (1 - q) * (torch.log(1 - q + eps) - torch.log(1 - p + eps))
        up, down = (kl > high) & (p > q), (kl > low) & (p < q)
    dropped = torch.where(a > 0, up, torch.where(a < 0, down, torch.zeros_like(up)))
    return ~dropped


def masked_pg_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantage: torch.Tensor,
                   keep: torch.Tensor) -> torch.Tensor:
    """``-mean(A * rho.detach() * keep * log pi_theta)`` over the tokens: its gradient is
    ``-mean(keep * A * grad rho)``, PPO's clipped-objective gradient when ``keep`` is the
    ``"ratio"`` mask of :func:`trust_region_mask`, DPPO's with a ``"tv"`` or ``"binary_kl"`` mask."""
    if not all(isinstance(x, torch.Tensor) for x in (logprobs, old_logprobs, keep)):
        raise ValueError("logprobs, old_logprobs, keep: expected torch tensors")
    if logprobs.shape != old_logprobs.shape or logprobs.shape != keep.shape:
        raise ValueError("logprobs, old_logprobs, keep: expected tensors of one shape")
    a = torch.as_tensor(advantage, dtype=logprobs.dtype)
    rho = (logprobs - old_logprobs.detach()).exp().detach()
    return -(a * rho * keep.to(logprobs.dtype) * logprobs).mean()


def bandit_run(ref_logits: torch.Tensor, reward: torch.Tensor, rule: str = "ratio", low: float = 0.2,
               high: float = 0.2, iterations: int = 30, batch: int = 256, epochs: int = 8,
               lr: float = 0.05, seed: int = 0) -> dict[str, list[float]]:
    """Train a one-position softmax policy (logits started at ``ref_logits``) on a reward per token.

    Each iteration samples ``batch`` tokens from the current policy ``pi_old``, takes
    advantages ``A = r - mean(r)`` over the batch (GRPO's group baseline, without the
    division by the standard deviation), and takes ``epochs`` Adam steps (learning rate
    ``lr``, state kept across iterations) on :func:`masked_pg_loss` with the mask of
    :func:`trust_region_mask` under ``rule`` (``low``, ``high``), recomputed at every step.

    Returns per iteration: ``reward`` (exact ``E_pi[r]`` after the update), ``kl_step``
    (exact ``KL(pi_old || pi_new)`` of the update, the divergence ch03's trust region bounds),
    ``tv_step`` (exact total variation of the update) and ``kept`` (fraction of the batch's
    tokens with a non-zero advantage that kept their gradient at the last step).
    """
    _check_choice("rule", rule, TRUST_REGION_RULES)
    if not isinstance(ref_logits, torch.Tensor) or ref_logits.dim() != 1:
        raise ValueError("ref_logits: expected a 1-D tensor of logits")
    r = torch.as_tensor(reward, dtype=torch.float64)
    if r.shape != ref_logits.shape:
        raise ValueError(f"reward: expected shape {list(ref_logits.shape)}, got {list(r.shape)}")
    for name, v in (("iterations", iterations), ("batch", batch), ("epochs", epochs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
    lr = _check_positive("lr", lr)
    g = torch.Generator().manual_seed(int(seed))
    theta = ref_logits.detach().double().clone().requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr)
    hist: dict[str, list[float]] = {"reward": [], "kl_step": [], "tv_step": [], "kept": []}
    for _ in range(iterations):
        with torch.no_grad():
            logp_old = torch.log_softmax(theta, -1).clone()
        a = torch.multinomial(logp_old.exp(), batch, replacement=True, generator=g)
        adv = r[a] - r[a].mean()
        kept = 1.0
        for _ in range(epochs):
            logp = torch.log_softmax(theta, -1)
            keep = trust_region_mask(logp[a].exp(), logp_old[a].exp(), adv, rule, low, high)
            loss = masked_pg_loss(logp[a], logp_old[a], adv, keep)
            opt.zero_grad()
            loss.backward()
            opt.step()
            active = adv != 0
            kept = float(keep[active].double().mean()) if bool(active.any()) else 1.0
        with torch.no_grad():
            logp = torch.log_softmax(theta, -1)
            p_old, p = logp_old.exp(), logp.exp()
            hist["reward"].append(float((p * r).sum()))
            hist["kl_step"].append(float(kl_from_log_probs(logp_old, logp)))
            hist["tv_step"].append(float(0.5 * (p_old - p).abs().sum()))
            hist["kept"].append(kept)
    return hist


# --------------------------------------------------------------------------- 4. on-policy distillation
def _check_discount(discount) -> float:
    try:
        gamma = float(discount)
    except (TypeError, ValueError):
        raise ValueError(f"discount: expected a number in [0, 1], got {discount!r}") from None
    if not (0.0 <= gamma <= 1.0):
        raise ValueError(f"discount: must lie in [0, 1], got {gamma}")
    return gamma


def distillation_advantages(logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor,
                            discount: float = 0.0) -> torch.Tensor:
    """Per-token advantages of on-policy distillation, [N, T], detached; ``0`` on pads.

    ``A_t = -sum_{u >= t} gamma^(u-t) k1_u`` with ``k1_u = log pi_theta(a_u|s_u) - log pi_T(a_u|s_u)``
    (the student's and the teacher's log-probabilities of the sampled tokens) and ``gamma = discount``.
    ``discount=0`` gives ``A_t = -k1_t`` (tinker-cookbook's default ``kl_discount_factor=0``);
    ``discount=1`` gives minus the log-ratio to go, the return whose policy gradient is the exact
    gradient of the sequence-level reverse KL.
    """
    gamma = _check_discount(discount)
    for name, x in (("logprobs", logprobs), ("teacher_logprobs", teacher_logprobs)):
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError(f"{name}: expected a 2-D tensor [N, T]")
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != logprobs.shape:
        raise ValueError(f"mask: expected a boolean tensor of shape {list(logprobs.shape)}")
    k = kl_per_token(logprobs.detach(), teacher_logprobs.detach(), "k1")
    k = torch.where(mask, k, torch.zeros_like(k))
    out = torch.zeros_like(k)
    running = torch.zeros_like(k[:, 0])
    for t in range(k.shape[1] - 1, -1, -1):
        running = k[:, t] + gamma * running
        out[:, t] = running
    return -out


def distillation_surrogate(space: seqkl.SequenceSpace, logits: torch.Tensor, teacher_logits: torch.Tensor,
                           discount: float = 0.0) -> torch.Tensor:
    """One loss value per sequence, [N]: ``-sum_t A_t log pi_theta(a_t|s_t)`` with ``A_t`` detached.

    Its gradient for a response the student sampled is that response's distillation gradient
    (descending it moves the student towards the teacher ``teacher_logits``).
    """
    space = _check_space(space)
    lp = seqkl.token_logprobs(space, _check_table("logits", logits, space))
    lt = seqkl.token_logprobs(space, _check_table("teacher_logits", teacher_logits, space)).detach()
    adv = distillation_advantages(lp, lt, space.mask, discount)
    return -(adv * lp).sum(1)


def _distillation_gradient(space, logits, teacher_logits, discount, weight_of_sequence):
    theta = _leaf(_check_table("logits", logits, space))
    value = (weight_of_sequence * distillation_surrogate(space, theta, teacher_logits, discount)).sum()
    return torch.autograd.grad(value, theta)[0]


def expected_distillation_gradient(space: seqkl.SequenceSpace, logits: torch.Tensor,
                                   teacher_logits: torch.Tensor, discount: float = 0.0) -> torch.Tensor:
    """``E_{y ~ pi_theta}[ -sum_t A_t grad log pi_theta(a_t|s_t) ]`` exactly, w.r.t. the logits table.

    ``discount=1``: ``grad KL(pi_theta || pi_T)`` of whole responses. ``discount=0``: the partial
    gradient ``sum_t E_{s_t ~ pi_theta}[grad KL(pi_theta(.|s_t) || pi_T(.|s_t))]``, which is the
    first one only when every response has one token.
    """
    space = _check_space(space)
    mu = _sequence_probs(space, _check_table("logits", logits, space))
    return _distillation_gradient(space, logits, teacher_logits, discount, mu)


def sampled_distillation_gradient(space: seqkl.SequenceSpace, logits: torch.Tensor,
                                  teacher_logits: torch.Tensor, n: int, discount: float = 0.0,
                                  seed: int | torch.Generator = 0) -> torch.Tensor:
    """The batch estimate from ``n`` responses the student samples (:func:`seqkl.sample`)."""
    space = _check_space(space)
    _check_table("logits", logits, space)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected an integer >= 1, got {n!r}")
    index = seqkl.sample(space, logits, n, seed)
    counts = torch.bincount(index, minlength=space.n_sequences).to(logits.dtype) / n
    return _distillation_gradient(space, logits, teacher_logits, discount, counts)


def distillation_gradient_variance(space: seqkl.SequenceSpace, logits: torch.Tensor,
                                   teacher_logits: torch.Tensor, discount: float = 0.0) -> float:
    """The exact total variance ``E_{y ~ pi_theta}||g(y) - g||^2`` of one response's gradient ``g(y)``.

    ``g`` is :func:`expected_distillation_gradient`; a batch of ``n`` responses has ``1/n`` of it.
    """
    space = _check_space(space)
    theta = _check_table("logits", logits, space).detach()
    teacher = _check_table("teacher_logits", teacher_logits, space).detach()
    _check_discount(discount)
    per_seq = torch.autograd.functional.jacobian(
        lambda x: distillation_surrogate(space, x, teacher, discount), theta, vectorize=True)
    mu = _sequence_probs(space, theta)
    mean = torch.einsum("n,n...->...", mu, per_seq)
    return float(torch.einsum("n,n...->", mu, (per_seq - mean) ** 2))


def distill_run(space: seqkl.SequenceSpace, teacher_logits: torch.Tensor, start_logits: torch.Tensor,
                discount: float = 0.0, steps: int = 100, batch: int = 16, lr: float = 0.1,
                seed: int = 0) -> dict[str, list[float]]:
    """Train a tabular student (logits started at ``start_logits``) towards ``teacher_logits``.

    Each step samples ``batch`` responses from the current student and takes one Adam step
    (learning rate ``lr``) along :func:`sampled_distillation_gradient` with ``discount``.
    Returns ``kl``: the exact ``KL(pi_theta || pi_T)`` of whole responses at the start and after
    every step (``steps + 1`` values).
    """
    space = _check_space(space)
    teacher = _check_table("teacher_logits", teacher_logits, space).detach()
    theta = _leaf(_check_table("start_logits", start_logits, space))
    _check_discount(discount)
    for name, v in (("steps", steps), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
    lr = _check_positive("lr", lr)
    g = torch.Generator().manual_seed(int(seed))
    opt = torch.optim.Adam([theta], lr=lr)
    hist: dict[str, list[float]] = {"kl": []}

    def record():
        hist["kl"].append(float(seqkl.exact_kl(space, theta.detach(), teacher)))

    record()
    for _ in range(steps):
        grad = sampled_distillation_gradient(space, theta.detach(), teacher, batch, discount, g)
        opt.zero_grad()
        theta.grad = grad
        opt.step()
        record()
    return hist
