"""Exercise 3's outcome task: PPO on CartPole with a student's KL-penalty loss and beta rule.

The student writes two functions (exercise 3):

``kl_penalty_loss(logits_new, logits_old, actions, advantages, beta, eps)``
    the scalar loss ``-E[min(r A, clip(r, 1-eps, 1+eps) A)] + beta * E_s[KL(pi_old(.|s) || pi_theta(.|s))]``
    of a categorical policy (torch tensors; ``r = pi_theta(a|s) / pi_old(a|s)``);
``adaptive_beta_update(beta, kl, kl_target)``
    the PPO paper's rule (halve below ``target / 1.5``, double above ``1.5 * target``).

:func:`train` plugs them into :func:`klbook_lib.ppo.train` (``PPOConfig.policy_loss_fn`` and a
``kl_controller`` that calls the rule, with beta kept in ``[BETA_MIN, BETA_MAX]``) and trains
until the policy is solved: the rolling mean return of the last 20 episodes reaches 475 and
the policy's own evaluation (32 episodes, sampled actions) averages at least 499; or until
``budget`` environment steps. It returns plain data: the actor's parameters and the history.

:func:`judge` scores one run: *solved* if the returned actor, run by the judge itself on 32
fresh episodes, averages at least 475; *KL held* if the median KL of the updates lies in the
rule's dead band ``[target / 1.5, 1.5 * target]``. A single update's KL scatters widely around
the target (chapter 3: most updates land outside the band), so the median is what the rule
controls.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

if TYPE_CHECKING:
    from klbook_lib import ppo


def _ppo():
    """:mod:`klbook_lib.ppo`, imported at first use. A graded notebook's cells import this
    module, and the sandbox that runs them does not hold the PPO library (it computes answers
    of exercise 3): only the sandbox of the training call does (grading.md)."""
    from klbook_lib import ppo

    return ppo

KL_TARGET = 0.01
BETA_INIT = 1.0
BETA_MIN, BETA_MAX = 1e-3, 1e3
BUDGET = 200_000                      # environment steps
SOLVED_RETURN = 475.0
EVAL_EPISODES = 32
HISTORY_COLUMNS = ("global_step", "kl_exact_mean", "beta", "clip_frac", "episodic_return")


def config(seed: int = 0, **overrides) -> ppo.PPOConfig:
    """The PPO configuration of the task: clipped surrogate plus adaptive KL penalty, 32 envs x 8
    steps, 3 full-batch epochs, constant learning rate 8e-3 and clip range 0.3."""
    base = dict(seed=seed, objective="clip+kl_penalty", anneal_lr=False, anneal_clip=False,
                clip_coef=0.3, learning_rate=8e-3, total_timesteps=BUDGET, stop_at_return=None,
                monitor_grad_ratio=False)
    base.update(overrides)
    return _ppo().PPOConfig(**base)


class RuleController:
    """A ``kl_controller`` for :func:`klbook_lib.ppo.train` that calls a beta rule function.

    ``update(kl, n_steps)`` sets ``value = clip(rule(value, kl, target), beta_min, beta_max)``;
    the rule's result must be a finite number > 0.
    """

    def __init__(self, rule: Callable, target: float = KL_TARGET, beta: float = BETA_INIT,
                 beta_min: float = BETA_MIN, beta_max: float = BETA_MAX):
        if not callable(rule):
            raise ValueError(f"rule: must be callable, got {type(rule).__name__}")
        self.rule, self.target = rule, float(target)
        self.value, self.beta_min, self.beta_max = float(beta), float(beta_min), float(beta_max)

    def update(self, kl: float, n_steps: int = 1) -> float:
        new = self.rule(self.value, float(kl), self.target)
        if isinstance(new, (str, bytes, bool)) or new is None:
            raise ValueError(f"the beta rule returned {type(new).__name__}, not a number")
        try:
            new = float(new)
        except (TypeError, ValueError):
            raise ValueError(f"the beta rule returned {type(new).__name__}, not a number") from None
        if not (math.isfinite(new) and new > 0):
            raise ValueError(f"the beta rule returned {new!r}; beta must stay a finite number > 0")
        self.value = min(max(new, self.beta_min), self.beta_max)
        return self.value


def _loss_adapter(kl_penalty_loss: Callable) -> Callable:
    def policy_loss(new_params, old_params, actions, advantages, beta, clip):
        return kl_penalty_loss(new_params[0], old_params[0], actions, advantages, beta, clip)
    return policy_loss


class _Solved(Exception):
    pass


def actor_vector(agent: ppo.Agent) -> np.ndarray:
    """The actor's parameters as one float64 vector (the order of ``agent.actor.parameters()``)."""
    return torch.cat([p.detach().reshape(-1) for p in agent.actor.parameters()]).double().numpy()


def make_agent() -> ppo.Agent:
    """An untrained CartPole agent of the task's shape (4 observations, 2 actions, 64x64 tanh)."""
    return _ppo().Agent(4, n_actions=2, hidden_sizes=(64, 64))


