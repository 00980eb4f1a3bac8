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
fresh episodes, averages at least 475; *KL held* if the median KL of the updates lies within
``[target / 2, 2 * target]``. A single update's KL scatters widely around the target (chapter 3:
most updates land outside the rule's dead band ``[target / 1.5, 1.5 * target]``), and so does the
median of a run: the reference solution's medians lay between 0.67 and 0.96 x target on seeds
0-6 and 100 (chosen on those seeds; ``tests/grader/test_exercise_traps.py`` checks more), hence the
wider band.

A run counts only if its loss has a working KL term: clipping alone solves CartPole, so a loss
without the penalty would otherwise earn the *solved* half. :func:`train` therefore measures,
on fixed inputs (:func:`kl_probe_inputs`), the loss at ``beta`` minus the loss at ``beta = 0`` and
its gradient with respect to ``logits_new``; :func:`judge` compares them, in its own process,
with ``beta * mean_s KL(pi_old(.|s) || pi_theta(.|s))`` and its gradient
``beta * (pi_theta - pi_old) / N``.
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
KL_BAND = (0.5, 2.0)                  # the median KL of a run, in units of the target
PROBE_BETA = 0.7
PROBE_RTOL = 1e-4


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


def kl_probe_inputs(seed: int = 2024) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed inputs of the KL-term probe: ``(logits_new, logits_old, actions, advantages)`` of 16
    states and 2 actions (float64; a policy that moved, advantages that are not zero)."""
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(16, 2, generator=g, dtype=torch.float64)
    new = old + 0.3 * torch.randn(16, 2, generator=g, dtype=torch.float64)
    actions = torch.randint(0, 2, (16,), generator=g).double()
    return new, old, actions, torch.randn(16, generator=g, dtype=torch.float64)


def kl_probe(kl_penalty_loss: Callable, seed: int = 2024, name: str = "kl_penalty_loss") -> np.ndarray:
    """``[L(beta) - L(0), d(L(beta) - L(0)) / d logits_new (32 numbers)]`` of the loss on
    :func:`kl_probe_inputs`, ``beta =`` :data:`PROBE_BETA`: the loss's KL term and its gradient.
    ``name`` is the student's function, for the error message."""
    new, old, actions, adv = kl_probe_inputs(seed)
    out = []
    for beta in (PROBE_BETA, 0.0):
        logits = new.clone().requires_grad_(True)
        loss = kl_penalty_loss(logits, old.clone(), actions.clone(), adv.clone(), beta, 0.2)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(f"{name} must return a scalar torch tensor")
        loss = loss.reshape(())
        grad, = torch.autograd.grad(loss, logits, allow_unused=True)
        grad = torch.zeros_like(logits) if grad is None else grad
        out.append(np.concatenate([[float(loss.detach())], grad.detach().double().reshape(-1).numpy()]))
    return out[0] - out[1]


def expected_kl_probe(seed: int = 2024) -> np.ndarray:
    """What :func:`kl_probe` gives for a correct loss, computed here with its own formula."""
    new, old, _, _ = kl_probe_inputs(seed)
    lp_new, lp_old = torch.log_softmax(new, -1), torch.log_softmax(old, -1)
    kl = (lp_old.exp() * (lp_old - lp_new)).sum(-1).mean()
    grad = (lp_new.exp() - lp_old.exp()) / len(new)
    return PROBE_BETA * np.concatenate([[float(kl)], grad.reshape(-1).numpy()])


