"""GRPO on a GPT-2 policy: group-relative advantages, the k3 KL term in the loss, rule-based rewards.

Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath) drops PPO's value
model. For each prompt ``q`` it samples a *group* of ``G`` responses from ``pi_old``,
scores them, and gives every token of response ``i`` the same advantage, the reward
standardised within its group,

    A_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps).

The loss of one response averages over its tokens the clipped surrogate of PPO minus a
KL term placed *in the loss* (not in the reward), estimated per token with k3:

    l_i = -(1/|o_i|) sum_t [ min(rho_t A_i, clip(rho_t, 1-eps_c, 1+eps_c) A_i) - beta k3_t ],
    rho_t = pi_theta(a_t|s_t) / pi_old(a_t|s_t),
    k3_t = pi_ref(a_t|s_t) / pi_theta(a_t|s_t) - log(pi_ref(a_t|s_t) / pi_theta(a_t|s_t)) - 1,

and the batch loss is the mean of ``l_i`` over responses (``aggregation="sequence_mean"``,
DeepSeekMath's eq. 3, beta = 0.04 in the paper). Two later normalisations are offered:
``"token_mean"`` divides the sum over every token of the batch by the batch's number of
tokens (DAPO, Yu et al. 2025), ``"constant"`` divides it by ``B * max_tokens`` (Dr. GRPO,
Liu et al. 2025, who also drop the division by the group's standard deviation:
``group_advantages(..., scale=False)``).

Sampling, response log-probabilities, masks and the KL statistics are the PPO-RLHF loop's
(:mod:`klbook_lib.rlhf.ppo`, :mod:`klbook_lib.rlhf.rewards`); this module adds the group
structure, the loss, a loop and a *verifiable* reward that a program checks exactly.

Functions
---------
``group_advantages``        (r - group mean) / (group std + eps), one number per response
``token_advantages``        the same, broadcast to the response tokens, zero on pads
``grpo_loss``               the GRPO loss of a padded batch, with its diagnostics
``prompt_noun``             the noun a review prompt is about (``"the coffee was"`` -> ``"coffee"``)
``noun_and_full_stop``      1 if a response mentions the prompt's noun and ends with " ." and EOS
``three_adjectives``        1 if a response is exactly " A , B and C ." (three adjectives) and EOS
``verifiable_rewards``      one of those rules for a batch, as a tensor
``grpo_step``               one update on a sampled batch
``train_grpo``, ``run_grpo``  the loop, on a policy or from a pipeline's ``pi_ref``
``forward_kl``              KL(pi_ref || pi_theta) of whole responses, along pi_ref's samples
``evaluate_grpo_policy``    fresh samples: PPO's evaluation statistics, the verifiable reward, the forward KL
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from tqdm import tqdm

from . import data as _data
from ..estimators import k3_from_log_ratio
from . import rewards as R
from .checks import check_batch_tensor, check_logprob_pair, check_mask, check_prompts
from .ppo import response_logits, sample_responses

AGGREGATIONS = ("sequence_mean", "token_mean", "constant")

__all__ = [
    "AGGREGATIONS", "group_advantages", "token_advantages", "grpo_loss", "prompt_noun",
    "noun_and_full_stop", "three_adjectives", "RULES", "verifiable_rewards", "GRPOConfig",
    "GRPOResult", "grpo_step", "train_grpo", "run_grpo", "forward_kl", "evaluate_grpo_policy",
]


# --------------------------------------------------------------------------- advantages
def _check_group_size(group_size, n: int) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"group_size: must be an integer >= 2, got {group_size!r}")
    if n % group_size != 0:
        raise ValueError(f"group_size: the batch of {n} rewards does not split into groups of {group_size}")
    return group_size


def group_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True,
                     eps: float = 1e-4) -> torch.Tensor:
    """Group-relative advantages ``A_i = (r_i - mean_g) / (std_g + eps)``, one per response.

    ``rewards`` is ``[B]`` with the ``G = group_size`` responses to one prompt in
    consecutive positions (``B = n_prompts * G``). ``std_g`` is the sample standard
    deviation of the group (divisor ``G - 1``, as ``torch.std`` and TRL compute it).
    ``scale=False`` keeps ``r_i - mean_g`` (Dr. GRPO). A group whose rewards are all equal
    gets advantage 0 for every response: it carries no learning signal.
    """
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1:
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        raise ValueError(f"rewards: expected a [B] tensor, got {shape}")
    if not rewards.dtype.is_floating_point:
        rewards = rewards.double()
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards: every reward must be finite")
    G = _check_group_size(group_size, rewards.shape[0])
    eps = float(eps)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: must be a finite number >= 0, got {eps}")
    r = rewards.view(-1, G)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale:
        sd = r.std(dim=1, keepdim=True)
        # a group of equal rewards has centred == 0: keep it 0 even when eps == 0
        centred = torch.where(sd > 0, centred / (sd + eps), torch.zeros_like(centred))
    return centred.reshape(-1)


def token_advantages(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each response's advantage on every one of its real tokens, ``[B, T]``, zero on pads."""
    mask = check_mask(response_mask)
    if not isinstance(advantages, torch.Tensor) or advantages.shape != (mask.shape[0],):
        raise ValueError(f"advantages: expected shape [B] = ({mask.shape[0]},), got "
                         f"{tuple(advantages.shape) if isinstance(advantages, torch.Tensor) else type(advantages).__name__}")
    a = advantages.to(mask.device)[:, None].expand(mask.shape)   # rewards are often computed on the CPU
    return torch.where(mask, a, torch.zeros_like(a))


