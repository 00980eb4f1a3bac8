"""PPO for RLHF on a GPT-2 policy: sampling, per-token KL rewards, GAE, clipped updates.

One iteration of :func:`train_ppo`:

1. draw ``batch_size`` prompts and sample a response to each from ``pi_theta`` *by hand*
   (softmax of ``logits / temperature``, no top-k, no top-p: the sampling distribution
   is exactly the policy whose log-probabilities enter the KL);
2. score each ``prompt + response`` with the reward model; a response that never emits
   EOS gets ``missing_eos_score`` instead (the reward model was trained on finished
   sentences only);
3. compute ``log pi_theta`` and ``log pi_ref`` of the sampled tokens at the *same*
   temperature, and the per-token reward ``R_t = -beta k(t) + 1[t = T] score``
   (:func:`klbook_lib.rlhf.rewards.per_token_rewards`);
4. values from a separate value model (initialised from the reward model), advantages by
   GAE over the response tokens (Schulman et al. 2016);
5. a few epochs of the clipped surrogate objective (Schulman et al. 2017) on minibatches.

Every iteration logs the reward-model score, the exact KL ``KL(pi_theta || pi_ref)`` summed
over the vocabulary at every sampled prefix, the k1/k3 estimates (per token and per
sequence), ``beta``, the policy entropy, the response length and the hidden true reward.

Dropout is switched off on every model :func:`train_ppo` trains or scores. Several
processes (``torchrun``) train data-parallel when ``dist=`` gets a
:class:`klbook_lib.rlhf.distributed.DataParallel`: see that module; without it (the
default) nothing changes.
"""
from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from tqdm import tqdm

from ..estimators import k3_from_log_ratio
from . import data as _data
from . import rewards as R
from .checks import check_prompts
from .models import ScalarHeadModel, disable_dropout, lm_logits, position_ids_from_mask




@dataclass
class PPOConfig:
    """Hyperparameters of the PPO-RLHF loop (defaults sized for the ``tiny`` preset on a CPU)."""

    batch_size: int = 64
    max_new_tokens: int = 16
    temperature: float = 1.0
    lr: float = 3e-4
    value_lr: float = 1e-3
    ppo_epochs: int = 2
    minibatch_size: int = 32
    clip_range: float = 0.2
    value_clip: float = 0.2
    vf_coef: float = 0.5
    gamma: float = 1.0
    lam: float = 0.95
    kl_estimator: str = "k1"
    score_clip: float | None = 5.0
    missing_eos_score: float | None = -2.0
    max_grad_norm: float = 1.0
    whiten_advantages: bool = True
    # Pluggable pieces (e.g. an exercise's own; None: the library's). ``reward_fn(logprobs,
    # ref_logprobs, scores, response_mask, beta)`` returns the [B, N] per-token rewards (it gets
    # the scores already clipped to score_clip; kl_estimator is then not used);
    # ``advantage_fn(rewards, values, response_mask, gamma, lam)`` returns ``(advantages,
    # returns)``, both [B, N]. Exercise 7 plugs its functions in here (klbook_grader.tasks.micro_rlhf).
    reward_fn: object = None
    advantage_fn: object = None

    def check(self) -> "PPOConfig":
        for name in ("reward_fn", "advantage_fn"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ValueError(f"{name}: must be callable or None, got {type(getattr(self, name)).__name__}")
        for name in ("batch_size", "max_new_tokens", "ppo_epochs", "minibatch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
        for name in ("temperature", "lr", "value_lr", "clip_range"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)!r}")
        if not 0 <= self.gamma <= 1 or not 0 <= self.lam <= 1:
            raise ValueError(f"gamma and lam: must lie in [0, 1], got {self.gamma} and {self.lam}")
        if self.kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"kl_estimator: must be 'k1', 'k2' or 'k3', got {self.kl_estimator!r}")
        if self.minibatch_size > self.batch_size:
            raise ValueError(f"minibatch_size: {self.minibatch_size} exceeds batch_size {self.batch_size}")
        return self


