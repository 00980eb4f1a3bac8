"""Direct preference optimisation (DPO): the KL-regularised optimum fitted from preference pairs.

For one prompt ``x`` the maximiser of ``E_pi[r] - beta KL(pi || pi_ref)`` is
``pi*(y|x) = pi_ref(y|x) exp(r(x,y)/beta) / Z(x)`` (:mod:`klbook_lib.optimal`). Solved for
the reward, ``r(x,y) = beta log(pi*(y|x)/pi_ref(y|x)) + beta log Z(x)``. In the
Bradley-Terry model a labeller prefers ``y_w`` to ``y_l`` with probability
``sigmoid(r(x,y_w) - r(x,y_l))``, in which ``beta log Z(x)`` cancels. Replacing ``pi*`` by
the policy ``pi_theta`` and maximising the likelihood of the labels gives the DPO loss
(Rafailov et al. 2023)

    L = -log sigmoid( beta [ (log pi_theta(y_w|x) - log pi_ref(y_w|x))
                             - (log pi_theta(y_l|x) - log pi_ref(y_l|x)) ] ),

whose *implicit rewards* are ``beta log(pi_theta(y|x) / pi_ref(y|x))``. No reward model is
trained and no response is sampled during training.

The module has the loss (:func:`dpo_loss`, written in :mod:`klbook_lib.objectives`), the sequence log-probabilities it needs
(:func:`sequence_logps`), the batching of preference pairs (:func:`encode_pairs`) and a
trainer for the tiny GPT-2 demo of :mod:`klbook_lib.rlhf` (:func:`train_dpo`), and
:func:`train_dpo_seeds`, which trains many seeds in one process and computes the reference
log-probabilities of the pairs once for all of them (each seed equals :func:`train_dpo` alone).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch
from tqdm import tqdm

# the loss is written in klbook_lib.objectives (the tabular code of chapter 15 calls it without
# importing this trainer); it is re-exported here, where the book introduces it
from .objectives import dpo_loss

__all__ = [
    "dpo_loss",
    "sequence_logps",
    "encode_pairs",
    "pair_logps",
    "implicit_reward_accuracy",
    "DPOConfig",
    "DPOResult",
    "train_dpo",
    "train_dpo_seeds",
]


# --------------------------------------------------------------------------- log-probabilities

def sequence_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   response_mask: torch.Tensor) -> torch.Tensor:
    """``log pi(y|x)``: the sum of the log-probabilities of the tokens marked by ``response_mask``.

    ``input_ids``, ``attention_mask`` and ``response_mask`` are ``[B, T]``;
    ``response_mask[b, t] = 1`` means token ``t`` of row ``b`` belongs to the response
    and its log-probability given tokens ``0..t-1`` is added. Position ids count only
    attended tokens, so left or right padding gives the same result. Works for any
    causal language model that returns ``.logits`` (e.g. ``GPT2LMHeadModel``).
    """
    for name, t in (("input_ids", input_ids), ("attention_mask", attention_mask), ("response_mask", response_mask)):
        if not isinstance(t, torch.Tensor) or t.ndim != 2:
            raise ValueError(f"{name}: must be a 2-D tensor [B, T]")
    if attention_mask.shape != input_ids.shape or response_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask and response_mask: must have the shape of input_ids "
                         f"{tuple(input_ids.shape)}, got {tuple(attention_mask.shape)} and "
                         f"{tuple(response_mask.shape)}")
    if bool((response_mask[:, 0] != 0).any()):
        raise ValueError("response_mask: the first token has no context and cannot be scored; "
                         "a response must follow at least one prompt (or BOS) token")
    if bool(((response_mask != 0) & (attention_mask == 0)).any()):
        raise ValueError("response_mask: marks padding tokens (attention_mask is 0 there)")
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    token_logp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return (token_logp * response_mask[:, 1:].to(token_logp.dtype)).sum(-1)


@dataclass
class PairBatch:
    """Chosen and rejected sequences of a batch of pairs, stacked as ``[2B, T]`` (chosen first)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    n_pairs: int