# --------------------------------------------------------------------------- the loss
def grpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, ref_logprobs: torch.Tensor,
              advantages: torch.Tensor, response_mask: torch.Tensor, beta: float,
              clip_range: float = 0.2, aggregation: str = "sequence_mean",
              max_tokens: int | None = None) -> tuple[torch.Tensor, dict]:
    """The GRPO loss of a padded batch (to minimise), and its diagnostics.

    Args:
        logprobs: ``log pi_theta(a_t|s_t)`` of the sampled tokens, ``[B, T]`` (differentiable).
        old_logprobs: ``log pi_old(a_t|s_t)``, the policy that sampled them, ``[B, T]``.
        ref_logprobs: ``log pi_ref(a_t|s_t)``, ``[B, T]``.
        advantages: one advantage per response, ``[B]`` (:func:`group_advantages`).
        response_mask: 1 on real response tokens, 0 on pads, ``[B, T]``.
        beta: the coefficient of the k3 term, ``>= 0``.
        clip_range: PPO's ``eps`` for the ratio ``pi_theta / pi_old``.
        aggregation: ``"sequence_mean"`` (GRPO: mean over each response's tokens, then over
            responses), ``"token_mean"`` (DAPO: sum over all tokens / number of tokens) or
            ``"constant"`` (Dr. GRPO: sum over all tokens / (B * max_tokens)).
        max_tokens: the constant of ``"constant"`` (e.g. the generation budget); it must be at
            least the longest response.

    Pads may hold anything (``-inf``, NaN): they are masked out with ``torch.where``. The
    k3 term is not multiplied by the ratio, as in DeepSeekMath's objective. Returns
    ``(loss, stats)`` with ``stats`` = ``pg`` (the aggregated clipped surrogate), ``k3``
    (the aggregated k3 term), ``clipfrac`` (fraction of tokens whose ratio left the clip
    range) as floats.
    """
    check_logprob_pair(logprobs, ref_logprobs)
    check_batch_tensor("old_logprobs", old_logprobs)
    if old_logprobs.shape != logprobs.shape:
        raise ValueError(f"old_logprobs: shape {tuple(old_logprobs.shape)} does not match logprobs "
                         f"shape {tuple(logprobs.shape)}")
    mask = check_mask(response_mask, logprobs.shape)
    adv = token_advantages(advantages, mask).to(logprobs.dtype)
    beta = float(beta)
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta: must be a finite number >= 0, got {beta}")
    clip_range = float(clip_range)
    if not (math.isfinite(clip_range) and clip_range > 0):
        raise ValueError(f"clip_range: must be a positive number, got {clip_range}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation: must be one of {AGGREGATIONS}, got {aggregation!r}")
    lengths = mask.sum(dim=1)
    if aggregation == "constant":
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise ValueError(f"max_tokens: aggregation 'constant' needs an integer max_tokens, got {max_tokens!r}")
        if max_tokens < int(lengths.max()):
            raise ValueError(f"max_tokens: {max_tokens} is shorter than the longest response "
                             f"({int(lengths.max())} tokens)")
    zero = torch.zeros_like(logprobs)
    lp = torch.where(mask, logprobs, zero)
    old = torch.where(mask, old_logprobs, zero).detach()
    ref = torch.where(mask, ref_logprobs, zero).detach()
    for name, x in (("logprobs", lp), ("old_logprobs", old), ("ref_logprobs", ref)):
        if not bool(torch.isfinite(x.detach()).all()):
            raise ValueError(f"{name}: non-finite log-probability on a real response token")
    log_ratio = lp - old
    ratio = log_ratio.exp()
    pg = torch.minimum(ratio * adv, ratio.clamp(1 - clip_range, 1 + clip_range) * adv)
    k3 = k3_from_log_ratio(ref - lp)               # = pi_ref/pi_theta - 1 - log(pi_ref/pi_theta)
    per_token = torch.where(mask, -(pg - beta * k3), zero)

    def aggregate(x: torch.Tensor) -> torch.Tensor:
        x = torch.where(mask, x, torch.zeros_like(x))
        if aggregation == "sequence_mean":
            return (x.sum(dim=1) / lengths).mean()
        if aggregation == "token_mean":
            return x.sum() / lengths.sum()
        return x.sum() / (x.shape[0] * max_tokens)

    loss = aggregate(per_token)
    with torch.no_grad():
        clipped = ((ratio - 1).abs() > clip_range) & mask
        stats = {"pg": float(aggregate(pg)), "k3": float(aggregate(k3)),
                 "clipfrac": float(clipped.sum()) / float(mask.sum())}
    return loss, stats