@dataclass
class Rollout:
    """A batch of sampled responses. Response tensors are ``[B, N]``, right-padded."""

    prompts: list
    responses: list              # decoded response texts (without EOS)
    input_ids: torch.Tensor      # [B, P + N]: left-padded bos+prompt, then the response
    attention_mask: torch.Tensor
    prompt_len: int              # P
    response_ids: torch.Tensor   # [B, N]
    response_mask: torch.Tensor  # [B, N], 1 on real response tokens (EOS included)
    has_eos: torch.Tensor        # [B] bool
    logits: torch.Tensor | None = None   # [B, N, V] sampling logits / T (keep_logits=True)


def encode_prompts(tokenizer, prompts: Sequence[str], device: str | torch.device = "cpu"):
    """``bos + prompt`` for each prompt, left-padded: ``(input_ids, attention_mask)``."""
    if len(prompts) == 0:
        raise ValueError("prompts: need at least one prompt")
    rows = [[tokenizer.bos_token_id] + tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    P = max(len(r) for r in rows)
    ids = torch.full((len(rows), P), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), P), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r):] = torch.tensor(r)
        mask[i, P - len(r):] = 1
    return ids.to(device), mask.to(device)


class _NextTokenLogits:
    """Next-token logits ``[B, V]`` of ``policy`` after ``(ids, mask)``, step by step.

    With ``use_cache`` the prompt is run once and every later step feeds only the newest
    token, with the keys and values of the earlier ones from transformers' own cache
    (``cache=``, formerly ``past_key_values``; transformers 5.24), the full attention mask
    (left pads stay masked) and explicit position ids (a left-padded row's first real token is position 0, exactly as
    :func:`~klbook_lib.rlhf.models.lm_logits` counts them). Without it every step recomputes
    the whole prefix (the sampler as it was before the cache; kept for the benchmark).
    """

    def __init__(self, policy, use_cache: bool):
        from transformers import PreTrainedModel

        # a stand-in policy (any module with lm_logits' interface) is run without a cache
        self.use_cache = use_cache and isinstance(policy, PreTrainedModel)
        self.policy, self.past = policy, None

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if not self.use_cache:
            return lm_logits(self.policy, ids, mask)[:, -1]
        pos = position_ids_from_mask(mask)
        new = slice(None) if self.past is None else slice(-1, None)   # prompt, then one token
        out = self.policy(input_ids=ids[:, new], attention_mask=mask, position_ids=pos[:, new],
                          cache=self.past, use_cache=True, logits_to_keep=1)
        self.past = out.cache
        return out.logits[:, -1]


@torch.no_grad()
def sample_responses(policy, tokenizer, prompts: Sequence[str], max_new_tokens: int = 16,
                     temperature: float = 1.0, generator: torch.Generator | None = None,
                     dist=None, use_cache: bool = True, keep_logits: bool = False) -> Rollout:
    """Sample one response per prompt from ``softmax(logits / temperature)``, token by token.

    No top-k or top-p truncation (``generate(do_sample=True)`` in transformers 5 silently
    applies ``top_k=50``). Tokens after a row's EOS are pads with mask 0. With ``dist``
    (:class:`~klbook_lib.rlhf.distributed.DataParallel`), ``prompts`` are this rank's block
    of the global batch and the draws are that block's rows of the global batch's draws.

    ``use_cache`` (default) keeps the keys and values of the prefix (a KV cache) instead of
    recomputing the whole prefix for every token; the logits agree with the uncached
    sampler's to float rounding, so the same generator draws the same tokens
    (``tests/test_rlhf_seeds.py``). ``keep_logits`` stores the sampling logits (divided by
    ``temperature``) as ``rollout.logits`` ``[B, N, V]``: they are ``log pi_theta``'s logits
    of the sampled tokens, which PPO's ``log pi_old`` can reuse (:func:`ppo_step`).
    """
    if not temperature > 0:
        raise ValueError(f"temperature: must be positive, got {temperature!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: must be >= 1, got {max_new_tokens!r}")
    device = next(policy.parameters()).device
    ids, mask = encode_prompts(tokenizer, prompts, device)
    P = ids.shape[1]
    B = ids.shape[0]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    done = torch.zeros(B, dtype=torch.bool, device=device)
    next_logits = _NextTokenLogits(policy, use_cache)
    kept = []
    for _ in range(max_new_tokens):
        logits = next_logits(ids, mask).float() / temperature
        if keep_logits:
            kept.append(logits)
        probs = torch.softmax(logits, dim=-1)
        if dist is None:
            tok = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(device)
        else:                   # this rank's rows of the global batch's draw
            tok = dist.sample_rows(probs, generator).to(device)
        tok = torch.where(done, torch.full_like(tok, pad), tok)
        ids = torch.cat([ids, tok[:, None]], dim=1)
        mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
        done = done | (tok == eos)
        if (bool(done.all()) if dist is None else dist.all_true(done)):   # with dist: every rank's rows
            break
    response_ids = ids[:, P:]
    response_mask = mask[:, P:]
    has_eos = ((response_ids == eos) & (response_mask == 1)).any(dim=1)
    texts = []
    for i in range(B):
        toks = [t for t, m in zip(response_ids[i].tolist(), response_mask[i].tolist()) if m and t != eos]
        texts.append(tokenizer.decode(toks))
    ro = Rollout(list(prompts), texts, ids, mask, P, response_ids, response_mask, has_eos)
    if keep_logits:
        ro.logits = torch.stack(kept, dim=1)
    return ro