def encode_pairs(tokenizer, pairs: Sequence, device: str | torch.device = "cpu") -> PairBatch:
    """Tokenise ``bos + prompt + response + eos`` for the chosen and the rejected response of each pair.

    ``pairs`` hold ``prompt``, ``chosen`` and ``rejected`` strings (e.g.
    :class:`klbook_lib.rlhf.data.PreferencePair`). Prompt and response are encoded
    separately and concatenated, as when the policy samples a response after a prompt;
    the response mask covers the response tokens and the EOS token. Right-padded.
    """
    if len(pairs) == 0:
        raise ValueError("pairs: need at least one preference pair")
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    if bos is None or eos is None or pad is None:
        raise ValueError("tokenizer: bos, eos and pad token ids must all be set")
    rows, resp = [], []
    for side in ("chosen", "rejected"):
        for p in pairs:
            prompt_ids = [bos] + tokenizer.encode(p.prompt, add_special_tokens=False)
            response_ids = tokenizer.encode(getattr(p, side), add_special_tokens=False) + [eos]
            rows.append(prompt_ids + response_ids)
            resp.append([0] * len(prompt_ids) + [1] * len(response_ids))
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    att = torch.zeros((len(rows), T), dtype=torch.long)
    rmask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, (r, m) in enumerate(zip(rows, resp)):
        ids[i, :len(r)] = torch.tensor(r)
        att[i, :len(r)] = 1
        rmask[i, :len(r)] = torch.tensor(m)
    return PairBatch(ids.to(device), att.to(device), rmask.to(device), len(pairs))


def pair_logps(model, batch: PairBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log pi(y_w|x), log pi(y_l|x))``, each ``[B]``, in one forward pass."""
    lp = sequence_logps(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    return lp[:batch.n_pairs], lp[batch.n_pairs:]


@torch.no_grad()
def _logps_in_chunks(model, tokenizer, pairs, device, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    cs, rs = [], []
    for i in range(0, len(pairs), chunk):
        c, r = pair_logps(model, encode_pairs(tokenizer, pairs[i:i + chunk], device))
        cs.append(c.cpu())
        rs.append(r.cpu())
    return torch.cat(cs), torch.cat(rs)


def implicit_reward_accuracy(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> float:
    """Fraction of pairs whose chosen response has the larger implicit reward (ties count 1/2).

    Counting ties as one half makes the untrained policy (``pi_theta = pi_ref``, all
    implicit rewards 0) score exactly 0.5, the accuracy of a coin.
    """
    if chosen_rewards.shape != rejected_rewards.shape:
        raise ValueError(f"chosen_rewards and rejected_rewards: shapes differ, "
                         f"{tuple(chosen_rewards.shape)} vs {tuple(rejected_rewards.shape)}")
    win = (chosen_rewards > rejected_rewards).float()
    tie = (chosen_rewards == rejected_rewards).float()
    return float((win + 0.5 * tie).mean())


# --------------------------------------------------------------------------- training

@dataclass
class DPOConfig:
    """Hyperparameters of :func:`train_dpo` (defaults sized for the ``tiny`` preset on a CPU)."""

    batch_size: int = 64
    lr: float = 1e-3
    max_grad_norm: float = 1.0
    eval_every: int = 25
    n_eval_samples: int = 128      # sampled responses per evaluation (KL, scores, true reward)
    eval_seed: int = 1234
    max_new_tokens: int = 16
    heldout_every_eval: bool = True   # False: the held-out accuracy in the last evaluation only

    def check(self) -> "DPOConfig":
        for name in ("batch_size", "eval_every", "n_eval_samples", "max_new_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
        for name in ("lr", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)!r}")
        return self


@dataclass
class DPOResult:
    """What :func:`train_dpo` returns.

    ``history`` has one dict per step (``step``, ``loss``, ``reward_accuracy`` on the
    batch, ``chosen_reward``, ``rejected_reward``, ``margin``, ``seconds``); ``evals`` one
    dict per evaluation (``step``, ``heldout_accuracy`` of the implicit reward on the
    held-out pairs, and the sampled-response statistics of
    :func:`klbook_lib.rlhf.ppo.measure`: ``kl_exact_seq``, ``score``, ``true_reward``,
    ...). ``checkpoints`` maps an evaluation step to the policy's ``state_dict`` when
    ``keep_checkpoints`` was set.
    """

    policy: object
    history: list
    evals: list
    config: DPOConfig
    beta: float
    seed: int
    seconds: float
    checkpoints: dict = field(default_factory=dict)

    def columns(self, which: str = "history") -> dict:
        """``history`` or ``evals`` as a dict of lists."""
        rows = getattr(self, which)
        return {k: [r.get(k) for r in rows] for k in rows[0]} if rows else {}


def _custom_dpo_loss(loss_fn, pc, pr, rc, rr, beta: float) -> torch.Tensor:
    """The mean of ``loss_fn``'s per-pair losses, checked to be a finite tensor with a gradient."""
    out = loss_fn(pc, pr, rc, rr, beta)
    if not isinstance(out, torch.Tensor) or out.numel() not in (1, pc.numel()):
        raise ValueError(f"loss_fn: must return a tensor of {pc.numel()} per-pair losses or their mean, got "
                         f"{type(out).__name__}{tuple(out.shape) if isinstance(out, torch.Tensor) else ''}")
    if not out.requires_grad:
        raise ValueError("loss_fn: the returned loss has no gradient with respect to the policy "
                         "(were the log-probabilities detached or converted to numpy?)")
    out = out.mean()
    if not bool(torch.isfinite(out.detach())):
        raise FloatingPointError(f"loss_fn: returned {float(out.detach())}")
    return out