# --------------------------------------------------------------------------- verifiable rewards
def prompt_noun(prompt: str) -> str:
    """The noun a review prompt is about: the first word of ``prompt`` in the corpus's nouns."""
    if not isinstance(prompt, str):
        raise ValueError(f"prompt: must be a string, got {type(prompt).__name__}")
    for w in prompt.split():
        if w in _data.NOUNS:
            return w
    raise ValueError(f"prompt: {prompt!r} contains none of the corpus's nouns")


def _check_response(response) -> list[str]:
    if not isinstance(response, str):
        raise ValueError(f"response: must be a string, got {type(response).__name__}")
    return response.split()


def noun_and_full_stop(prompt: str, response: str, finished: bool = True) -> float:
    """1.0 if the response names the prompt's noun and is a finished sentence, else 0.0.

    Checked exactly: the noun of ``prompt`` (:func:`prompt_noun`) is one of the response's
    whitespace-separated words, the last word is ``"."``, and the response ended with EOS
    (``finished``; a response cut off by the length limit fails even if its text ends with
    a full stop). For ``"the coffee was"`` the response ``" good and the coffee was hot ."``
    scores 1; ``" good ."`` (no noun) and ``" good and the coffee was"`` (no full stop) score 0.
    """
    noun = prompt_noun(prompt)
    words = _check_response(response)
    return float(bool(finished) and noun in words and words[-1] == ".")


def three_adjectives(prompt: str, response: str, finished: bool = True) -> float:
    """1.0 if the response is exactly a list of three adjectives, ``" A , B and C ."``, else 0.0.

    Checked exactly: six words, the first, third and fifth of them adjectives of the corpus
    (any sentiment; repeats allowed), then ``","``, ``"and"`` and the full stop ``"."`` in
    the second, fourth and sixth place, and the response ended with EOS (``finished``).
    ``prompt`` is not used (any prompt may be answered this way); it is checked to be a string.
    """
    if not isinstance(prompt, str):
        raise ValueError(f"prompt: must be a string, got {type(prompt).__name__}")
    w = _check_response(response)
    adj = _data.WORD_SENTIMENT
    return float(bool(finished) and len(w) == 6 and w[0] in adj and w[1] == "," and w[2] in adj
                 and w[3] == "and" and w[4] in adj and w[5] == ".")


#: the rule-based rewards :func:`verifiable_rewards` knows, by name
RULES: dict[str, Callable[[str, str, bool], float]] = {
    "three_adjectives": three_adjectives,
    "noun_and_full_stop": noun_and_full_stop,
}