def response_logits(model, rollout: Rollout, temperature: float = 1.0) -> torch.Tensor:
    """Logits ``[B, N, V]`` (divided by ``temperature``) that predict each response token."""
    logits = lm_logits(model, rollout.input_ids, rollout.attention_mask)
    P = rollout.prompt_len
    return logits[:, P - 1:-1].float() / temperature


def reward_scores(reward_model: ScalarHeadModel, rollout: Rollout,
                  missing_eos_score: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores, raw_scores)``: the reward model's score of each ``prompt + response``.

    ``raw_scores`` is the head at the last real token; ``scores`` replaces it by
    ``missing_eos_score`` for responses without EOS (if that is not None).
    """
    with torch.no_grad():
        raw = reward_model.score(rollout.input_ids, rollout.attention_mask).float()
    if missing_eos_score is None:
        return raw, raw
    return torch.where(rollout.has_eos, raw, torch.full_like(raw, float(missing_eos_score))), raw


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
        gamma: float = 1.0, lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over right-padded token sequences.

    ``rewards``, ``values`` and ``mask`` are ``[B, N]``; ``values[:, t]`` is ``V(s_t)``, the value
    before token t. The episode ends after the last real token (no bootstrap). Returns
    ``(advantages, returns)``, zero on pads.
    """
    if not (rewards.shape == values.shape == mask.shape):
        raise ValueError(f"rewards, values, mask: shapes differ, {tuple(rewards.shape)}, "
                         f"{tuple(values.shape)}, {tuple(mask.shape)}")
    m = mask.to(rewards.dtype)
    B, N = rewards.shape
    adv = torch.zeros_like(rewards)
    last = torch.zeros(B, dtype=rewards.dtype, device=rewards.device)
    for t in reversed(range(N)):
        m_next = m[:, t + 1] if t + 1 < N else torch.zeros_like(last)
        v_next = values[:, t + 1] * m_next if t + 1 < N else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * v_next - values[:, t]
        last = delta + gamma * lam * m_next * last
        adv[:, t] = last * m[:, t]
    returns = (adv + values) * m
    return adv, returns


def _masked_mean(x: torch.Tensor, m: torch.Tensor, dist=None) -> torch.Tensor:
    # with dist: this rank's share of the masked mean over all ranks, times the world size
    # (DistributedDataParallel averages the gradients of these shares)
    if dist is not None:
        return dist.loss_mean(x, m)
    m = m.float()
    return (x * m).sum() / m.sum().clamp(min=1.0)


