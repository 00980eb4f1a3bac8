"""Objectives of the book that several modules use, each written once.

``dpo_loss``   the DPO loss of a batch of preference pairs and its implicit rewards
               (Rafailov et al. 2023; the derivation is in :mod:`klbook_lib.dpo`, whose trainer
               and chapter 15's tabular preference links in :mod:`klbook_lib.shape` both call it)

A formula lives here when code on both sides of the book's layers needs it: the tabular
mathematics (``shape``, ``optimal``) must not import the language-model trainers for it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["dpo_loss"]


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    reduction: str = "mean",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The DPO loss of a batch of pairs and the implicit rewards.

    Inputs are sequence log-probabilities ``log pi(y|x)`` (summed over the response's
    tokens), one per pair, shape ``[B]``. Returns ``(loss, chosen_rewards,
    rejected_rewards)``: ``loss`` is the batch mean of
    ``-log sigmoid(beta * ((pc - rc) - (pr - rr)))`` (a scalar with gradients), and the
    rewards ``beta * (pc - rc)`` and ``beta * (pr - rr)`` are ``[B]`` tensors detached
    from the graph (for logging). Only the policy log-probs should require gradients;
    the reference ones are constants. ``reduction="none"`` returns the per-pair losses
    ``[B]`` instead of their mean (``"sum"``: their sum), e.g. to weight pairs.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction: must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta: must be a finite number > 0, got {beta!r}")
    names = ("policy_chosen_logps", "policy_rejected_logps", "ref_chosen_logps", "ref_rejected_logps")
    tensors = (policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps)
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 1:
            raise ValueError(f"{name}: must be 1-D (one log-prob per pair), got shape {tuple(t.shape)}")
        if t.shape != policy_chosen_logps.shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)} differs from policy_chosen_logps "
                             f"shape {tuple(policy_chosen_logps.shape)}")
        if t.numel() == 0:
            raise ValueError(f"{name}: empty batch")
    chosen_log_ratio = policy_chosen_logps - ref_chosen_logps
    rejected_log_ratio = policy_rejected_logps - ref_rejected_logps
    logits = beta * (chosen_log_ratio - rejected_log_ratio)
    losses = -F.logsigmoid(logits)
    loss = losses.mean() if reduction == "mean" else losses.sum() if reduction == "sum" else losses
    return loss, (beta * chosen_log_ratio).detach(), (beta * rejected_log_ratio).detach()
