"""klbook_lib: the tested library behind *KL in RL, an executable textbook*.

The book and the library speak the same names: each module is one idea of the book.
The exercises' grader (``klbook grade``, its hidden tests and training tasks) is a package of
its own beside this one, ``klbook_grader``; nothing here imports it.

    divergences   KL and its relatives between explicit distributions
    estimators    k1, k2, k3: estimating KL(p||q) from samples x ~ p
    fitting       fitting one Gaussian to a target by forward or reverse KL
    controllers   fixed, adaptive and proportional KL coefficients
    envs          batched torch environments (CartPole, Pendulum)
    ppo           a small, readable PPO with KL control
    monitor       per-update KL statistics for training dashboards
    trpo          the exact trust-region step on a small MDP
    rlhf          a tiny GPT-2 RLHF pipeline (data, tokenizer, SFT, reward model, PPO)
    optimal       the optimal policy of the KL-regularised objective
    vi            a small latent-variable model: evidence, posterior, ELBO
    dpo           direct preference optimisation
    objectives    objectives several modules share, written once (the DPO loss)
    runtime       device, thread and size settings shared by the notebooks
    seqkl         exact sequence-level KL and its gradients on an enumerable autoregressive policy
    diagnostics   KL as a tool: exploration gauge, phases of a KL trajectory, averaging conventions
    display       tables formatted for reading (no index column, sensible digits)
    stats         confidence intervals across seeds and the seed standard's asserts
    optim         optimisers for seed-batched (ensemble) parameters
    bench         benchmarks run from the command line (``python -m klbook_lib.bench``)
    shape         the shape of the KL-regularised optimum, entropy collapse, moving anchors, preference links
    offpolicy     off-policy KL: attached ratios, train-inference mismatch, trust regions
    sampling_masks  off-policy sequence masking and the sampler's top-k/top-p mask, exactly
    claims        a claim declared before its experiment runs; its verdict and the sentence the page prints
    interactive   figures a reader can move: a family computed on a grid, picked by a slider on the page

Submodules are imported on first use, so ``import klbook_lib as kb`` is cheap and
``kb.divergences.kl`` works. The most used functions are also available at the top:
``kb.kl``, ``kb.kl_from_logits``, ``kb.gaussian_kl``, ``kb.k1``, ``kb.k2``, ``kb.k3``,
``kb.optimal_policy``, ``kb.dpo_loss``.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = (
    "divergences", "estimators", "fitting", "controllers", "envs", "ppo", "monitor",
    "rlhf", "dpo", "runtime", "optimal", "vi", "trpo", "display",
    "seqkl", "diagnostics", "stats", "optim", "bench", "offpolicy", "shape", "objectives",
    "sampling_masks", "claims", "interactive",
)


_NAMES = {
    "kl": "divergences", "kl_from_logits": "divergences", "gaussian_kl": "divergences",
    "js": "divergences", "total_variation": "divergences",
    "k1": "estimators", "k2": "estimators", "k3": "estimators",
    "optimal_policy": "optimal", "dpo_loss": "objectives",
}


def __getattr__(name: str):
    if name in _NAMES:
        value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBMODULES) | set(_NAMES))