@torch.no_grad()
def _measure_from_logits(logits: torch.Tensor, ref_logits: torch.Tensor, reward_model: ScalarHeadModel,
                         rollout: Rollout, missing_eos_score: float | None):
    """(stats, logprobs, ref_logprobs, scores) from the response logits of pi_theta and pi_ref."""
    mask = rollout.response_mask
    lp = R.token_logprobs(logits, rollout.response_ids)
    ref_lp = R.token_logprobs(ref_logits, rollout.response_ids)
    scores, raw = reward_scores(reward_model, rollout, missing_eos_score)
    true_r = torch.tensor([_data.true_reward(r) for r in rollout.responses])
    kl = R.kl_statistics(logits, ref_logits, lp, ref_lp, mask)
    stats = {
        "score": float(scores.mean()),
        "score_raw": float(raw.mean()),
        "true_reward": float(true_r.mean()),
        **{k: kl[k] for k in ("kl_exact_seq", "kl_exact_token", "k1_seq", "k1_token", "k3_seq", "k3_token",
                              "entropy_token", "entropy_seq", "ref_nll_token", "response_length")},
        "eos_fraction": float(rollout.has_eos.float().mean()),
        "distinct_fraction": len(set(rollout.responses)) / len(rollout.responses),
        "score_se": R.standard_error(scores),
        "true_reward_se": R.standard_error(true_r),
        "kl_exact_seq_se": kl["kl_exact_seq_se"],
        "k1_seq_se": kl["k1_seq_se"],
        "score_abs_max": float(scores.abs().max()),
    }
    return stats, lp, ref_lp, scores


@torch.no_grad()
def measure(policy, ref_model, reward_model, tokenizer, rollout: Rollout, temperature: float = 1.0,
            missing_eos_score: float | None = None) -> dict:
    """Statistics of a rollout: score, true reward, exact and estimated KL, entropy, length.

    KL is ``KL(pi_theta || pi_ref)`` of the sampled prefixes: ``kl_exact_*`` sums over the
    vocabulary at every position, ``k1_*`` and ``k3_*`` use only the sampled tokens;
    ``*_seq`` are sums over a response's tokens averaged over the batch, ``*_token`` means
    over all response tokens. ``ref_nll_token`` is the mean ``-log pi_ref`` of the sampled
    tokens; ``distinct_fraction`` the fraction of distinct response texts. ``score_se``,
    ``true_reward_se``, ``kl_exact_seq_se`` and ``k1_seq_se`` are standard errors of the
    batch means (sample standard deviation over responses / sqrt(n)); ``score_abs_max`` is
    the largest ``|score|`` in the batch (compare with ``PPOConfig.score_clip``).
    """
    logits = response_logits(policy, rollout, temperature)
    ref_logits = response_logits(ref_model, rollout, temperature)
    return _measure_from_logits(logits, ref_logits, reward_model, rollout, missing_eos_score)[0]


