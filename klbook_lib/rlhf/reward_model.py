"""A Bradley-Terry reward model: a GPT-2 backbone with a scalar head, trained on preference pairs.

The Bradley-Terry model says a labeller prefers response ``y_w`` to ``y_l`` with
probability ``sigmoid(r(x, y_w) - r(x, y_l))``; the reward model ``r_phi`` is fitted by
minimising ``-log sigmoid(r_phi(x, y_w) - r_phi(x, y_l))`` over labelled pairs
(Ziegler et al. 2019; Ouyang et al. 2022). The score of a text is the head's value at
its last token, the EOS token for a finished response.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .data import PreferencePair
from .models import ScalarHeadModel, encode_texts


def score_texts(reward_model: ScalarHeadModel, tokenizer, texts: Sequence[str],
                batch_size: int = 256, device: str | torch.device | None = None) -> torch.Tensor:
    """Reward-model scores ``[N]`` of full texts (``bos + text + eos``), without gradients."""
    if device is None:
        device = next(reward_model.parameters()).device
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            ids, mask = encode_texts(tokenizer, texts[i:i + batch_size], device=device)
            out.append(reward_model.score(ids, mask).float().cpu())
    return torch.cat(out) if out else torch.empty(0)


def pairwise_accuracy(reward_model: ScalarHeadModel, tokenizer, pairs: Sequence[PreferencePair]) -> float:
    """Fraction of pairs whose chosen response the reward model scores higher than the rejected one."""
    if len(pairs) == 0:
        raise ValueError("pairs: need at least one pair")
    sc = score_texts(reward_model, tokenizer, [p.prompt + p.chosen for p in pairs])
    sr = score_texts(reward_model, tokenizer, [p.prompt + p.rejected for p in pairs])
    return float((sc > sr).float().mean())


def bradley_terry_loss(score_chosen: torch.Tensor, score_rejected: torch.Tensor) -> torch.Tensor:
    """Mean ``-log sigmoid(r_w - r_l)``: the negative log-likelihood of the Bradley-Terry model."""
    if score_chosen.shape != score_rejected.shape:
        raise ValueError(f"score_chosen and score_rejected: shapes differ, "
                         f"{tuple(score_chosen.shape)} vs {tuple(score_rejected.shape)}")
    return -F.logsigmoid(score_chosen - score_rejected).mean()


def train_reward_model(policy, tokenizer, train_pairs: Sequence[PreferencePair],
                       heldout_pairs: Sequence[PreferencePair] | None = None, steps: int = 150,
                       batch_size: int = 64, lr: float = 1e-3, seed: int = 0,
                       device: str | torch.device = "cpu", progress: bool = True,
                       eval_every: int = 50) -> tuple[ScalarHeadModel, list[dict]]:
    """Fit a reward model, its backbone initialised from ``policy`` (the SFT model).

    Returns ``(reward_model, history)``; history rows hold ``step``, ``loss``,
    ``train_accuracy`` (on the minibatch) and, every ``eval_every`` steps and at the end,
    ``heldout_accuracy``. Scores are normalised after training to mean 0 and standard
    deviation 1 over the training responses (a shift and scale of the head: pairwise
    preferences are unchanged).
    """
    if len(train_pairs) == 0:
        raise ValueError("train_pairs: need at least one pair")
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size: must be >= 1, got {steps} and {batch_size}")
    torch.manual_seed(seed)
    rm = ScalarHeadModel.from_policy(policy).to(device).train()
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(rm.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    history = []
    for step in tqdm(range(steps), desc="reward model", disable=not progress):
        idx = torch.randint(len(train_pairs), (batch_size,), generator=g).tolist()
        batch = [train_pairs[i] for i in idx]
        ids, mask = encode_texts(tokenizer, [p.prompt + p.chosen for p in batch]
                                 + [p.prompt + p.rejected for p in batch], device=device)
        s = rm.score(ids, mask)
        sc, sr = s[:batch_size], s[batch_size:]
        loss = bradley_terry_loss(sc, sr)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(rm.parameters(), 1.0)
        opt.step()
        sched.step()
        row = {"step": step, "loss": float(loss.detach()), "train_accuracy": float((sc > sr).float().mean())}
        if heldout_pairs and ((step + 1) % eval_every == 0 or step == steps - 1):
            rm.eval()
            row["heldout_accuracy"] = pairwise_accuracy(rm, tokenizer, heldout_pairs)
            rm.train()
        history.append(row)
    rm.eval()
    # normalise the head: mean 0, std 1 over the training responses
    texts = [t for p in train_pairs[:1000] for t in (p.prompt + p.chosen, p.prompt + p.rejected)]
    scores = score_texts(rm, tokenizer, texts)
    mu, sd = float(scores.mean()), float(scores.std())
    with torch.no_grad():
        rm.head.weight.div_(sd)
        rm.head.bias.sub_(mu).div_(sd)
    for p in rm.parameters():
        p.requires_grad_(False)
    return rm, history