def agent_from_vector(vector) -> ppo.Agent:
    """A CartPole agent whose actor holds ``vector`` (see :func:`actor_vector`)."""
    agent = make_agent()
    vec = torch.as_tensor(np.asarray(vector, dtype=np.float64)).reshape(-1)
    n = sum(p.numel() for p in agent.actor.parameters())
    if vec.numel() != n:
        raise ValueError(f"vector: expected {n} actor parameters, got {vec.numel()}")
    if not bool(torch.isfinite(vec).all()):
        raise ValueError("vector: the parameters are not all finite")
    torch.nn.utils.vector_to_parameters(vec.float(), agent.actor.parameters())
    return agent


def evaluate(vector, episodes: int = EVAL_EPISODES, seed: int = 0) -> list[float]:
    """Returns of ``episodes`` CartPole episodes of the actor ``vector`` (sampled actions, seeded)."""
    return _ppo().evaluate(agent_from_vector(vector), "CartPole", episodes, seed=seed, deterministic=False)


def _preflight(kl_penalty_loss: Callable, beta_rule: Callable) -> None:
    """Call the student's functions once on tiny inputs, so that a stub or a wrong return type
    fails at once with its own message instead of deep inside a training run."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 2, generator=g, requires_grad=True)
    out = kl_penalty_loss(logits, logits.detach() + 0.1, torch.tensor([0.0, 1.0, 1.0, 0.0]),
                          torch.randn(4, generator=g), 1.0, 0.2)
    if not isinstance(out, torch.Tensor) or out.numel() != 1 or not out.requires_grad:
        raise ValueError("kl_penalty_loss must return a scalar torch tensor that depends on logits_new")
    RuleController(beta_rule).update(0.05)


def train(kl_penalty_loss: Callable, beta_rule: Callable, seed: int = 0, budget: int = BUDGET,
          progress: bool = False) -> list:
    """Train CartPole with the student's loss and beta rule; return ``[actor, history, info]``.

    ``actor`` is the actor's parameter vector (:func:`actor_vector`), ``history`` an array with
    one row per update and the columns :data:`HISTORY_COLUMNS`, ``info`` is
    ``[solved (0/1), environment steps used]``.
    """
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    rows: list[list[float]] = []
    found: dict = {}

    def callback(update, agent, rec):
        rows.append([float(rec[k]) for k in HISTORY_COLUMNS])
        if rec["episodes_finished"] >= 20 and rec["episodic_return"] >= SOLVED_RETURN:
            returns = _ppo().evaluate(agent, "CartPole", EVAL_EPISODES, seed=10_000 + seed,
                                    deterministic=False)
            if np.mean(returns) >= 499:
                found["agent"] = agent
                raise _Solved

    _preflight(kl_penalty_loss, beta_rule)
    cfg = config(seed, total_timesteps=budget, kl_controller=RuleController(beta_rule),
                 policy_loss_fn=_loss_adapter(kl_penalty_loss))
    try:
        agent = _ppo().train(cfg, progress=progress, callback=callback).agent
        solved = 0.0
    except _Solved:
        agent, solved = found["agent"], 1.0
    history = np.array(rows, dtype=np.float64).reshape(-1, len(HISTORY_COLUMNS))
    steps = history[-1, 0] if len(history) else 0.0
    return [actor_vector(agent), history, np.array([solved, steps])]


def judge(result, eval_seed: int, budget: int = BUDGET) -> tuple[float, str]:
    """Score one run from the plain data :func:`train` returns: ``(credit in [0, 1], message)``.

    Half the credit: the actor, evaluated here on ``EVAL_EPISODES`` episodes seeded with
    ``eval_seed``, averages at least 475 and the run stayed within ``budget`` steps. The other
    half: the run is solved *and* the median KL of the logged updates lies in
    ``[target / 1.5, 1.5 * target]``. The history is reported by the notebook, the return is
    measured here: tying the KL half to a solved run means no credit comes from numbers alone.
    """
    try:
        actor, history = np.asarray(result[0], dtype=np.float64), np.asarray(result[1], dtype=np.float64)
        if history.ndim != 2 or history.shape[1] != len(HISTORY_COLUMNS) or len(history) == 0:
            raise ValueError("the history must have one row per update and "
                             f"{len(HISTORY_COLUMNS)} columns {HISTORY_COLUMNS}")
        returns = evaluate(actor, EVAL_EPISODES, seed=eval_seed)
    except (TypeError, ValueError, IndexError) as exc:
        return 0.0, f"not a training result [actor, history, info]: {exc}"
    mean_return = float(np.mean(returns))
    steps = float(history[-1, 0])
    kl = history[:, 1]
    ratio = float(np.median(kl)) / KL_TARGET if np.all(np.isfinite(kl)) else float("nan")
    solved = mean_return >= SOLVED_RETURN and steps <= budget
    held = solved and bool(1 / 1.5 <= ratio <= 1.5)
    parts = [f"the trained policy's mean return over {EVAL_EPISODES} new episodes is "
             f"{mean_return:.0f} ({'solved' if solved else 'not solved'}: needs >= {SOLVED_RETURN:g}"
             f" within {budget:,} steps, used {steps:,.0f})",
             f"median KL of the {len(kl)} updates = {ratio:.2f} x target "
             f"({'held' if held else 'not counted' if not solved else 'not held'}: the band is "
             "[0.67, 1.5] x target, counted for a solved run)"]
    return 0.5 * solved + 0.5 * held, "; ".join(parts)
