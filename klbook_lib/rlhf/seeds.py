"""Many seeds of the tiny GPT-2 PPO-RLHF in one process, faster than one after another.

The book's seed standard (AUTHORING.md) asks for ten seeds per arm. :func:`train_seeds`
trains ``K`` seeds of :func:`klbook_lib.rlhf.ppo.train_ppo` in one process and returns ``K``
histories; :func:`seed_benchmark` times it against the same seeds run one after another
the way the chapters ran them before (``python -m klbook_lib.bench seeds`` calls it);
:func:`train_seed_results` returns the tuned policies too.

Where the time goes (cProfile and ``torch.profiler``, preset ``tiny``, the book's settings:
``PPOConfig()`` defaults, batch 64, beta 0.1; one thread on the shared 2-core machine, so
the numbers carry some noise). Before: 0.63 s per iteration, of which the sampler 0.18 s
(it recomputed the whole prefix for every new token) and the PPO update 0.44 s (backward
passes 0.15 s, policy and ``pi_ref`` forward passes 0.12 s, value and reward model forward
passes 0.11 s, statistics 0.03 s, Adam 0.03 s). After (``fast=True``): 0.36 s per
iteration, of which the sampler 0.05 s and the update 0.29 s (backward 0.11 s, forward
passes 0.07 s + 0.07 s). Matrix products are about 55 % of what is left, the rest mostly
attention and GELU. Stacking the seeds into one batched computation does not pay on this
CPU: a single-thread matrix product runs slower per flop on stacked seeds (85 GFLOP/s at
448 rows, 41 GFLOP/s at 4480 rows, 39-46 GFLOP/s as a ``bmm`` of ten); a forward of ten
GPT-2 copies under ``torch.func.vmap`` over ``functional_call`` (stacked with
``stack_module_state``) took 0.170 s against 0.155 s for a loop over the ten, and did not
even reproduce the loop's logits (the tied embedding and output weights), so the seeds
run one after another in one process. What pays:

* the KV cache in the sampler (:func:`~klbook_lib.rlhf.ppo.sample_responses`, same tokens);
* ``log pi_old`` from the sampler's own logits instead of one more forward pass
  (``reuse_sample_logits``; equal to float rounding);
* the fused tanh-GELU kernel (``torch.nn.functional.gelu(approximate="tanh")``, the
  same function as GPT-2's ``gelu_new`` up to float rounding) in place of the five
  elementwise operations of ``gelu_new``.

Measured with :func:`seed_benchmark` (10 seeds, 10 iterations): 59.6 s one after another
as before, 38.7 s with every speed-up, a ratio of 1.54, short of the 3x the issue hoped
for, because what remains is arithmetic that the seeds cannot share.

A seed of :func:`train_seeds` with ``fast=True`` reproduces that seed trained alone
with the same settings exactly (the seeds share no random state and no computation), and
agrees with :func:`klbook_lib.rlhf.ppo.run_rlhf` to float rounding
(``tests/test_rlhf_seeds.py``).
"""
from __future__ import annotations

import copy
import time
from typing import Sequence

import torch
from torch import nn
from tqdm import tqdm

from .checks import check_prompts, check_seeds
from .ppo import PPOConfig, RLHFResult, train_ppo


def use_fused_gelu(model: nn.Module) -> nn.Module:
    """Replace GPT-2's ``gelu_new`` modules of ``model`` by the fused tanh-GELU, in place.

    ``gelu_new`` computes ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` in five
    elementwise operations; ``torch.nn.functional.gelu(x, approximate="tanh")`` computes
    the same formula in one kernel (equal to float rounding, and faster forward and
    backward). Returns ``model``.
    """
    from transformers.activations import GELUTanh, NewGELUActivation

    for module in model.modules():
        for name, child in module.named_children():
            if isinstance(child, NewGELUActivation):
                setattr(module, name, GELUTanh())
    return model


