"""Argument checks shared by the RLHF modules (rewards, PPO, GRPO, distillation).

Every check raises ``ValueError`` naming the argument and what is wrong, and returns the
value in the form the caller computes with (a bool mask, a list of prompts).
"""
from __future__ import annotations

import numbers
from typing import Sequence

import torch

__all__ = ["check_mask", "check_batch_tensor", "check_logprob_pair", "check_logits_pair", "check_prompts",
           "check_seeds"]


def check_mask(response_mask: torch.Tensor, shape: Sequence[int] | None = None) -> torch.Tensor:
    """Validate a [B, T] 0/1 response mask (every row with a real token) and return it as bool."""
    if not isinstance(response_mask, torch.Tensor):
        raise ValueError(f"response_mask: expected a torch.Tensor, got {type(response_mask).__name__}")
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask: expected shape [B, T], got {tuple(response_mask.shape)}")
    if shape is not None and tuple(response_mask.shape) != tuple(shape):
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


def check_batch_tensor(name: str, x: torch.Tensor) -> None:
    """``x`` is a [B, T] tensor (per-token log-probabilities, rewards, values)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name}: expected shape [B, T], got {tuple(x.shape)}")


def check_logprob_pair(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> None:
    """Both per-token log-prob tensors [B, T] and of the same shape."""
    check_batch_tensor("logprobs", logprobs)
    check_batch_tensor("ref_logprobs", ref_logprobs)
    if ref_logprobs.shape != logprobs.shape:
        raise ValueError(
            f"ref_logprobs: shape {tuple(ref_logprobs.shape)} does not match logprobs "
            f"shape {tuple(logprobs.shape)}"
        )


def check_logits_pair(name: str, logits: torch.Tensor, other_name: str, other: torch.Tensor) -> None:
    """Both logits tensors [B, T, V] and of the same shape."""
    for n, x in ((name, logits), (other_name, other)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{n}: expected a [B, T, V] tensor, got {shape}")
    if other.shape != logits.shape:
        raise ValueError(f"{other_name}: shape {tuple(other.shape)} does not match {name} "
                         f"shape {tuple(logits.shape)}")


def check_prompts(pipeline, prompts: Sequence[str] | None) -> list:
    """The prompts to sample from: ``pipeline.prompts`` when ``None``, else a non-empty list of strings."""
    if prompts is None:
        return list(pipeline.prompts)
    if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts: must be a sequence of strings")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts: need at least one prompt")
    return prompts


def check_seeds(seeds: Sequence[int]) -> list[int]:
    """Validate a non-empty sequence of distinct integer seeds (numpy integers too, never
    booleans) and return it as a list of ``int``."""
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
        raise ValueError(f"seeds: must be a sequence of integers, got {seeds!r}")
    seeds = list(seeds)
    if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"seeds: must be a sequence of integers, got {seeds!r}")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds: need at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: must be distinct, got {seeds}")
    return seeds
