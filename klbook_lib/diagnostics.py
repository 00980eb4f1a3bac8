"""KL as a diagnostic: reading a training run's KL history, and measuring a policy's sensitivity.

Nothing here changes training; everything reads what a run logged or probes a policy.

Reading a history (a dict of per-update lists, e.g. ``klbook_lib.ppo.train(...).history``, or
your own logs with the same keys):

* :func:`kl_phases` splits the trajectory of ``log KL`` into phases (binary segmentation with
  least squares: the phase boundaries are the change points of the mean of ``log KL``) and
  labels each one "adjustment" (the policy still moves a lot per update) or "polishing";
* :func:`diagnose_run` looks at the first ``window`` updates only and flags the three patterns
  that announced failed CartPole runs in the book: a per-update KL too small to learn anything,
  one too large to be a trust region, and a policy that became (nearly) deterministic, whose
  KL to the uniform policy is close to ``log|A|``.

Probing a policy (categorical policies of :class:`klbook_lib.ppo.Agent`):

* :func:`fisher_trace`: the trace of the Fisher information of the actor's parameters,
  ``E_s tr F_s`` with ``F_s = E_{a~pi}[grad log pi(a|s) grad log pi(a|s)^T]``, and of the
  Fisher in logit space, ``E_s tr(diag(pi) - pi pi^T) = E_s (1 - sum_a pi(a|s)^2)``;
* :func:`random_step_kl`: the KL ``KL(pi_theta || pi_theta+eps*u)`` of a parameter step of
  fixed length ``eps`` in a random direction ``u``; for a small step it is about
  ``eps^2 tr(F) / (2 d)`` with ``d`` the number of parameters.

Collecting states and rollouts: :func:`collect_states` (e.g. the states of task A for a
penalty against forgetting) and :func:`collect_rollout` (a ``(T, N)`` batch from one or several
batched environments, with the ``done`` flags needed by :func:`klbook_lib.monitor.batch_mean`).
"""
from __future__ import annotations

import copy
import math
from typing import Mapping, Sequence

import numpy as np
import torch

from klbook_lib import envs as _envs
from klbook_lib.divergences import kl_from_logits

__all__ = ["collect_states", "collect_rollout", "evaluate_agents", "fisher_trace", "random_step_kl", "kl_phases",
           "diagnose_run", "DEFAULT_KL_BAND"]

#: The per-update KL band of :func:`diagnose_run`: a third of the PPO paper's smallest KL target
#: (0.003) to three times its largest (0.03), i.e. [0.001, 0.1] nats.
DEFAULT_KL_BAND = (1e-3, 0.1)


def _check_agent(agent, need_discrete: bool = False) -> None:
    if not (hasattr(agent, "dist_params") and hasattr(agent, "sample")):
        raise ValueError(f"agent: expected a klbook_lib.ppo.Agent, got {type(agent).__name__}")
    if need_discrete and not getattr(agent, "discrete", False):
        raise ValueError("agent: needs a categorical policy (discrete actions)")


def _check_obs(obs, agent) -> torch.Tensor:
    if not isinstance(obs, torch.Tensor) or obs.ndim != 2 or obs.shape[0] == 0:
        raise ValueError(f"obs: expected a non-empty (B, obs_dim) tensor of states, got "
                         f"{tuple(obs.shape) if isinstance(obs, torch.Tensor) else type(obs).__name__}")
    first = next(m for m in agent.actor if isinstance(m, torch.nn.Linear))
    if obs.shape[1] != first.in_features:
        raise ValueError(f"obs: states have {obs.shape[1]} features, the actor expects {first.in_features}")
    return obs.to(first.weight.dtype)


# =====================================================================================
# Collecting states and rollouts
# =====================================================================================