def ppo_step(policy, ref_model, reward_model, value_model, ro: Rollout, beta: float, cfg: PPOConfig,
             opt_pi: torch.optim.Optimizer, opt_v: torch.optim.Optimizer,
             generator: torch.Generator | None = None, dist=None) -> tuple[dict, dict]:
    """One PPO-RLHF update on a sampled rollout ``ro``; returns ``(stats, diagnostics)``.

    ``stats`` (from :func:`measure`) describe the rollout before the update; the
    diagnostics average ``pg_loss``, ``vf_loss``, ``clipfrac`` and ``approx_kl_k3`` (the k3
    estimate of ``KL(pi_old || pi_theta)`` on the batch) over the minibatches, and give
    ``score_clipped_fraction``, the fraction of the batch's scores that ``cfg.score_clip``
    changed (the reward model's score enters the reward clipped to ``[-score_clip, score_clip]``).

    The models must have dropout off (:func:`train_ppo` switches it off). With ``dist``, ``ro``
    is this rank's block of the batch, ``policy`` and ``value_model`` are wrapped in
    ``DistributedDataParallel``, ``cfg.minibatch_size`` is the global minibatch, and the
    statistics, advantage whitening, losses and diagnostics are those of the global batch.
    """
    mask = ro.response_mask
    B = len(ro.prompts)
    cur_beta = float(beta)
    with torch.no_grad():
        # pi_old's logits: the sampler's own when it kept them (sample_responses(keep_logits=True))
        old_logits = ro.logits if ro.logits is not None else response_logits(policy, ro, cfg.temperature)
        stats, old_lp, ref_lp, scores = _measure_from_logits(
            old_logits, response_logits(ref_model, ro, cfg.temperature),
            reward_model, ro, cfg.missing_eos_score)
        if dist is not None:    # the statistics of the global batch
            stats = dist.reduce_stats(stats, ro.responses)
        if cfg.reward_fn is None:
            rewards = R.per_token_rewards(old_lp, ref_lp, scores, mask, cur_beta,
                                          estimator=cfg.kl_estimator, score_clip=cfg.score_clip)
        else:                   # a pluggable reward (PPOConfig.reward_fn), given clipped scores
            clipped_scores = scores if cfg.score_clip is None else scores.clamp(-cfg.score_clip, cfg.score_clip)
            rewards = cfg.reward_fn(old_lp, ref_lp, clipped_scores, mask, cur_beta)
        clipped = (float((scores.abs() > cfg.score_clip).float().mean()) if cfg.score_clip is not None else 0.0)
        if dist is not None:
            clipped = dist.mean(clipped)
        P = ro.prompt_len
        old_values = value_model(ro.input_ids, ro.attention_mask)[:, P - 1:-1].float() * mask
        adv, returns = (gae if cfg.advantage_fn is None else cfg.advantage_fn)(
            rewards, old_values, mask, cfg.gamma, cfg.lam)
        if cfg.whiten_advantages:
            mean = _masked_mean if dist is None else dist.global_masked_mean
            mu = mean(adv, mask)
            sd = mean((adv - mu) ** 2, mask).sqrt()
            adv = (adv - mu) / (sd + 1e-8) * mask
    policy.train()
    diag = {"pg_loss": [], "vf_loss": [], "clipfrac": [], "approx_kl_k3": []}
    for _ in range(cfg.ppo_epochs):
        perm = (torch.randperm(B, generator=generator).tolist() if dist is None
                else dist.local_permutation(B, generator))
        mb_size = cfg.minibatch_size if dist is None else cfg.minibatch_size // dist.world_size
        for s in range(0, B, mb_size):
            mb = perm[s:s + mb_size]
            sub = Rollout([ro.prompts[i] for i in mb], [ro.responses[i] for i in mb], ro.input_ids[mb],
                          ro.attention_mask[mb], P, ro.response_ids[mb], ro.response_mask[mb], ro.has_eos[mb])
            m = sub.response_mask
            new_lp = R.token_logprobs(response_logits(policy, sub, cfg.temperature), sub.response_ids)
            log_ratio = (new_lp - old_lp[mb]) * m
            ratio = log_ratio.exp()
            a = adv[mb]
            pg = torch.maximum(-a * ratio, -a * ratio.clamp(1 - cfg.clip_range, 1 + cfg.clip_range))
            pg_loss = _masked_mean(pg, m, dist)
            v = value_model(sub.input_ids, sub.attention_mask)[:, P - 1:-1].float()
            v_old = old_values[mb]
            v_clip = v_old + (v - v_old).clamp(-cfg.value_clip, cfg.value_clip)
            ret = returns[mb]
            vf_loss = 0.5 * _masked_mean(torch.maximum((v - ret) ** 2, (v_clip - ret) ** 2), m, dist)
            opt_pi.zero_grad(set_to_none=True)
            opt_v.zero_grad(set_to_none=True)
            (pg_loss + cfg.vf_coef * vf_loss).backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            torch.nn.utils.clip_grad_norm_(value_model.parameters(), cfg.max_grad_norm)
            opt_pi.step()
            opt_v.step()
            with torch.no_grad():
                diag["pg_loss"].append(float(pg_loss))
                diag["vf_loss"].append(float(vf_loss))
                diag["clipfrac"].append(float(_masked_mean(((ratio - 1).abs() > cfg.clip_range).float(), m, dist)))
                diag["approx_kl_k3"].append(float(_masked_mean(k3_from_log_ratio(log_ratio), m, dist)))
    policy.eval()
    out = {k: sum(v) / len(v) for k, v in diag.items()}
    if dist is not None:        # the shares of the ranks average to the global values
        out = dist.mean_dict(out)
    out["score_clipped_fraction"] = clipped
    return stats, out


def _controller_value(beta, controller) -> float:
    return float(controller.value) if controller is not None else float(beta)


