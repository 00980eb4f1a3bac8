"""A tiny GPT-2 RLHF pipeline: data, tokenizer, SFT, reward model, PPO.

    data          generated reviews with a sentiment attribute, preference pairs, ``true_reward``
    tokenizer     byte-level BPE trained on the corpus; GPT-2's own tokenizer offline only
    models        GPT-2 presets (tiny/small/gpt2), offline loading, scalar heads, SFT
    reward_model  a Bradley-Terry reward model
    rewards       per-token KL rewards and the exact token KL
    ppo           the PPO-RLHF loop (``run_rlhf``)
    grpo          GRPO: group-relative advantages, the k3 loss term, verifiable rewards (``run_grpo``)
    overopt       reward-model over-optimisation: best-of-n, proxy reward models, scaling fits
    distill       distillation by forward KL, reverse KL and GKD's JSD; student evaluation
    checks        the argument checks the modules above share
    seeds         several seeds of the PPO loop in one process, and their benchmark
    pipeline      ``build_pipeline``: everything above, cached on disk
    demo          command-line demo for bigger presets on a GPU
    distributed   data-parallel PPO-RLHF over torchrun processes (``torch.distributed``)

Submodules load on first use: ``from klbook_lib.rlhf import build_pipeline`` or
``kb.rlhf.pipeline.build_pipeline``.
"""
from __future__ import annotations

import importlib

_SUBMODULES = ("data", "tokenizer", "models", "reward_model", "rewards", "ppo", "pipeline", "demo", "grpo",
               "distributed", "overopt", "distill", "checks", "seeds")
_NAMES = {
    "build_pipeline": "pipeline", "RLHFPipeline": "pipeline",
    "run_rlhf": "ppo", "train_ppo": "ppo", "PPOConfig": "ppo", "evaluate_policy": "ppo",
    "sample_responses": "ppo",
    "true_reward": "data", "make_corpus": "data", "make_preference_pairs": "data",
    "train_tokenizer": "tokenizer", "load_tokenizer": "tokenizer",
    "make_policy": "models", "load_policy": "models", "train_sft": "models",
    "train_reward_model": "reward_model",
}


def __getattr__(name: str):
    if name in _SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    if name in _NAMES:
        value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_SUBMODULES) + list(_NAMES))