def collect_rollout(agent, envs, num_steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Run ``agent`` (sampling its actions) for ``num_steps`` steps in one or several batched envs.

    ``envs`` is an environment of :mod:`klbook_lib.envs` or a list of them (same observation
    size; their copies are placed side by side, e.g. copies with different physics). The
    rollout continues from the environments' current states (call ``reset`` first for a fresh
    start), so consecutive calls give consecutive batches. Returns ``obs`` ``(T, N, obs_dim)``
    (the state at which each action was taken), ``actions`` ``(T, N)``, ``done`` ``(T, N)``
    (the episode ended at that step) and ``group`` ``(N,)`` (which of ``envs`` each copy belongs to).
    """
    _check_agent(agent)
    group_envs = list(envs) if isinstance(envs, (list, tuple)) else [envs]
    if not group_envs:
        raise ValueError("envs: give at least one environment")
    dims = {e.obs_dim for e in group_envs}
    if len(dims) != 1:
        raise ValueError(f"envs: all environments need the same observation size, got {sorted(dims)}")
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
        raise ValueError(f"num_steps: must be a positive integer, got {num_steps!r}")
    gen = torch.Generator(device=group_envs[0].device)
    gen.manual_seed(int(seed))
    sizes = [e.num_envs for e in group_envs]
    obs_rows, act_rows, done_rows = [], [], []
    with torch.no_grad():
        for _ in range(num_steps):
            obs = torch.cat([e.obs for e in group_envs])
            action = agent.sample(agent.dist_params(obs), gen)
            done = []
            for e, a in zip(group_envs, action.split(sizes)):
                _, _, term, trunc, _ = e.step(a)
                done.append(term | trunc)
            obs_rows.append(obs)
            act_rows.append(action)
            done_rows.append(torch.cat(done))
    group = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(sizes)])
    return {"obs": torch.stack(obs_rows), "actions": torch.stack(act_rows),
            "done": torch.stack(done_rows), "group": group}


def collect_states(agent, env: str = "CartPole", num_envs: int = 16, num_steps: int = 64,
                   seed: int = 0, env_kwargs: dict | None = None) -> torch.Tensor:
    """States visited by ``agent`` (sampling) in ``num_envs`` fresh copies of ``env`` over
    ``num_steps`` steps: a ``(num_steps * num_envs, obs_dim)`` tensor, e.g. the states of task A
    for ``PPOConfig(anchor_obs=...)``."""
    _check_agent(agent)
    if env_kwargs is not None and not isinstance(env_kwargs, dict):
        raise ValueError(f"env_kwargs: must be a dict or None, got {type(env_kwargs).__name__}")
    e = _envs.make_env(env, num_envs, device="cpu", seed=seed, **(env_kwargs or {}))
    e.reset(seed=seed)
    obs = collect_rollout(agent, e, num_steps, seed=seed + 1)["obs"]
    return obs.reshape(-1, obs.shape[-1])


def evaluate_agents(agents: Sequence, env: str = "CartPole", num_episodes: int = 16,
                    seed: int = 12345, deterministic: bool = True,
                    env_kwargs: dict | None = None) -> np.ndarray:
    """``klbook_lib.ppo.evaluate`` for every agent in ``agents``, all stepped as one batch.

    Returns a ``(K, num_episodes)`` array: row ``k`` holds the returns that
    ``evaluate(agents[k], env, num_episodes, seed, deterministic)`` gives, from the same
    initial states and (when sampling) the same draws: each agent gets its own copy of the
    environment seeded with ``seed`` and its own generator seeded with ``seed + 1``, and the
    stacked forward of :class:`klbook_lib.ppo.AgentEnsemble` computes each agent's logits as
    the agent does. Categorical policies only. E.g. the policy of every update of a run,
    evaluated on common starting states at a fraction of the cost of one call per policy.
    """
    from klbook_lib.ppo import AgentEnsemble          # ppo does not import this module
    agents = list(agents)
    if not agents:
        raise ValueError("agents: need at least one agent")
    for a in agents:
        _check_agent(a, need_discrete=True)
    if not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"num_episodes: must be a positive integer, got {num_episodes!r}")
    if env_kwargs is not None and not isinstance(env_kwargs, dict):
        raise ValueError(f"env_kwargs: must be a dict or None, got {type(env_kwargs).__name__}")
    k = len(agents)
    batch = _envs.SeedBatch(env, num_episodes, [seed] * k, device="cpu", **(env_kwargs or {}))
    if not batch.discrete:
        raise ValueError(f"env: {env!r} has continuous actions; evaluate_agents needs a categorical one")
    ens = AgentEnsemble(agents)
    gens = [torch.Generator().manual_seed(seed + 1) for _ in range(k)]
    obs = batch.obs
    returns = torch.zeros(k, num_episodes, dtype=torch.float64)
    alive = torch.ones(k, num_episodes, dtype=torch.bool)
    with torch.no_grad():
        for _ in range(batch.max_episode_steps):
            logits = ens.logits(obs)
            if deterministic:
                action = logits.argmax(-1)
            else:                                     # Agent.sample's Gumbel-max, one generator each
                e = torch.stack([torch.empty_like(logits[i]).exponential_(generator=g)
                                 for i, g in enumerate(gens)])
                action = torch.argmax(logits - e.log(), -1)
            obs, reward, term, trunc, _ = batch.step(action)
            returns += reward.to(torch.float64) * alive
            alive &= ~(term | trunc)
            if not alive.any():
                break
    return returns.numpy()


# =====================================================================================
# Sensitivity of the policy to its parameters
# =====================================================================================

def fisher_trace(agent, obs: torch.Tensor) -> dict[str, float]:
    """Traces of the policy's Fisher information on the states ``obs`` (categorical actor only).

    With ``z = f_theta(s)`` the logits and ``J_s = dz/dtheta`` (actor parameters), the Fisher of
    ``pi(.|s)`` in parameter space is ``F_s = J_s^T M_s J_s`` with ``M_s = diag(pi) - pi pi^T``
    the Fisher in logit space. Returns the means over the states of

    * ``param``: ``tr F_s`` (how much a parameter step changes the policy, per unit squared length);
    * ``logit``: ``tr M_s = 1 - sum_a pi(a|s)^2`` (largest for the uniform policy, 0 for a
      deterministic one);
    * ``ratio``: ``param / logit``, the part due to the network (how large the logits' gradients are).

    For a small step ``dtheta``, ``KL(pi_theta || pi_theta+dtheta) = dtheta^T F dtheta / 2 + O(|dtheta|^3)``.
    """
    _check_agent(agent, need_discrete=True)
    obs = _check_obs(obs, agent)
    from torch.func import functional_call, jacrev, vmap

    actor = agent.actor
    params = {k: v.detach() for k, v in actor.named_parameters()}

    def logits(p, s):
        return functional_call(actor, p, (s[None],))[0]

    jac = vmap(jacrev(logits), in_dims=(None, 0))(params, obs)      # each (B, A, *param shape)
    b, a = obs.shape[0], agent.actor[-1].out_features
    gram = sum(j.reshape(b, a, -1) @ j.reshape(b, a, -1).transpose(1, 2) for j in jac.values())
    with torch.no_grad():
        p = torch.softmax(actor(obs), -1)
    m = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    param = (m * gram).sum((1, 2)).mean().item()
    logit = (1.0 - (p * p).sum(-1)).mean().item()
    return {"param": param, "logit": logit, "ratio": param / logit if logit > 0 else math.inf}


def random_step_kl(agent, obs: torch.Tensor, step_size: float, num_directions: int = 8,
                   seed: int = 0) -> float:
    """Mean ``KL(pi_theta(.|s) || pi_theta'(.|s))`` over ``obs`` and ``num_directions`` random
    steps ``theta' = theta + step_size * u`` of the actor's parameters, ``u`` uniform on the
    unit sphere (a categorical actor), computed in float64. The same ``seed`` draws the same
    directions: ``torch.randn`` of each parameter's shape in turn, normalised jointly."""
    _check_agent(agent, need_discrete=True)
    obs = _check_obs(obs, agent)
    if isinstance(step_size, bool) or not isinstance(step_size, (int, float)) or not (
            math.isfinite(step_size) and step_size > 0):
        raise ValueError(f"step_size: must be a finite number > 0, got {step_size!r}")
    if not isinstance(num_directions, int) or isinstance(num_directions, bool) or num_directions < 1:
        raise ValueError(f"num_directions: must be a positive integer, got {num_directions!r}")
    gen = torch.Generator().manual_seed(int(seed))
    # in float64: the KL of a small step is far below float32's resolution of the logits
    probe = copy.deepcopy(agent.actor).double()
    base = [p.detach().clone() for p in probe.parameters()]
    obs = obs.double()
    out = []
    with torch.no_grad():
        z0 = probe(obs)
        for _ in range(num_directions):
            u = [torch.randn(p.shape, generator=gen).double() for p in base]
            norm = torch.sqrt(sum((x * x).sum() for x in u))
            for q, b, x in zip(probe.parameters(), base, u):
                q.copy_(b + step_size * x / norm)
            out.append(kl_from_logits(z0, probe(obs)).mean().item())
    return float(np.mean(out))


# =====================================================================================
# Reading a KL history
# =====================================================================================

def _series(history: Mapping, key: str) -> np.ndarray:
    if not isinstance(history, Mapping):
        raise ValueError(f"history: expected a dict of per-update lists, got {type(history).__name__}")
    if key not in history:
        raise ValueError(f"history: no key {key!r} (keys: {sorted(history)[:12]}...)")
    x = np.asarray(history[key], dtype=float).reshape(-1)
    if x.size == 0:
        raise ValueError(f"history: {key!r} is empty")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"history: {key!r} has non-finite values")
    return x


def _best_split(y: np.ndarray, min_length: int) -> tuple[int, float]:
    """The split index minimising the within-segment sum of squares, and that sum."""
    n = len(y)
    c1, c2 = np.cumsum(y), np.cumsum(y * y)
    best, where = math.inf, -1
    for k in range(min_length, n - min_length + 1):
        left = c2[k - 1] - c1[k - 1] ** 2 / k
        rs, rs2 = c1[-1] - c1[k - 1], c2[-1] - c2[k - 1]
        right = rs2 - rs ** 2 / (n - k)
        if left + right < best:
            best, where = left + right, k
    return where, best


def kl_phases(history: Mapping, key: str = "kl_exact_mean", max_phases: int = 3,
              min_length: int = 10, min_gain: float = 0.1, adjust_ratio: float = 3.0,
              floor: float = 1e-12) -> list[dict]:
    """Split a run's KL trajectory into phases where the level of ``log KL`` is roughly constant.

    Binary segmentation: starting from the whole run, split the segment whose best split (the
    change point of a two-level least-squares fit of ``log max(KL, floor)``) removes the largest
    share of the total sum of squares, as long as that share is at least ``min_gain``, both
    parts have ``min_length`` updates and there are fewer than ``max_phases`` phases.

    Returns one dict per phase, in order: ``start`` and ``stop`` (update indices, ``stop``
    exclusive), ``median_kl``, and ``label``: "adjustment" when its median KL is at least
    ``adjust_ratio`` times the smallest phase median (the policy moves much more per update
    than later), else "polishing".
    """
    kl = _series(history, key)
    for name, v in (("max_phases", max_phases), ("min_length", min_length)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}: must be a positive integer, got {v!r}")
    if not 0 < min_gain < 1:
        raise ValueError(f"min_gain: must lie in (0, 1), got {min_gain}")
    if not adjust_ratio > 1:
        raise ValueError(f"adjust_ratio: must be > 1, got {adjust_ratio}")
    if not floor > 0:
        raise ValueError(f"floor: must be > 0, got {floor}")
    y = np.log(np.maximum(kl, floor))
    total = float(((y - y.mean()) ** 2).sum())
    bounds = [0, len(y)]
    while len(bounds) - 1 < max_phases and total > 0:
        best = None
        for a, b in zip(bounds[:-1], bounds[1:]):
            seg = y[a:b]
            if len(seg) < 2 * min_length:
                continue
            k, sse = _best_split(seg, min_length)
            gain = (float(((seg - seg.mean()) ** 2).sum()) - sse) / total
            if best is None or gain > best[0]:
                best = (gain, a + k)
        if best is None or best[0] < min_gain:
            break
        bounds = sorted(bounds + [best[1]])
    medians = [float(np.median(kl[a:b])) for a, b in zip(bounds[:-1], bounds[1:])]
    low = max(min(medians), floor)
    return [{"start": a, "stop": b, "median_kl": m,
             "label": "adjustment" if m >= adjust_ratio * low and len(medians) > 1 else "polishing"}
            for a, b, m in zip(bounds[:-1], bounds[1:], medians)]


def diagnose_run(history: Mapping, window: int = 20, kl_band: Sequence[float] = DEFAULT_KL_BAND,
                 collapse: float = 0.9, n_actions: int | None = None,
                 key: str = "kl_exact_mean") -> dict:
    """Flag a run from its first ``window`` updates only (before the return can tell).

    * ``"kl_too_small"``: the median per-update KL is below ``kl_band[0]`` (the policy hardly moves:
      a learning rate too small, or a policy that stopped changing);
    * ``"kl_too_large"``: the median is above ``kl_band[1]`` (updates far outside a trust region);
    * ``"collapsed"``: at update ``window`` the policy's mean ``KL(pi || uniform)`` is above
      ``collapse * log|A|`` (it has become nearly deterministic, so it no longer explores).

    The collapse check needs the number of actions ``n_actions`` (2 for CartPole) and reads
    the KL to the uniform policy from ``history["kl_uniform_mean"]`` or, if absent, computes it
    from ``history["entropy"]`` as ``log(n_actions) - entropy``; with ``n_actions=None`` it is
    skipped. Returns ``{"flags": [...], "ok": bool, "median_kl": ..., "kl_uniform": ... or None,
    "checks": [the checks that ran]}``.
    """
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"window: must be a positive integer, got {window!r}")
    lo, hi = (float(v) for v in kl_band)
    if not 0 < lo < hi:
        raise ValueError(f"kl_band: need 0 < low < high, got {tuple(kl_band)}")
    if not 0 < collapse < 1:
        raise ValueError(f"collapse: must lie in (0, 1), got {collapse}")
    if n_actions is not None and (not isinstance(n_actions, int) or isinstance(n_actions, bool)
                                  or n_actions < 2):
        raise ValueError(f"n_actions: must be an integer >= 2 or None, got {n_actions!r}")
    kl = _series(history, key)
    if len(kl) < window:
        raise ValueError(f"history: {key!r} has {len(kl)} updates, fewer than window={window}")
    med = float(np.median(kl[:window]))
    flags, checks = [], ["kl_too_small", "kl_too_large"]
    if med < lo:
        flags.append("kl_too_small")
    if med > hi:
        flags.append("kl_too_large")
    klu = None
    if n_actions is not None and "kl_uniform_mean" in history:
        klu = float(_series(history, "kl_uniform_mean")[window - 1])
    elif n_actions is not None and "entropy" in history:
        klu = math.log(n_actions) - float(_series(history, "entropy")[window - 1])
    if klu is not None:
        checks.append("collapsed")
        if klu > collapse * math.log(n_actions):
            flags.append("collapsed")
    return {"flags": flags, "ok": not flags, "median_kl": med, "kl_uniform": klu, "checks": checks}