def train(kl_penalty_loss: Callable, beta_rule: Callable, seed: int = 0, budget: int = BUDGET,
          progress: bool = False) -> list:
    """Train CartPole with the student's loss and beta rule; return ``[actor, history, info, probe]``.

    ``actor`` is the actor's parameter vector (:func:`actor_vector`), ``history`` an array with
    one row per update and the columns :data:`HISTORY_COLUMNS`, ``info`` is
    ``[solved (0/1), environment steps used]``, ``probe`` the loss's KL term measured by
    :func:`kl_probe`.
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
    probe = kl_probe(kl_penalty_loss)
    cfg = config(seed, total_timesteps=budget, kl_controller=RuleController(beta_rule),
                 policy_loss_fn=_loss_adapter(kl_penalty_loss))
    try:
        agent = _ppo().train(cfg, progress=progress, callback=callback).agent
        solved = 0.0
    except _Solved:
        agent, solved = found["agent"], 1.0
    history = np.array(rows, dtype=np.float64).reshape(-1, len(HISTORY_COLUMNS))
    steps = history[-1, 0] if len(history) else 0.0
    return [actor_vector(agent), history, np.array([solved, steps]), probe]


def kl_term_works(result) -> tuple[bool, str]:
    """Whether the run's probe of its loss (:func:`kl_probe`) shows a correct KL term."""
    want = expected_kl_probe()
    try:
        got = np.asarray(result[3], dtype=np.float64).reshape(-1)
    except (TypeError, ValueError, IndexError):
        return False, "the run did not report the probe of its loss's KL term"
    if got.shape != want.shape or not np.all(np.isfinite(got)):
        return False, "the probe of the loss's KL term is malformed"
    ok = bool(np.allclose(got, want, rtol=PROBE_RTOL, atol=1e-10))
    return ok, ("the loss's KL term works" if ok else
                "the loss's KL term does not work: loss(beta) - loss(0) and its gradient are not "
                "beta * mean KL(pi_old || pi_theta) and its gradient (no KL penalty, or the wrong one); "
                "a run without a working KL penalty earns nothing (clipping alone solves CartPole)")


def judge(result, eval_seed: int, budget: int = BUDGET) -> tuple[float, str]:
    """Score one run from the plain data :func:`train` returns: ``(credit in [0, 1], message)``.

    Nothing without a working KL term in the loss (the probe, compared here with
    :func:`expected_kl_probe`). Then half the credit: the actor, evaluated here on
    ``EVAL_EPISODES`` episodes seeded with ``eval_seed``, averages at least 475 and the run stayed
    within ``budget`` steps. The other half: the run is solved *and* the median KL of the logged
    updates lies in :data:`KL_BAND` x target. The history is reported by the notebook, the return
    is measured here: tying the KL half to a solved run means no credit comes from numbers alone.
    """
    try:
        actor, history = np.asarray(result[0], dtype=np.float64), np.asarray(result[1], dtype=np.float64)
        if history.ndim != 2 or history.shape[1] != len(HISTORY_COLUMNS) or len(history) == 0:
            raise ValueError("the history must have one row per update and "
                             f"{len(HISTORY_COLUMNS)} columns {HISTORY_COLUMNS}")
        returns = evaluate(actor, EVAL_EPISODES, seed=eval_seed)
    except (TypeError, ValueError, IndexError) as exc:
        return 0.0, f"not a training result [actor, history, info, probe]: {exc}"
    kl_ok, kl_msg = kl_term_works(result)
    mean_return = float(np.mean(returns))
    steps = float(history[-1, 0])
    kl = history[:, 1]
    ratio = float(np.median(kl)) / KL_TARGET if np.all(np.isfinite(kl)) else float("nan")
    solved = mean_return >= SOLVED_RETURN and steps <= budget
    lo, hi = KL_BAND
    in_band = bool(lo <= ratio <= hi)
    held = solved and in_band
    verdict = ("held" if held else "within the band, but counted only for a solved run" if in_band
               else "not held")
    parts = [kl_msg,
             f"the trained policy's mean return over {EVAL_EPISODES} new episodes is "
             f"{mean_return:.0f} ({'solved' if solved else 'not solved'}: needs >= {SOLVED_RETURN:g}"
             f" within {budget:,} steps, used {steps:,.0f})",
             f"median KL of the {len(kl)} updates = {ratio:.3g} x target ({verdict}: the band is "
             f"[{lo:g}, {hi:g}] x target)"]
    if not kl_ok:
        return 0.0, "; ".join(parts)
    return 0.5 * solved + 0.5 * held, "; ".join(parts)