def train_ppo(policy, ref_model, reward_model: ScalarHeadModel, value_model: ScalarHeadModel, tokenizer,
              prompts: Sequence[str], iterations: int = 60, beta: float = 0.1, controller=None,
              config: PPOConfig | None = None, seed: int = 0, progress: bool = True,
              checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 0,
              dist=None, sampler_cache: bool = True, reuse_sample_logits: bool = False) -> list[dict]:
    """Run ``iterations`` PPO-RLHF iterations in place on ``policy`` and ``value_model``.

    ``beta`` is a fixed KL coefficient; a ``controller`` (e.g.
    :class:`klbook_lib.controllers.ProportionalKL`) overrides it and is updated after every
    iteration with the mean per-sequence k1 KL and ``n_steps = batch_size``. Returns the
    history: one dict per iteration with the rollout statistics of :func:`measure`
    (measured *before* that iteration's update), ``beta`` and the update's diagnostics
    (``pg_loss``, ``vf_loss``, ``clipfrac``, ``approx_kl_k3`` between old and new policy).
    Checkpoints (``save_pretrained``) go to ``checkpoint_dir/iter_XXXX`` every
    ``checkpoint_every`` iterations when both are given.

    Dropout is switched off on ``policy``, ``value_model``, ``ref_model`` and ``reward_model``
    (in place), so that ``pi_theta / pi_old`` is exactly 1 at identical weights.
    ``dist`` (a :class:`klbook_lib.rlhf.distributed.DataParallel`, from ``torchrun``) trains
    data-parallel: ``cfg.batch_size`` and ``cfg.minibatch_size`` are global (multiples of
    the world size), every rank samples its block of the prompts, the history and the
    controller see the global statistics, and rank 0 alone writes checkpoints.

    ``sampler_cache`` (default on) samples with the KV cache (the same tokens as without it,
    :func:`sample_responses`); ``reuse_sample_logits`` takes ``log pi_old`` from the
    sampler's logits instead of a second forward pass of the policy (equal to float
    rounding; off by default so that the chapters' numbers stay as they were).
    """
    cfg = (config or PPOConfig()).check()
    if dist is not None:
        dist.check_divisible("batch_size", cfg.batch_size)
        dist.check_divisible("minibatch_size", cfg.minibatch_size)
    if iterations < 1:
        raise ValueError(f"iterations: must be >= 1, got {iterations!r}")
    if controller is None and (not isinstance(beta, (int, float)) or beta < 0 or math.isnan(beta)):
        raise ValueError(f"beta: must be a non-negative number, got {beta!r}")
    if len(prompts) == 0:
        raise ValueError("prompts: need at least one prompt")
    for model in (policy, value_model, ref_model, reward_model):
        disable_dropout(model)
    device = next(policy.parameters()).device
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    policy.train()
    value_model.train()
    opt_pi = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=cfg.lr)
    opt_v = torch.optim.Adam([p for p in value_model.parameters() if p.requires_grad], lr=cfg.value_lr)
    # with dist: gradients averaged over ranks by DistributedDataParallel (sampling uses the bare policy)
    pi_train, v_train = (policy, value_model) if dist is None else (dist.wrap(policy), dist.wrap(value_model))
    history = []
    quiet = not progress or (dist is not None and not dist.is_main)
    for it in tqdm(range(iterations), desc="PPO", disable=quiet):
        t0 = time.time()
        idx = torch.randint(len(prompts), (cfg.batch_size,), generator=gen).tolist()
        if dist is not None:    # this rank's block of the global batch
            idx = dist.shard(idx)
        batch_prompts = [prompts[i] for i in idx]
        policy.eval()
        ro = sample_responses(policy, tokenizer, batch_prompts, cfg.max_new_tokens, cfg.temperature, gen,
                              dist=dist, use_cache=sampler_cache, keep_logits=reuse_sample_logits)
        cur_beta = _controller_value(beta, controller)
        stats, diag = ppo_step(pi_train, ref_model, reward_model, v_train, ro, cur_beta, cfg,
                               opt_pi, opt_v, gen, dist=dist)
        row = {"iteration": it, "beta": cur_beta, **stats, **diag, "seconds": time.time() - t0}
        if controller is not None:
            controller.update(stats["k1_seq"], n_steps=cfg.batch_size)
        history.append(row)
        if (checkpoint_dir is not None and checkpoint_every and (it + 1) % checkpoint_every == 0
                and (dist is None or dist.is_main)):
            policy.save_pretrained(Path(checkpoint_dir) / f"iter_{it + 1:04d}")
    policy.eval()
    value_model.eval()
    return history


