"""Project 1's outcome task: a student's own KL-penalty PPO on the batched CartPole.

The student writes the whole algorithm (rollouts on :class:`klbook_lib.envs.CartPole`, GAE,
the clipped and KL-penalised loss, the adaptive-beta controller, the training loop); this
module only fixes what the grader must be able to read back:

``make_actor()``             the actor's shape (4 -> 64 -> 64 -> 2, tanh), so that the grader can
                             load the returned parameters into a fresh copy;
``actor_vector(actor)``      its parameters as one float64 vector;
:func:`package`              what the notebook's given ``train_project`` returns: the student's
                             run ``[actor, history, old_actor, states]`` plus the probe of the
                             loss's KL term (:func:`kl_probe`, as in exercise 3).

:func:`judge` scores one run in the grader's own process, with milestones (credits add up to 1):

* nothing unless the loss has a working KL term (the probe) and the run is well formed;
* 0.2 *learning*: the returned actor, played here on 32 fresh episodes, averages at least 200;
* 0.2 *solved*: that mean is at least 475 and the run stayed within the step budget;
* 0.3 *controller acted* (learning runs only): beta changed during the run and each logged
  beta is the adaptive rule applied to the previous beta and the previous update's KL, with
  the run's target (beta may stay put at a bound the student chose);
* 0.3 *KL held* (learning runs whose controller acted): the median per-update KL lies in
  ``[target/2, 2 target]`` for the run's own target, and the last update's reported KL is what
  the judge computes itself from the actor before that update, the final actor and the
  update's states. Tied to the controller: a fixed beta or a target written into the loop can
  land in the band by luck, and the milestone is about the controller holding the target.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn

from klbook_grader.tasks import cartpole_kl

OBS_DIM, N_ACTIONS, HIDDEN = 4, 2, 64
BUDGET = 200_000                  # environment steps of one run
EVAL_EPISODES = 32
LEARNED_RETURN, SOLVED_RETURN = 200.0, 475.0
KL_BAND = (0.5, 2.0)              # the median per-update KL, in units of the run's target
HISTORY_COLUMNS = ("global_step", "kl", "beta")
PROBE_BETA = cartpole_kl.PROBE_BETA   # the same probe as exercise 3
PROBE_RTOL = 1e-4
LAST_KL_RTOL = 1e-3
RULE_AGREEMENT = 0.9              # share of logged beta changes that must follow the rule


def make_actor() -> nn.Sequential:
    """A fresh actor of the project's shape: logits of pi_theta(.|s) for the 2 CartPole actions."""
    return nn.Sequential(nn.Linear(OBS_DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, N_ACTIONS))


def actor_vector(actor: nn.Module) -> np.ndarray:
    """The actor's parameters as one float64 vector (the order of ``actor.parameters()``)."""
    return torch.cat([p.detach().reshape(-1) for p in actor.parameters()]).double().numpy()


def actor_from_vector(vector) -> nn.Sequential:
    """A :func:`make_actor` actor holding ``vector`` (float64)."""
    actor = make_actor().double()
    vec = torch.as_tensor(np.asarray(vector, dtype=np.float64)).reshape(-1)
    n = sum(p.numel() for p in actor.parameters())
    if vec.numel() != n:
        raise ValueError(f"actor: expected {n} parameters, got {vec.numel()}")
    if not bool(torch.isfinite(vec).all()):
        raise ValueError("actor: the parameters are not all finite")
    torch.nn.utils.vector_to_parameters(vec, actor.parameters())
    return actor


def evaluate(vector, episodes: int = EVAL_EPISODES, seed: int = 0) -> list[float]:
    """Returns of ``episodes`` CartPole episodes of the actor ``vector`` (sampled actions, seeded)."""
    from klbook_lib.envs import CartPole

    actor = actor_from_vector(vector)
    env = CartPole(num_envs=episodes, seed=seed, dtype=torch.float64)
    obs = env.reset(seed=int(seed))
    gen = torch.Generator().manual_seed(seed + 1)
    done_ret = torch.full((episodes,), float("nan"), dtype=torch.float64)
    with torch.no_grad():
        for _ in range(env.max_episode_steps):
            probs = torch.softmax(actor(obs), -1)
            action = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            obs, _, term, trunc, info = env.step(action)
            first = (term | trunc) & torch.isnan(done_ret)
            done_ret = torch.where(first, info["episode_return"], done_ret)
            if not bool(torch.isnan(done_ret).any()):
                break
    return done_ret.tolist()


PROBE_SEED = 2025                 # other inputs than exercise 3's probe (the same probe)


def kl_probe_inputs() -> tuple[torch.Tensor, ...]:
    """Fixed inputs ``(logits_new, logits_old, actions, advantages)`` of 16 states, 2 actions."""
    return cartpole_kl.kl_probe_inputs(PROBE_SEED)


def kl_probe(loss_fn: Callable) -> np.ndarray:
    """``[L(beta) - L(0), its gradient in logits_new]`` of ``loss_fn`` on :func:`kl_probe_inputs`
    (:func:`klbook_grader.tasks.cartpole_kl.kl_probe`, exercise 3's probe)."""
    return cartpole_kl.kl_probe(loss_fn, seed=PROBE_SEED, name="ppo_kl_loss")


def expected_kl_probe() -> np.ndarray:
    """What :func:`kl_probe` gives for a correct loss."""
    return cartpole_kl.expected_kl_probe(PROBE_SEED)