def verifiable_rewards(prompts: Sequence[str], responses: Sequence[str],
                       finished: Sequence[bool] | torch.Tensor | None = None,
                       rule: str = "three_adjectives") -> torch.Tensor:
    """The rule ``rule`` (a key of :data:`RULES`) on each (prompt, response) pair, ``[B]`` floats.

    ``finished`` says which responses ended with EOS (``Rollout.has_eos``); default: all.
    """
    if rule not in RULES:
        raise ValueError(f"rule: must be one of {tuple(RULES)}, got {rule!r}")
    if len(prompts) != len(responses):
        raise ValueError(f"prompts, responses: lengths differ, {len(prompts)} vs {len(responses)}")
    if finished is None:
        finished = [True] * len(prompts)
    finished = [bool(f) for f in (finished.tolist() if isinstance(finished, torch.Tensor) else finished)]
    if len(finished) != len(prompts):
        raise ValueError(f"finished: expected {len(prompts)} flags, got {len(finished)}")
    f = RULES[rule]
    return torch.tensor([f(p, r, e) for p, r, e in zip(prompts, responses, finished)], dtype=torch.float32)


# --------------------------------------------------------------------------- the loop
@dataclass
class GRPOConfig:
    """Hyperparameters of the GRPO loop (defaults sized for the ``tiny`` preset on a CPU).

    A batch is ``prompts_per_step`` prompts times ``group_size`` responses. Each batch is
    used for ``updates_per_batch`` gradient steps (DeepSeekMath: one; more makes the later
    steps off-policy, from ``pi_old``). ``scale_advantages=False`` and
    ``aggregation="constant"`` give Dr. GRPO's variant (``max_tokens`` defaults to
    ``max_new_tokens``). ``warmup_steps = W > 0`` warms the learning rate up linearly:
    iteration ``k`` (counted from 1) runs its Adam steps at ``lr * min(1, k / W)``. Without
    it Adam's first step moves every parameter by about ``lr`` whatever its gradient's size
    (both moments start at zero, so the first update is ``lr * g / (|g| + eps)``).
    """

    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 16
    temperature: float = 1.0
    lr: float = 1e-3
    clip_range: float = 0.2
    updates_per_batch: int = 1
    aggregation: str = "sequence_mean"
    scale_advantages: bool = True
    adv_eps: float = 1e-4
    max_grad_norm: float = 1.0
    warmup_steps: int = 0

    def check(self) -> "GRPOConfig":
        for name in ("prompts_per_step", "max_new_tokens", "updates_per_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")
        w = self.warmup_steps
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"warmup_steps: must be an integer >= 0, got {w!r}")
        _check_group_size(self.group_size, self.group_size)
        for name in ("temperature", "lr", "clip_range", "max_grad_norm"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: must be a positive number, got {v!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation: must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        return self

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    def lr_at(self, iteration: int) -> float:
        """The learning rate of iteration ``iteration`` (0-based): ``lr * min(1, (iteration + 1) / W)``."""
        if self.warmup_steps == 0:
            return float(self.lr)
        return float(self.lr) * min(1.0, (iteration + 1) / self.warmup_steps)


@dataclass
class GRPOResult:
    """What :func:`run_grpo` returns: the tuned policy and one history row per iteration."""

    policy: object
    history: list
    config: GRPOConfig
    beta: float
    seed: int = 0
    extra: dict = field(default_factory=dict)


RewardFn = Callable[[Sequence[str], Sequence[str], torch.Tensor], torch.Tensor]


_BATCH_STATS = ("kl_exact_seq", "kl_exact_token", "k1_seq", "k3_token", "entropy_token", "ref_nll_token",
                "response_length")


def grpo_step(policy, ref_model, ro, rewards: torch.Tensor, beta: float, cfg: GRPOConfig,
              opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """One GRPO update on a sampled batch ``ro`` (groups of ``cfg.group_size`` consecutive rows).

    Computes the group-relative advantages of ``rewards`` ([B]), ``log pi_ref`` once and
    ``log pi_old`` from the first forward pass (the policy has not changed since it sampled
    the batch), then takes ``cfg.updates_per_batch`` optimiser steps on :func:`grpo_loss`.
    Returns ``(stats, diag)``: the batch's KL, entropy, reference NLL and length before the
    update (:func:`klbook_lib.rlhf.rewards.kl_statistics`), and the mean ``loss``, ``pg``, ``k3`` and ``clipfrac`` of the steps.
    """
    cfg = cfg.check()
    if not isinstance(rewards, torch.Tensor) or rewards.shape != (ro.response_ids.shape[0],):
        raise ValueError(f"rewards: must be a [{ro.response_ids.shape[0]}] tensor, got "
                         f"{getattr(rewards, 'shape', type(rewards).__name__)}")
    adv = group_advantages(rewards.float(), cfg.group_size, scale=cfg.scale_advantages, eps=cfg.adv_eps)
    mask = ro.response_mask
    params = [p for p in policy.parameters() if p.requires_grad]
    with torch.no_grad():
        ref_logits = response_logits(ref_model, ro, cfg.temperature)
        ref_lp = R.token_logprobs(ref_logits, ro.response_ids)
    diag = {"loss": [], "pg": [], "k3": [], "clipfrac": []}
    old_lp, stats = None, {}
    for k in range(cfg.updates_per_batch):
        logits = response_logits(policy, ro, cfg.temperature)
        lp = R.token_logprobs(logits, ro.response_ids)
        if k == 0:
            old_lp = lp.detach()
            kl = R.kl_statistics(logits.detach(), ref_logits, old_lp, ref_lp, mask)
            stats = {key: kl[key] for key in _BATCH_STATS}
        loss, st = grpo_loss(lp, old_lp, ref_lp, adv, mask, beta, cfg.clip_range, cfg.aggregation,
                             cfg.max_new_tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        diag["loss"].append(float(loss.detach()))
        for key in ("pg", "k3", "clipfrac"):
            diag[key].append(st[key])
    return stats, {key: sum(v) / len(v) for key, v in diag.items()}


def train_grpo(policy, ref_model, tokenizer, prompts: Sequence[str], iterations: int = 40,
               beta: float = 0.04, reward_fn: RewardFn = verifiable_rewards,
               config: GRPOConfig | None = None, seed: int = 0, progress: bool = True) -> list[dict]:
    """Run ``iterations`` GRPO iterations in place on ``policy``; return the history.

    Each iteration draws ``prompts_per_step`` prompts, samples ``group_size`` responses to
    each from the current policy (:func:`klbook_lib.rlhf.ppo.sample_responses`: plain
    softmax sampling, no top-k), scores them with ``reward_fn(prompts, responses, has_eos)``
    and calls :func:`grpo_step`. The history row of an iteration describes its batch
    *before* the update: ``reward`` (mean), ``zero_std_fraction`` (groups whose rewards are
    all equal: no signal), ``kl_exact_seq`` (exact ``KL(pi_theta || pi_ref)`` summed over
    each response's prefixes), ``kl_exact_token``, ``k1_seq``, ``k3_token``,
    ``entropy_token``, ``ref_nll_token``, ``response_length``, ``true_reward`` (the corpus's
    hidden reward), ``distinct_fraction``; then the update's ``loss``, ``pg``, ``k3`` and
    ``clipfrac``, ``beta``, ``lr`` (:meth:`GRPOConfig.lr_at`) and ``seconds``.
    """
    cfg = (config or GRPOConfig()).check()
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations: must be a positive integer, got {iterations!r}")
    beta = float(beta)
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta: must be a finite number >= 0, got {beta}")
    if isinstance(prompts, str) or len(prompts) == 0:
        raise ValueError("prompts: need a non-empty sequence of prompt strings")
    if not callable(reward_fn):
        raise ValueError(f"reward_fn: must be callable, got {type(reward_fn).__name__}")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in policy.parameters() if p.requires_grad]
    if not params:
        raise ValueError("policy: has no trainable parameters (use pipeline.new_policy())")
    opt = torch.optim.Adam(params, lr=cfg.lr)
    G = cfg.group_size
    history = []
    for it in tqdm(range(iterations), desc="GRPO", disable=not progress):
        t0 = time.time()
        idx = torch.randint(len(prompts), (cfg.prompts_per_step,), generator=gen).tolist()
        batch_prompts = [prompts[i] for i in idx for _ in range(G)]      # groups are consecutive
        policy.eval()
        ro = sample_responses(policy, tokenizer, batch_prompts, cfg.max_new_tokens, cfg.temperature, gen)
        rewards = reward_fn(ro.prompts, ro.responses, ro.has_eos)
        if not isinstance(rewards, torch.Tensor) or rewards.shape != (len(batch_prompts),):
            raise ValueError(f"reward_fn: must return a [{len(batch_prompts)}] tensor, got "
                             f"{getattr(rewards, 'shape', type(rewards).__name__)}")
        lr = cfg.lr_at(it)
        for group in opt.param_groups:
            group["lr"] = lr
        stats, diag = grpo_step(policy, ref_model, ro, rewards.float(), beta, cfg, opt)
        groups = rewards.float().view(-1, G)
        history.append({
            "iteration": it, "beta": beta, "reward": float(groups.mean()),
            "zero_std_fraction": float((groups.max(1).values == groups.min(1).values).float().mean()),
            **stats,
            "true_reward": float(sum(_data.true_reward(r) for r in ro.responses) / len(ro.responses)),
            "distinct_fraction": len(set(ro.responses)) / len(ro.responses),
            **diag, "lr": lr, "seconds": time.time() - t0})
    policy.eval()
    return history


def run_grpo(pipeline, beta: float = 0.04, steps: int = 40, seed: int = 0,
             reward_fn: RewardFn = verifiable_rewards, config: GRPOConfig | None = None,
             prompts: Sequence[str] | None = None, progress: bool = True) -> GRPOResult:
    """GRPO from the pipeline's ``pi_ref`` (a trainable copy of the SFT model), ``steps`` iterations.

    ``prompts`` default to all of ``pipeline.prompts``; ``reward_fn`` to the verifiable
    :func:`verifiable_rewards`. No reward model and no value model are used.
    """
    prompts = list(pipeline.prompts) if prompts is None else list(prompts)
    policy = pipeline.new_policy()
    cfg = config or GRPOConfig()
    hist = train_grpo(policy, pipeline.ref_model, pipeline.tokenizer, prompts, iterations=steps, beta=beta,
                      reward_fn=reward_fn, config=cfg, seed=seed, progress=progress)
    return GRPOResult(policy=policy, history=hist, config=cfg, beta=float(beta), seed=seed)


@torch.no_grad()
def forward_kl(pipeline, policy, n: int = 256, seed: int = 4321, max_new_tokens: int = 16,
               prompts: Sequence[str] | None = None) -> tuple[float, float]:
    """The forward KL ``KL(pi_ref || pi_theta)`` of whole responses: ``(mean, standard error)``.

    Samples ``n`` responses from ``pi_ref`` (the pipeline's reference) to prompts drawn with
    ``seed`` and sums, over each response's prefixes, the exact next-token KL
    ``KL(pi_ref(.|s_t) || pi_theta(.|s_t))`` over the vocabulary; by the chain rule its
    mean over responses drawn from ``pi_ref`` estimates the sequence-level forward KL.
    (The reverse KL ``kl_exact_seq`` of the PPO statistics does the same along ``pi_theta``'s
    own responses.)
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n: must be an integer >= 2, got {n!r}")
    prompts = check_prompts(pipeline, prompts)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(prompts), (n,), generator=gen).tolist()
    ro = sample_responses(pipeline.ref_model, pipeline.tokenizer, [prompts[i] for i in idx],
                          max_new_tokens, 1.0, gen)
    per_seq = R.sequence_sum(R.exact_token_kl(response_logits(pipeline.ref_model, ro),
                                              response_logits(policy, ro), ro.response_mask),
                             ro.response_mask).double()
    return float(per_seq.mean()), R.standard_error(per_seq)


@torch.no_grad()
def evaluate_grpo_policy(pipeline, policy, n: int = 256, seed: int = 1234, max_new_tokens: int = 16,
                         prompts: Sequence[str] | None = None,
                         reward_fn: RewardFn = verifiable_rewards) -> tuple[dict, object]:
    """Fresh samples from ``policy``: the PPO evaluation's statistics plus the verifiable reward.

    Calls :func:`klbook_lib.rlhf.ppo.evaluate_policy` (``n`` responses to prompts drawn
    with ``seed``; exact reverse KL to ``pi_ref``, entropy, reference NLL, true reward, ...
    with standard errors) and adds ``reward`` (the mean of ``reward_fn``), ``reward_se``,
    and the forward KL ``kl_forward_seq`` with ``kl_forward_seq_se`` (:func:`forward_kl`, on
    ``n`` responses of ``pi_ref``). Returns ``(stats, rollout)``.
    """
    from .ppo import evaluate_policy

    stats, ro = evaluate_policy(pipeline, policy, n=n, seed=seed, max_new_tokens=max_new_tokens,
                                prompts=prompts)
    r = reward_fn(ro.prompts, ro.responses, ro.has_eos).double()
    stats = dict(stats)
    stats["reward"] = float(r.mean())
    stats["reward_se"] = R.standard_error(r)
    stats["kl_forward_seq"], stats["kl_forward_seq_se"] = forward_kl(
        pipeline, policy, n=max(n, 2), seed=seed + 1, max_new_tokens=max_new_tokens, prompts=prompts)
    return stats, ro