def train_seed_results(pipeline, seeds: Sequence[int], beta: float = 0.1, steps: int = 30,
                       config: PPOConfig | None = None, fast: bool = True, progress: bool = False,
                       prompts: Sequence[str] | None = None) -> list[RLHFResult]:
    """:func:`train_seeds`, returning one :class:`~klbook_lib.rlhf.ppo.RLHFResult` per seed
    (the tuned ``policy``, its ``value_model``, the ``history``, ``config``, ``beta``, ``seed``)
    instead of the histories alone, for chapters that sample from the tuned policies.

    With ``fast=True`` the returned policies carry the fused tanh-GELU (:func:`use_fused_gelu`);
    they compute the same function as GPT-2's ``gelu_new`` to float rounding.
    """
    seeds = check_seeds(seeds)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: must be a positive integer, got {steps!r}")
    prompts = check_prompts(pipeline, prompts)
    cfg = config or PPOConfig()
    ref_model, reward_model = pipeline.ref_model, pipeline.reward_model
    if fast:    # private copies: the pipeline's models stay as they are
        ref_model = use_fused_gelu(copy.deepcopy(ref_model))
        reward_model = use_fused_gelu(copy.deepcopy(reward_model))
    results = []
    for seed in tqdm(seeds, desc="seeds", disable=not progress):
        policy = pipeline.new_policy()
        value_model = copy.deepcopy(pipeline.reward_model)
        for p in value_model.parameters():
            p.requires_grad_(True)
        if fast:
            use_fused_gelu(policy)
            use_fused_gelu(value_model)
        history = train_ppo(policy, ref_model, reward_model, value_model, pipeline.tokenizer, prompts,
                            iterations=steps, beta=beta, config=cfg, seed=seed, progress=False,
                            sampler_cache=fast, reuse_sample_logits=fast)
        results.append(RLHFResult(policy=policy, value_model=value_model, history=history, config=cfg,
                                  beta=float(beta), seed=seed))
    return results


def train_seeds(pipeline, seeds: Sequence[int], beta: float = 0.1, steps: int = 30,
                config: PPOConfig | None = None, fast: bool = True, progress: bool = False,
                prompts: Sequence[str] | None = None) -> list[list[dict]]:
    """Train one PPO-RLHF run per seed in ``seeds`` from the pipeline's ``pi_ref``; return
    the ``K`` histories (one list of per-iteration dicts per seed, as ``train_ppo`` returns).

    Each run starts like :func:`klbook_lib.rlhf.ppo.run_rlhf`: the policy a copy of
    ``pi_ref``, the value model a copy of the reward model, fixed ``beta``. ``fast=True``
    switches every speed-up on (sampler KV cache, ``log pi_old`` from the sampler, the
    fused GELU on private copies of all four models); ``fast=False`` is the code as the
    chapters ran it before these speed-ups (sampler cache off), seed after seed.
    :func:`train_seed_results` returns the tuned policies as well.
    """
    return [r.history for r in train_seed_results(pipeline, seeds, beta=beta, steps=steps, config=config,
                                                  fast=fast, progress=progress, prompts=prompts)]


def seed_benchmark(n_seeds: int = 10, iterations: int = 10, progress: bool = False,
                   preset: str = "tiny", beta: float = 0.1, pipeline=None) -> dict:
    """Time ``n_seeds`` seeds of the tiny PPO-RLHF (``iterations`` each), (a) one after
    another as the chapters ran them before (sampler cache off) and (b) with
    :func:`train_seeds` and every speed-up on, side by side in this process.

    Returns ``{"n_seeds", "iterations", "seconds_sequential", "seconds_batched", "ratio",
    "threads", "max_abs_score_diff"}``: ``ratio`` is (a) / (b); ``max_abs_score_diff`` the
    largest difference of the per-iteration mean reward-model score between (a) and (b)
    (float rounding only, unless rounding flipped a sampled token and the runs drifted).
    The pipeline is built (or loaded from its cache) before the clock starts.
    """
    if not isinstance(n_seeds, int) or n_seeds < 1:
        raise ValueError(f"n_seeds: must be a positive integer, got {n_seeds!r}")
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations: must be a positive integer, got {iterations!r}")
    if pipeline is None:
        from .pipeline import build_pipeline
        pipeline = build_pipeline(preset, seed=0, progress=progress)
    seeds = list(range(n_seeds))
    t0 = time.perf_counter()
    slow = train_seeds(pipeline, seeds, beta=beta, steps=iterations, fast=False, progress=progress)
    t1 = time.perf_counter()
    fast = train_seeds(pipeline, seeds, beta=beta, steps=iterations, fast=True, progress=progress)
    t2 = time.perf_counter()
    diff = max(abs(a["score"] - b["score"]) for hs, hf in zip(slow, fast) for a, b in zip(hs, hf))
    return {"n_seeds": n_seeds, "iterations": iterations, "seconds_sequential": t1 - t0,
            "seconds_batched": t2 - t1, "ratio": (t1 - t0) / (t2 - t1),
            "threads": torch.get_num_threads(), "max_abs_score_diff": diff}