def package(run, loss_fn: Callable) -> list:
    """``run`` (the student's ``[actor, history, old_actor, states]``) plus :func:`kl_probe` of
    ``loss_fn``: what the grader receives from one training call."""
    if not isinstance(run, (list, tuple)) or len(run) != 4:
        raise ValueError("train_ppo_kl must return [actor, history, old_actor, states]")
    return [*run, kl_probe(loss_fn)]


def _rule(beta: float, kl: float, target: float) -> float:
    if kl < target / 1.5:
        return beta / 2
    if kl > 1.5 * target:
        return beta * 2
    return beta


def _exact_kl(old_vec, new_vec, states: np.ndarray) -> float:
    """mean_s KL(pi_old(.|s) || pi_new(.|s)) of two actor vectors on ``states`` (float64)."""
    s = torch.as_tensor(states, dtype=torch.float64)
    with torch.no_grad():
        lp_old = torch.log_softmax(actor_from_vector(old_vec)(s), -1)
        lp_new = torch.log_softmax(actor_from_vector(new_vec)(s), -1)
        from klbook_lib.divergences import kl_from_log_probs   # here: not offered to the cells' sandbox
        return float(kl_from_log_probs(lp_old, lp_new).mean())


def controller_acted(history: np.ndarray, target: float) -> tuple[bool, str]:
    """Whether beta changed and followed the adaptive rule through the logged updates."""
    kl, beta = history[:, 1], history[:, 2]
    if len(beta) < 3 or not np.all(np.isfinite(beta)) or np.any(beta <= 0):
        return False, "beta is missing, not positive or not finite"
    changes = int(np.sum(~np.isclose(beta[1:], beta[:-1], rtol=1e-9, atol=0)))
    want = np.array([_rule(b, k, target) for b, k in zip(beta[:-1], kl[:-1])])
    follows = np.isclose(beta[1:], want, rtol=1e-6, atol=0) | (
        np.isclose(beta[1:], beta[:-1], rtol=1e-9, atol=0) & ~np.isclose(want, beta[:-1], rtol=1e-9, atol=0)
        & ((beta[:-1] >= beta.max() * (1 - 1e-9)) | (beta[:-1] <= beta.min() * (1 + 1e-9))))
    share = float(np.mean(follows))
    ok = changes >= 2 and share >= RULE_AGREEMENT
    return ok, (f"beta changed {changes} times; {100 * share:.0f} % of its steps follow the adaptive rule "
                f"for this run's target (needs >= 2 changes and {100 * RULE_AGREEMENT:.0f} %)")


def judge(result, eval_seed: int, kl_target: float, budget: int = BUDGET) -> tuple[float, str]:
    """Score one run (the plain data :func:`package` returns): ``(credit in [0, 1], message)``."""
    try:
        actor, history, old_actor, states, probe = result
        history = np.asarray(history, dtype=np.float64)
        if history.ndim != 2 or history.shape[1] != len(HISTORY_COLUMNS) or len(history) < 3:
            raise ValueError(f"the history must have one row per update and the columns {HISTORY_COLUMNS}")
        states = np.asarray(states, dtype=np.float64).reshape(-1, OBS_DIM)
        returns = evaluate(actor, EVAL_EPISODES, seed=eval_seed)
        last_kl = _exact_kl(old_actor, actor, states)
    except (TypeError, ValueError, IndexError) as exc:
        return 0.0, f"not a training result [actor, history, old_actor, states, probe]: {exc}"
    want = expected_kl_probe()
    got = np.asarray(probe, dtype=np.float64).reshape(-1)
    if got.shape != want.shape or not np.allclose(got, want, rtol=PROBE_RTOL, atol=1e-10):
        return 0.0, ("the loss's KL term does not work: ppo_kl_loss(beta) - ppo_kl_loss(0) and its gradient "
                     "are not beta * mean KL(pi_old || pi_theta) and its gradient; a run without a working "
                     "KL penalty earns nothing")
    mean_return = float(np.mean(returns))
    steps = float(history[-1, 0])
    learned = mean_return >= LEARNED_RETURN
    solved = mean_return >= SOLVED_RETURN and steps <= budget
    kl = history[:, 1]
    ratio = float(np.median(kl)) / kl_target if np.all(np.isfinite(kl)) else float("nan")
    lo, hi = KL_BAND
    honest = bool(np.isclose(kl[-1], last_kl, rtol=LAST_KL_RTOL, atol=1e-9))
    acted, acted_msg = controller_acted(history, kl_target)
    acted = acted and learned
    held = acted and honest and lo <= ratio <= hi
    parts = [f"the trained policy's mean return over {EVAL_EPISODES} new episodes is {mean_return:.0f} "
             f"(learning needs >= {LEARNED_RETURN:g}, solved >= {SOLVED_RETURN:g} within {budget:,} steps; "
             f"used {steps:,.0f})",
             f"median KL of the {len(kl)} updates = {ratio:.3g} x this run's target (band [{lo:g}, {hi:g}]; "
             f"counted for a learning run whose controller acted and whose last reported KL matches the judge's, "
             f"{'it does' if honest else 'it does not'}: reported {kl[-1]:.4g}, recomputed {last_kl:.4g})",
             acted_msg + ("" if learned else " (counted only for a learning run)")]
    credit = 0.2 * learned + 0.2 * solved + 0.3 * held + 0.3 * acted
    return credit, "; ".join(parts)