def _check_run(pipeline, beta, steps, config) -> DPOConfig:
    cfg = (config or DPOConfig()).check()
    if not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta: must be a finite number > 0, got {beta!r}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: must be a positive integer, got {steps!r}")
    if not list(pipeline.train_pairs) or not list(pipeline.heldout_pairs):
        raise ValueError("pipeline: needs non-empty train_pairs and heldout_pairs")
    return cfg


def _check_seed(seed) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")


def _reference_logps(pipeline) -> tuple[torch.Tensor, ...]:
    """``log pi_ref`` of the chosen and rejected responses of the training and held-out pairs."""
    from .rlhf.models import disable_dropout

    ref = pipeline.ref_model
    disable_dropout(ref)
    device = next(ref.parameters()).device
    return (*_logps_in_chunks(ref, pipeline.tokenizer, list(pipeline.train_pairs), device),
            *_logps_in_chunks(ref, pipeline.tokenizer, list(pipeline.heldout_pairs), device))


def train_dpo(pipeline, beta: float = 0.1, steps: int = 200, seed: int = 0,
              config: DPOConfig | None = None, progress: bool = True,
              keep_checkpoints: bool = False, evaluate: bool = True, loss_fn=None) -> DPOResult:
    """Train a copy of the pipeline's ``pi_ref`` with DPO on its training preference pairs.

    ``pipeline`` is a :class:`klbook_lib.rlhf.pipeline.RLHFPipeline`; DPO uses its
    ``train_pairs`` (the pairs the reward model was trained on), ``heldout_pairs`` for
    the implicit-reward accuracy, and ``ref_model``. The reward model is used only to
    *evaluate* sampled responses, so the comparison with PPO-RLHF uses the same yardstick.
    Adam with a constant learning rate; minibatches drawn with replacement from ``seed``.
    Reference log-probabilities of all pairs are computed once. Evaluations (every
    ``eval_every`` steps, at step 0 and at the end) sample ``n_eval_samples`` responses
    with a fixed seed and report the exact ``KL(pi_theta || pi_ref)`` per sequence.
    ``loss_fn(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
    beta)``, if given, replaces :func:`dpo_loss` in the training step (e.g. an exercise's own
    loss, :mod:`klbook_grader.tasks.micro_rlhf`): it returns the per-pair losses ``[B]`` (or their
    mean), whose mean is minimised; the logged rewards are still ``beta`` times the log-ratios.
    Dropout is switched off on the policy and on ``pi_ref`` (a GPT-2 checkpoint ships with it on).
    """
    cfg = _check_run(pipeline, beta, steps, config)
    _check_seed(seed)
    t_start = time.time()
    return _train_one(pipeline, beta, steps, seed, cfg, _reference_logps(pipeline), progress,
                      keep_checkpoints, evaluate, loss_fn, t_start)