@dataclass
class RLHFResult:
    """What :func:`run_rlhf` returns: the tuned policy, its value model and the history."""

    policy: object
    value_model: ScalarHeadModel
    history: list
    config: PPOConfig
    beta: float | None = None
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def history_columns(self) -> dict:
        """The history as a dict of lists (one list per logged quantity)."""
        return {k: [row[k] for row in self.history] for k in self.history[0]} if self.history else {}


def run_rlhf(pipeline, beta: float = 0.1, steps: int = 60, seed: int = 0, controller=None,
             config: PPOConfig | None = None, progress: bool = True,
             checkpoint_dir: str | os.PathLike | None = None, checkpoint_every: int = 0,
             prompts: Sequence[str] | None = None, dist=None) -> RLHFResult:
    """PPO-RLHF from the pipeline's ``pi_ref`` with reward model and prompts; ``steps`` iterations.

    The policy starts as a copy of the SFT model, the value model as a copy of the reward
    model. ``controller`` (if given) sets ``beta`` adaptively instead of the fixed ``beta``.
    ``prompts`` (default: all of ``pipeline.prompts``) are the prompts PPO trains on, e.g. a
    subset so that the others can be held out for evaluation. ``dist``: data-parallel
    training over the ranks of ``torchrun`` (:func:`train_ppo`).
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: must be a positive integer, got {steps!r}")
    prompts = check_prompts(pipeline, prompts)
    policy = pipeline.new_policy()
    value_model = copy.deepcopy(pipeline.reward_model)
    for p in value_model.parameters():
        p.requires_grad_(True)
    cfg = config or PPOConfig()
    hist = train_ppo(policy, pipeline.ref_model, pipeline.reward_model, value_model, pipeline.tokenizer,
                     prompts, iterations=steps, beta=beta, controller=controller, config=cfg,
                     seed=seed, progress=progress, checkpoint_dir=checkpoint_dir,
                     checkpoint_every=checkpoint_every, dist=dist)
    return RLHFResult(policy=policy, value_model=value_model, history=hist, config=cfg,
                      beta=None if controller is not None else float(beta), seed=seed)


@torch.no_grad()
def evaluate_policy(pipeline, policy, n: int = 256, seed: int = 1234, temperature: float = 1.0,
                    max_new_tokens: int = 16, missing_eos_score: float | None = -2.0,
                    prompts: Sequence[str] | None = None, dist=None) -> tuple[dict, Rollout]:
    """Sample ``n`` responses from ``policy`` to random prompts; return ``(stats, rollout)``.

    The prompts are drawn uniformly, with ``seed``, from ``prompts`` (default: all of
    ``pipeline.prompts``; pass prompts PPO never trained on to evaluate on held-out prompts).
    ``stats`` are those of :func:`measure` against the pipeline's ``pi_ref`` and reward model,
    standard errors included. With ``dist`` every rank samples its block of the ``n``
    responses (``n`` a multiple of the world size), ``stats`` are those of all ``n`` and the
    rollout is this rank's block.
    """
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n!r}")
    if dist is not None:
        dist.check_divisible("n", n)
    prompts = check_prompts(pipeline, prompts)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(prompts), (n,), generator=gen).tolist()
    if dist is not None:
        idx = dist.shard(idx)
    policy.eval()
    ro = sample_responses(policy, pipeline.tokenizer, [prompts[i] for i in idx],
                          max_new_tokens, temperature, gen, dist=dist)
    stats = measure(policy, pipeline.ref_model, pipeline.reward_model, pipeline.tokenizer, ro,
                    temperature, missing_eos_score)
    if dist is not None:
        stats = dist.reduce_stats(stats, ro.responses)
    return stats, ro
