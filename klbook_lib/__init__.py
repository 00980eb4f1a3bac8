"""klbook_lib: the tested library behind *KL in RL, an executable textbook*.

The book and the library speak the same names: each module is one idea of the book.

    divergences   KL and its relatives between explicit distributions
    estimators    k1, k2, k3: estimating KL(p||q) from samples x ~ p
    fitting       fitting one Gaussian to a target by forward or reverse KL
    controllers   fixed, adaptive and proportional KL coefficients
    envs          batched torch environments (CartPole, Pendulum)
    ppo           a small, readable PPO with KL control
    monitor       per-update KL statistics for training dashboards
    rlhf          a tiny GPT-2 RLHF pipeline (data, tokenizer, SFT, reward model, PPO)
    dpo           direct preference optimisation
    runtime       device, thread and size settings shared by the notebooks

Submodules are imported on first use, so ``import klbook_lib as kb`` is cheap and
``kb.divergences.kl`` works.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = (
    "divergences", "estimators", "fitting", "controllers", "envs", "ppo", "monitor",
    "rlhf", "dpo", "runtime", "grading", "optimal", "vi", "trpo",
)


def __getattr__(name: str):
    if name in _SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_SUBMODULES))