def train_dpo_seeds(pipeline, seeds: Sequence[int], beta: float = 0.1, steps: int = 200,
                    config: DPOConfig | None = None, progress: bool = False,
                    keep_checkpoints: bool = False, evaluate: bool = True) -> list[DPOResult]:
    """:func:`train_dpo` for every seed in ``seeds``, in one process; one :class:`DPOResult` per seed.

    The reference log-probabilities of all training and held-out pairs (the same for every
    seed) are computed once; apart from that each seed is exactly :func:`train_dpo` with that
    seed (the runs share no random state), so seed ``s`` of the list equals
    ``train_dpo(pipeline, beta, steps, seed=s, config=config)`` except for the timings.
    """
    from .rlhf.checks import check_seeds

    seeds = check_seeds(seeds)
    for s in seeds:
        _check_seed(s)
    cfg = _check_run(pipeline, beta, steps, config)
    ref_logps = _reference_logps(pipeline)
    out = []
    for s in tqdm(seeds, desc=f"DPO seeds beta={beta:g}", disable=not progress):
        out.append(_train_one(pipeline, beta, steps, s, cfg, ref_logps, False, keep_checkpoints,
                              evaluate, None, time.time()))
    return out


def _train_one(pipeline, beta, steps, seed, cfg, ref_logps, progress, keep_checkpoints, evaluate,
               loss_fn, t_start) -> DPOResult:
    from .rlhf.models import disable_dropout
    from .rlhf.ppo import evaluate_policy

    train_pairs, held_pairs = list(pipeline.train_pairs), list(pipeline.heldout_pairs)
    tok = pipeline.tokenizer
    ref = pipeline.ref_model
    device = next(ref.parameters()).device
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    policy = pipeline.new_policy()
    for model in (policy, ref):         # dropout off: train and eval mode give the same log-probs
        disable_dropout(model)
    ref_c, ref_r, held_ref_c, held_ref_r = ref_logps
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr)
    history: list[dict] = []
    evals: list[dict] = []
    checkpoints: dict = {}

    def run_eval(step: int) -> None:
        policy.eval()
        row = {"step": step}
        if cfg.heldout_every_eval or step == steps:
            c, r = _logps_in_chunks(policy, tok, held_pairs, device)
            _, cr, rr = dpo_loss(c, r, held_ref_c, held_ref_r, beta)
            row.update(heldout_accuracy=implicit_reward_accuracy(cr, rr), heldout_margin=float((cr - rr).mean()))
        if evaluate:
            stats, _ = evaluate_policy(pipeline, policy, n=cfg.n_eval_samples, seed=cfg.eval_seed,
                                       max_new_tokens=cfg.max_new_tokens)
            row.update(stats)
        row["elapsed"] = time.time() - t_start
        evals.append(row)
        if keep_checkpoints:
            checkpoints[step] = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        policy.train()

    run_eval(0)
    policy.train()
    for step in tqdm(range(1, steps + 1), desc=f"DPO beta={beta:g}", disable=not progress):
        t0 = time.time()
        idx = torch.randint(len(train_pairs), (cfg.batch_size,), generator=gen)
        batch = encode_pairs(tok, [train_pairs[i] for i in idx.tolist()], device)
        pc, pr = pair_logps(policy, batch)
        loss, cr, rr = dpo_loss(pc, pr, ref_c[idx].to(device), ref_r[idx].to(device), beta)
        if loss_fn is not None:        # a pluggable loss (an exercise's own) is what is minimised
            loss = _custom_dpo_loss(loss_fn, pc, pr, ref_c[idx].to(device), ref_r[idx].to(device), beta)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
        opt.step()
        history.append({"step": step, "loss": float(loss.detach()),
                        "reward_accuracy": implicit_reward_accuracy(cr, rr),
                        "chosen_reward": float(cr.mean()), "rejected_reward": float(rr.mean()),
                        "margin": float((cr - rr).mean()), "seconds": time.time() - t0})
        if step % cfg.eval_every == 0 or step == steps:
            run_eval(step)
    policy.eval()
    for p in policy.parameters():
        p.requires_grad_(False)
    return DPOResult(policy=policy, history=history, evals=evals, config=cfg, beta=float(beta),
                     seed=seed, seconds=time.time() - t_start, checkpoints=checkpoints)
