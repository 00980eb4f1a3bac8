"""A small, readable PPO with KL control (CleanRL style, one file, top to bottom).

Usage
-----
>>> import klbook_lib as kb
>>> cfg = kb.ppo.PPOConfig()                      # the fast CartPole preset
>>> res = kb.ppo.train(cfg, progress=False)       # doctest: +SKIP
>>> res.history["episodic_return"][-1]            # doctest: +SKIP
>>> res.solved, res.solved_at_step                # doctest: +SKIP

KL-penalised PPO with a coefficient controller (any object with ``.value`` and
``.update(kl, n_steps)``, e.g. those of :mod:`klbook_lib.controllers`)::

    ctrl = kb.controllers.AdaptiveKL(beta=1.0, target=0.01)
    cfg = kb.ppo.PPOConfig(objective="kl_penalty", kl_controller=ctrl,
                           total_timesteps=50_000, stop_at_return=None)
    res = kb.ppo.train(cfg)
    res.history["beta"], res.history["kl_exact_mean"]      # plot these

A fixed coefficient without a controller: ``PPOConfig(objective="kl_penalty", kl_coef=0.5)``.
Continuous actions (diagonal Gaussian policy): ``kb.ppo.PPOConfig.pendulum()``.
A changed task, a controlled entropy bonus, fine-tuning and a penalty against forgetting
(chapter "KL as a tool")::

    PPOConfig(env="DeceptiveChain", env_kwargs={"length": 10},
              ent_controller=kb.controllers.EntropyBandController(0.01, low=0.05, high=0.3))
    PPOConfig(env_kwargs={"length": 0.05}, init_agent=pi_A,            # CartPole, short pole
              anchor_agent=pi_A, anchor_obs=states_A, anchor_coef=0.1)
Presets take overrides: ``PPOConfig.cartpole_fast(seed=3)``. The benchmark's CartPole preset:
``PPOConfig.cartpole_bench()``. ``PPOConfig.describe()`` says what every field means.

Many seeds at once (:func:`train_seeds`, the last section of this file): the K seeds' networks
and environments batched into one computation; seed ``s`` of the batch is the run
``train(PPOConfig(seed=s, ...))`` (same actions, same numbers), in a fraction of the time::

    results = kb.ppo.train_seeds(kb.ppo.PPOConfig(), seeds=range(10))   # list of PPOResult

or a list of configs that differ only in ``seed`` and :data:`PER_SEED` (each seed's own
``pi_A`` fine-tuned with its own anchor), member ``i`` being ``train(configs[i])``::

    configs = [kb.ppo.PPOConfig(seed=s, init_agent=pi[s], anchor_agent=pi[s], anchor_obs=states[s],
                                anchor_coef=0.1, env_kwargs={"length": 0.05}) for s in seeds]
    results = kb.ppo.train_seeds(configs)

``res.history`` is a dict of lists, one entry per update (see :data:`HISTORY_KEYS`).
``res.agent`` is the trained :class:`Agent`; ``res.kl_controller`` the controller after
training (the config's controller is deep-copied, so a config can be reused).
``kb.ppo.evaluate(res.agent, "CartPole", 16)`` gives greedy returns on fresh episodes;
``train(cfg, callback=f)`` calls ``f(update, agent, record)`` after every update, e.g. to
evaluate the policy of each update. ``res.episode_start_updates`` dates every finished
episode by the update in which it started (a return is late news about that policy).

What one update does (:func:`train`, read it top to bottom):

1. Rollout: ``num_envs`` copies step ``num_steps`` times; per step only the actor runs
   (categorical actions by the Gumbel-max trick). The integer ``agent.version`` counts
   optimizer steps; the rollout records the version that collected the batch.
2. With the same policy, batched over the whole rollout: the old log-probabilities
   ``log pi_old(a_t|s_t)``, the old distribution parameters (for the exact KL), the values,
   and GAE advantages (truncated episodes are bootstrapped from ``V`` of their last state).
3. ``update_epochs`` passes of Adam steps on the objective

   * ``clip``:             ``-E[min(r A, clip(r, 1-eps, 1+eps) A)]``
   * ``kl_penalty``:       ``-E[r A] + beta * KL(pi_old || pi_theta)``
   * ``clip+kl_penalty``:  the clipped term plus ``beta * KL``

   with ``r = exp(clamp(log pi_theta - log pi_old))``, plus ``vf_coef`` times the value loss.
   Before each step the stored old log-probs are checked to come from the rollout's policy
   version (:class:`StaleLogProbError` otherwise), and at the first step they must equal
   the current policy's log-probs numerically.
4. Monitor (:mod:`klbook_lib.monitor`): exact ``KL(pi_old || pi_theta)`` per state and the k1/k3
   estimates on the batch, their mean / max / p90 / p99, the clip fraction, the entropy, the
   gradient-norm ratio of penalty to surrogate, an EMA of the KL; then the controller gets
   ``update(kl_exact_mean, batch_size)``.

Deliberate bugs for the bug-zoo chapter, all off by default: ``bug_recompute_old_logprobs``,
``bug_flip_logratio``, ``bug_no_logratio_clamp``, ``bug_no_std_floor`` and
``kl_action_reduce="mean"`` (see :class:`PPOConfig`). Pendulum has one action dimension,
where "mean" and "sum" coincide; use ``PPOConfig.pendulum(env="PendulumArray")`` (three
pendulums, three action dimensions) to see that bug.
"""
from __future__ import annotations

import copy
import math
import time
from collections import deque
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
from tqdm import tqdm

from klbook_lib import envs as _envs
from klbook_lib import estimators as _estimators
from klbook_lib import monitor as _monitor
from klbook_lib import optim as _optim
from klbook_lib.divergences import gaussian_kl, kl_from_log_probs

__all__ = ["PPOConfig", "PPOResult", "Agent", "AgentEnsemble", "train", "train_seeds", "evaluate", "gae",
           "surrogate_loss", "check_logprobs_fresh", "StaleLogProbError", "HISTORY_KEYS", "OBJECTIVES",
           "KL_PENALTY_ESTIMATORS", "NOT_BATCHED", "PER_SEED"]

OBJECTIVES = ("clip", "kl_penalty", "clip+kl_penalty")
KL_PENALTY_ESTIMATORS = ("exact", "k1", "k2", "k3")

#: Keys of ``PPOResult.history`` (each a list with one entry per update).
HISTORY_KEYS = (
    "update", "global_step", "wall_time", "policy_version", "learning_rate", "clip_coef", "beta",
    "kl_exact_mean", "kl_exact_max", "kl_exact_p90", "kl_exact_p99",
    "k1_mean", "k1_max", "k1_p90", "k1_p99", "k3_mean", "k3_max", "k3_p90", "k3_p99",
    "kl_ema", "kl_penalty_value", "clip_frac", "entropy", "grad_ratio", "policy_loss",
    "value_loss", "epochs_run", "explained_variance", "episodic_return", "episodes_finished",
    "ent_coef", "kl_uniform_mean", "anchor_kl",
)


class StaleLogProbError(RuntimeError):
    """The stored ``log pi_old(a|s)`` were not produced by the policy that collected the batch."""


# =====================================================================================
# The configuration. Each hyperparameter is said once: its default, the check of its value
# and its meaning, on one line. The ones most runs change come first.
# =====================================================================================

def _positive_int(name: str, v) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name}: must be a positive integer, got {v!r}")


def _seed(name: str, v) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"{name}: must be a non-negative integer, got {v!r}")


def _number(lo: float | None = None, hi: float | None = None, lo_open: bool = False,
            hi_open: bool = False, allow_none: bool = False) -> Callable[[str, Any], None]:
    """A check that the value is a finite number in the given range (or None if allowed)."""
    def check(name: str, v) -> None:
        if v is None and allow_none:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name}: must be a finite number, got {v!r}")
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise ValueError(f"{name}: must be {'>' if lo_open else '>='} {lo}, got {v}")
        if hi is not None and (v > hi or (hi_open and v == hi)):
            raise ValueError(f"{name}: must be {'<' if hi_open else '<='} {hi}, got {v}")
    return check


_positive, _non_negative, _finite = _number(lo=0, lo_open=True), _number(lo=0), _number()
_unit = _number(lo=0, hi=1)


def _one_of(*choices) -> Callable[[str, Any], None]:
    def check(name: str, v) -> None:
        if v not in choices:
            raise ValueError(f"{name}: must be one of {choices}, got {v!r}")
    return check


def _device(name: str, v) -> None:
    if v not in ("cpu", "cuda", "auto") and not str(v).startswith("cuda:"):
        raise ValueError(f"{name}: must be 'cpu', 'cuda' or 'auto', got {v!r}")


def _env(name: str, v) -> None:
    if v not in _envs.ENVS:
        raise ValueError(f"{name}: must be one of {sorted(_envs.ENVS)}, got {v!r}")


def _controller(feeds: str) -> Callable[[str, Any], None]:
    def check(name: str, v) -> None:
        if v is not None and (not hasattr(v, "value") or not callable(getattr(v, "update", None))):
            raise ValueError(f"{name}: needs a .value attribute and an .update({feeds}, n_steps) method, "
                             f"got {type(v).__name__}")
    return check


def _callable_or_none(name: str, v) -> None:
    if v is not None and not callable(v):
        raise ValueError(f"{name}: must be callable or None, got {type(v).__name__}")


def _dict_or_none(name: str, v) -> None:
    if v is not None and not isinstance(v, dict):
        raise ValueError(f"{name}: must be a dict or None, got {type(v).__name__}")


def _agent_or_none(name: str, v) -> None:
    if v is not None and not isinstance(v, Agent):
        raise ValueError(f"{name}: must be an Agent or None, got {type(v).__name__}")


def _hidden_sizes(name: str, v) -> None:
    if not v or any(not isinstance(h, int) or h < 1 for h in v):
        raise ValueError(f"{name}: must be a non-empty tuple of positive integers, got {v!r}")


def hp(default, check: Callable[[str, Any], None] | None = None, doc: str = ""):
    """One hyperparameter of :class:`PPOConfig`: its default, the check of its value, its meaning."""
    return field(default=default, metadata={"check": check, "doc": doc})


@dataclass
class PPOConfig:
    """Every hyperparameter of :func:`train`. The defaults are the fast CartPole preset.

    Invalid values raise ``ValueError`` naming the field. ``PPOConfig.describe()`` lists every
    field with its meaning; :meth:`hyperparameters` gives the values (``train`` keeps them in
    ``PPOResult.hyperparameters``).
    """

    # --- the run ---------------------------------------------------------------------------
    env: str = hp("CartPole", _env, 'Environment: "CartPole" (categorical policy), "DeceptiveChain", '
                  '"Pendulum" or "PendulumArray" (Gaussian policy, 1 or 3 action dimensions).')
    seed: int = hp(0, _seed, "Seeds the network initialisation, action sampling and the environments.")
    total_timesteps: int = hp(100_000, _positive_int, "Environment steps of the run (an upper bound "
                              "when stop_at_return is set).")
    stop_at_return: float | None = hp(475.0, _number(allow_none=True), "Stop once the mean return of "
                                      "the last solve_window episodes reaches this (CartPole-v1's "
                                      "'solved' is 475); None runs all total_timesteps.")
    num_envs: int = hp(32, _positive_int, "Environment copies stepped in parallel.")
    num_steps: int = hp(8, _positive_int, "Steps per copy per rollout (batch = num_envs * num_steps).")
    # --- optimisation ----------------------------------------------------------------------
    learning_rate: float = hp(8e-3, _positive, "Adam step size (actor and critic).")
    anneal_lr: bool = hp(True, None, "Decay the learning rate linearly to 0 over total_timesteps.")
    update_epochs: int = hp(3, _positive_int, "Passes over each batch.")
    num_minibatches: int = hp(1, _positive_int, "Minibatches per epoch (1: full-batch steps).")
    # --- the policy objective ----------------------------------------------------------------
    objective: str = hp("clip", _one_of(*OBJECTIVES), '"clip" (clipped surrogate), "kl_penalty" '
                        '(surrogate minus beta KL) or "clip+kl_penalty".')
    clip_coef: float = hp(0.3, _positive, "Clip range epsilon of the clipped surrogate.")
    anneal_clip: bool = hp(True, None, "Decay clip_coef linearly to 0 over total_timesteps.")
    kl_coef: float = hp(0.0, _non_negative, "Fixed beta, used when the objective has a KL penalty "
                        "and kl_controller is None.")
    kl_controller: Any = hp(None, _controller("kl"), "An object with .value (beta) and "
                            ".update(kl, n_steps) (klbook_lib.controllers), fed the exact mean "
                            "KL(pi_old || pi_theta) after each update with n_steps = batch size; "
                            "deep-copied by train.")
    kl_penalty_estimator: str = hp("exact", _one_of(*KL_PENALTY_ESTIMATORS), 'The KL term in the loss: '
                                   '"exact" (closed form per state) or "k1", "k2", "k3" on the '
                                   'sampled actions (a ~ pi_old).')
    target_kl: float | None = hp(None, _number(lo=0, lo_open=True, allow_none=True),
                                 "Early stopping: end the update's epochs once the mean k3 estimate of "
                                 "KL(pi_old || pi_theta) on the batch exceeds this (as CleanRL; "
                                 "Stable-Baselines3 uses 1.5 target_kl).")
    ent_coef: float = hp(0.0, _finite, "Weight of the entropy bonus.")
    policy_loss_fn: Any = hp(None, _callable_or_none,
                             "None (the built-in objective) or a function that replaces the policy "
                             "part of the loss, called on each minibatch as policy_loss_fn(new_params, "
                             "old_params, actions, advantages, beta, clip) with the distribution "
                             "parameters of pi_theta ((logits,) or (mean, std), with gradients) and "
                             "pi_old (detached), the (normalised) advantages, beta (0 without a "
                             "penalty) and the clip range; returns the scalar to minimise, logged as "
                             "policy_loss (the built-in penalty is then not computed: kl_penalty_value "
                             "and grad_ratio are 0). Exercise 3 plugs its loss in here.")
    # --- KL as a tool: changed tasks, exploration, forgetting (chapter 13) -------------------
    env_kwargs: dict | None = hp(None, _dict_or_none, "Keyword arguments of the environment "
                                 "(envs.make_env), e.g. {'length': 0.25}: a shorter pole.")
    ent_controller: Any = hp(None, _controller("kl_uniform"), "None or a controller (e.g. "
                             "controllers.EntropyBandController) whose .value replaces ent_coef in "
                             "each update; fed the batch mean of KL(pi_theta || uniform) = "
                             "log|A| - H. Categorical policies only; deep-copied by train.")
    init_agent: Any = hp(None, _agent_or_none, "None or an Agent whose weights the run "
                         "starts from (fine-tuning); it is not changed.")
    anchor_agent: Any = hp(None, _agent_or_none, "None or an Agent pi_A to stay close to: "
                           "the loss gets anchor_coef * mean_s KL(pi_A || pi_theta) over anchor_obs; "
                           "the history's anchor_kl records that KL (also at anchor_coef = 0).")
    anchor_obs: Any = hp(None, None, "A tensor (M, obs_dim) of states for the anchor penalty.")
    anchor_coef: float = hp(0.0, _non_negative, "Weight of the anchor penalty (0: none).")
    # --- rarely changed ----------------------------------------------------------------------
    device: str = hp("cpu", _device, '"cpu", "cuda" or "auto"; at 32 envs the CPU is the faster one.')
    solve_window: int = hp(20, _positive_int, "Finished episodes in the rolling mean return.")
    max_grad_norm: float | None = hp(0.5, _number(lo=0, lo_open=True, allow_none=True),
                                     "Clip the global gradient norm to this; None: no clipping.")
    adam_eps: float = hp(1e-5, _positive, "Adam's epsilon.")
    fused_adam: bool = hp(True, None, "torch.optim.Adam(fused=True), one kernel for the whole update "
                          "(about half the time of the default foreach Adam for nets this small); "
                          "False: the default, equal up to rounding.")
    gamma: float = hp(0.99, _unit, "Discount factor.")
    gae_lambda: float = hp(0.9, _unit, "GAE lambda (Schulman et al. 2016).")
    norm_adv: bool = hp(True, None, "Normalise advantages per minibatch (zero mean, unit std).")
    reward_scale: float = hp(1.0, _positive, "Rewards are multiplied by this for the returns "
                             "(the history reports raw returns).")
    vf_coef: float = hp(0.5, _non_negative, "Weight of the value loss.")
    logratio_clamp: float = hp(20.0, _positive, "Clamp log r to [-c, c] before exp (finite ratios).")
    hidden_sizes: tuple[int, ...] = hp((64, 64), _hidden_sizes, "Hidden layers of the actor and of "
                                       "the (separate) critic; tanh activations.")
    log_std_init: float = hp(0.0, _finite, "Initial log std of the Gaussian policy (state-independent).")
    std_min: float = hp(0.01, _positive, "Floor on the Gaussian policy's standard deviation.")
    check_policy_version: bool = hp(True, None, "Raise StaleLogProbError at any optimizer step whose "
                                    "stored old log-probs were not made by the rollout's policy.")
    monitor_grad_ratio: bool = hp(True, None, "Log ||grad KL penalty|| / ||grad surrogate|| on the "
                                  "last minibatch of each update (objectives with a penalty; else 0).")
    kl_ema_decay: float = hp(0.9, _number(lo=0, hi=1, hi_open=True), "Decay of the moving average "
                             "kl_ema of the mean exact KL (averages about 1 / (1 - decay) updates).")
    # --- deliberate bugs for the bug-zoo chapter (all off by default) -------------------------
    bug_recompute_old_logprobs: bool = hp(False, None, "BUG: recompute log pi_old with the current "
                                          "policy in the update loop (ratio 1, clipping never acts; "
                                          "raises with check_policy_version).")
    bug_flip_logratio: bool = hp(False, None, "BUG: use log pi_old - log pi_theta as the log-ratio.")
    bug_no_logratio_clamp: bool = hp(False, None, "BUG: exponentiate the log-ratio without the clamp.")
    bug_no_std_floor: bool = hp(False, None, "BUG: no floor on the Gaussian standard deviation.")
    kl_action_reduce: str = hp("sum", _one_of("sum", "mean"), 'Gaussian KL penalty over action '
                               'dimensions: "sum" (the KL of the joint policy) or "mean" (BUG: '
                               'divided by the action dimension); the monitor always sums.')

    # --- presets ---------------------------------------------------------------------------
    @classmethod
    def cartpole_fast(cls, **overrides) -> "PPOConfig":
        """The fast CartPole-v1 preset (the defaults): 32 envs x 8 steps, 3 full-batch epochs,
        lr 8e-3 and clip 0.3 decayed to 0 over 100k steps, gamma 0.99, lambda 0.9."""
        return cls(**overrides)

    #: The hyperparameters that :meth:`cartpole_bench` changes from the defaults.
    CARTPOLE_BENCH = dict(num_envs=16, num_steps=16, learning_rate=1e-2)

    @classmethod
    def cartpole_bench(cls, **overrides) -> "PPOConfig":
        """The CartPole-v1 preset of ``python -m klbook_lib.bench ppo``: the defaults except
        16 envs x 16 steps (the same 256-sample batch, longer stretches per env copy) and
        lr 1e-2. It reached the 475 rolling mean on every seed 0-15 within 100k steps (median
        about 37k steps, the defaults about 55k); the optimum is sharp, so check all seeds
        after any change."""
        return cls(**{**cls.CARTPOLE_BENCH, **overrides})

    @classmethod
    def pendulum(cls, **overrides) -> "PPOConfig":
        """A Gaussian-policy preset for Pendulum-v1: 32 envs x 32 steps, 10 epochs of 4
        minibatches, constant lr 3e-3 and clip 0.2, gamma 0.9, rewards scaled by 0.1.
        In 20k steps the deterministic return rises from about -1200 to about -500 to -600."""
        base = dict(env="Pendulum", num_envs=32, num_steps=32, total_timesteps=50_000,
                    stop_at_return=None, learning_rate=3e-3, anneal_lr=False, update_epochs=10,
                    num_minibatches=4, gamma=0.9, gae_lambda=0.95, clip_coef=0.2,
                    anneal_clip=False, reward_scale=0.1, log_std_init=-0.5, max_grad_norm=0.5)
        return cls(**{**base, **overrides})

    # --- what the run is -----------------------------------------------------------------
    @classmethod
    def describe(cls) -> dict[str, str]:
        """``{name: meaning}`` of every hyperparameter, in the order of the fields."""
        return {f.name: f.metadata["doc"] for f in fields(cls)}

    def hyperparameters(self) -> dict[str, Any]:
        """``{name: value}`` of every hyperparameter (objects such as controllers as their repr)."""
        plain = (bool, int, float, str, tuple, type(None))
        return {f.name: (v if isinstance(v, plain) else repr(v))
                for f in fields(self) for v in [getattr(self, f.name)]}

    # --- validation: each field's own check, then the checks that relate fields ---------------
    def __post_init__(self):
        self.hidden_sizes = tuple(self.hidden_sizes)
        for f in fields(self):
            if f.metadata["check"] is not None:
                f.metadata["check"](f.name, getattr(self, f.name))
        self._check_batch()
        self._check_penalty()
        self._check_anchor()

    def _check_batch(self) -> None:
        batch = self.num_envs * self.num_steps
        if batch % self.num_minibatches:
            raise ValueError(f"num_minibatches: must divide the batch size num_envs*num_steps={batch}, "
                             f"got {self.num_minibatches}")
        if self.total_timesteps < batch:
            raise ValueError(f"total_timesteps: must be at least one batch ({batch}), got {self.total_timesteps}")

    def _check_penalty(self) -> None:
        if "kl_penalty" in self.objective and self.kl_controller is None and self.kl_coef == 0:
            raise ValueError(f"kl_coef: objective {self.objective!r} needs kl_coef > 0 or a kl_controller")

    def _check_anchor(self) -> None:
        if (self.anchor_agent is None) != (self.anchor_obs is None):
            raise ValueError("anchor_obs: give anchor_agent and anchor_obs together (or neither)")
        if self.anchor_coef > 0 and self.anchor_agent is None:
            raise ValueError("anchor_coef: > 0 needs an anchor_agent and anchor_obs")


# =====================================================================================
# The agent: two separate tanh MLPs (actor and critic) plus, for Gaussian policies, a
# state-independent log standard deviation. ``version`` counts optimizer steps.
# =====================================================================================

def _mlp(sizes: list[int], out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        nn.init.orthogonal_(lin.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


class Agent(nn.Module):
    """Actor ``pi_theta(a|s)`` and critic ``V(s)`` as separate networks.

    ``dist_params(obs)`` returns ``(logits,)`` for a categorical policy and ``(mean, std)``
    for a diagonal Gaussian; :meth:`log_prob` and :meth:`entropy` take those parameters.
    """

    def __init__(self, obs_dim: int, n_actions: int | None = None, action_dim: int | None = None,
                 hidden_sizes: tuple[int, ...] = (64, 64), log_std_init: float = 0.0,
                 std_min: float | None = 0.01):
        super().__init__()
        if (n_actions is None) == (action_dim is None):
            raise ValueError("n_actions, action_dim: give exactly one (categorical or Gaussian policy)")
        self.discrete = n_actions is not None
        out = n_actions if self.discrete else action_dim
        self.actor = _mlp([obs_dim, *hidden_sizes, out], 0.01)
        self.critic = _mlp([obs_dim, *hidden_sizes, 1], 1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))
        self.log_std_min = None if std_min is None else math.log(std_min)
        self.version = 0

    @staticmethod
    def _forward(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        # The same computation as ``net(x)`` without nn.Module's per-call bookkeeping, which
        # costs more than the arithmetic for these tiny networks.
        layers = [m for m in net if isinstance(m, nn.Linear)]
        for i, lin in enumerate(layers):
            x = nn.functional.linear(x, lin.weight, lin.bias)
            if i < len(layers) - 1:
                x = torch.tanh(x)
        return x

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """``V(s)`` for a batch of observations."""
        return self._forward(self.critic, obs).squeeze(-1)

    def dist_params(self, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(logits,)`` or ``(mean, std)`` of ``pi_theta(.|s)`` for a batch of observations."""
        out = self._forward(self.actor, obs)
        if self.discrete:
            return (out,)
        log_std = self.log_std
        if self.log_std_min is not None:
            log_std = log_std.clamp(min=self.log_std_min)
        return out, log_std.exp().expand_as(out)

    def log_prob(self, params: tuple[torch.Tensor, ...], action: torch.Tensor) -> torch.Tensor:
        if self.discrete:
            logp = torch.log_softmax(params[0], -1)
            return logp.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        mean, std = params
        z = (action - mean) / std
        return (-0.5 * z * z - torch.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self, params: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self.discrete:
            logp = torch.log_softmax(params[0], -1)
            return -(logp.exp() * logp).sum(-1)
        _, std = params
        return (0.5 + 0.5 * math.log(2 * math.pi) + torch.log(std)).sum(-1)

    def sample(self, params: tuple[torch.Tensor, ...], generator: torch.Generator) -> torch.Tensor:
        """Draw actions. Categorical: Gumbel-max, ``argmax(logits + G)`` with ``G = -log(-log U)``."""
        if self.discrete:
            logits = params[0]
            # E ~ Exp(1) and G = -log E is Gumbel(0, 1): argmax(logits + G) ~ softmax(logits)
            e = torch.empty_like(logits).exponential_(generator=generator)
            return torch.argmax(logits - e.log(), -1)
        mean, std = params
        eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        return mean + std * eps

    def exact_kl(self, old: tuple[torch.Tensor, ...], new: tuple[torch.Tensor, ...],
                 reduce: str = "sum") -> torch.Tensor:
        """Per-state ``KL(pi_old(.|s) || pi_new(.|s))`` from the closed forms."""
        if self.discrete:
            return kl_from_log_probs(torch.log_softmax(old[0], -1), torch.log_softmax(new[0], -1))
        return gaussian_kl(old[0], old[1], new[0], new[1], reduce=reduce)


def check_logprobs_fresh(logprob_version: int, rollout_version: int) -> None:
    """Raise :class:`StaleLogProbError` unless the old log-probs come from the rollout policy."""
    if logprob_version != rollout_version:
        raise StaleLogProbError(
            f"old log-probs were computed by policy version {logprob_version}, but the batch was "
            f"collected by version {rollout_version}: the ratio pi_theta/pi_old is meaningless "
            "(were the old log-probs recomputed inside the update loop?)")


class _ConstantBeta:
    """A fixed beta with the controller interface (used when ``kl_controller`` is None)."""

    def __init__(self, beta: float):
        self.value = float(beta)

    def update(self, kl: float, n_steps: int = 1) -> float:
        return self.value


@dataclass
class PPOResult:
    """What :func:`train` returns."""

    history: dict[str, list]
    """One entry per update for each key of :data:`HISTORY_KEYS`."""
    agent: Agent
    """The trained actor-critic."""
    config: PPOConfig
    kl_controller: Any
    """The (copied) controller after training, or None for clip-only runs."""
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    """Every hyperparameter of the run (:meth:`PPOConfig.hyperparameters`)."""
    ent_controller: Any = None
    """The (copied) entropy-coefficient controller after training, or None."""
    episode_returns: list[float] = field(default_factory=list)
    """Return of every finished episode, in order of completion."""
    episode_lengths: list[int] = field(default_factory=list)
    """Length of every finished episode, in the same order."""
    episode_end_steps: list[int] = field(default_factory=list)
    """Global environment step (end of the rollout) at which each episode finished."""
    episode_start_updates: list[int] = field(default_factory=list)
    """For each finished episode (same order): the update (1-based, as ``history["update"]``)
    whose rollout took the episode's first action. With ``num_steps`` steps per copy per
    update, an episode of length ``L`` is played by the policies of about ``L / num_steps``
    consecutive updates; a return is therefore late news about the policy of its start."""
    episode_end_updates: list[int] = field(default_factory=list)
    """For each finished episode: the update whose rollout took its last action."""
    solved: bool = False
    """Whether the rolling mean return reached ``config.stop_at_return``."""
    solved_at_step: int | None = None
    """Environment steps when solved (None if not)."""
    solved_at_time: float | None = None
    """Wall-clock seconds since the start of :func:`train` when solved (None if not)."""
    wall_time: float = 0.0
    """Total wall-clock seconds of :func:`train`."""


# =====================================================================================
# Training
# =====================================================================================

def gae(rewards: torch.Tensor, values: torch.Tensor, next_value: torch.Tensor, done: torch.Tensor,
        gamma: float, lam: float) -> torch.Tensor:
    """GAE advantages (Schulman et al. 2016) of a rollout; time is the first dimension.

    ``delta_t = r_t + gamma V(s_{t+1}) (1 - done_t) - V(s_t)``,
    ``A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}``; ``rewards``, ``values`` and ``done``
    are ``(T, ...)``, ``next_value`` is ``V`` of the observation after the last step.
    """
    T = rewards.shape[0]
    nonterminal = (~done).float()
    next_values = torch.cat([values[1:], next_value[None]])
    deltas = rewards + gamma * next_values * nonterminal - values
    decay = (gamma * lam) * nonterminal
    adv_rows = [deltas[T - 1]]
    for t in range(T - 2, -1, -1):
        adv_rows.append(torch.addcmul(deltas[t], decay[t], adv_rows[-1]))
    return torch.stack(adv_rows[::-1])


def surrogate_loss(ratio: torch.Tensor, adv: torch.Tensor, clip: float, objective: str) -> torch.Tensor:
    """``-mean(min(r A, clip(r, 1-eps, 1+eps) A))`` (objectives with "clip") or ``-mean(r A)``,
    averaged over the last dimension (a minibatch, or each seed's minibatch)."""
    if "clip" in objective:
        return torch.max(-adv * ratio, -adv * ratio.clamp(1.0 - clip, 1.0 + clip)).mean(-1)
    return (-adv * ratio).mean(-1)


def _kl_penalty_term(agent: Agent, cfg: PPOConfig, old_params, new_params, logratio) -> torch.Tensor:
    """The mean KL term in the loss, estimating KL(pi_old || pi_theta) on the minibatch (the
    mean over the last dimension)."""
    est = cfg.kl_penalty_estimator
    if est == "exact":
        return agent.exact_kl(old_params, new_params, reduce=cfg.kl_action_reduce).mean(-1)
    if est == "k1":
        return _estimators.k1_from_log_ratio(logratio).mean(-1)
    if est == "k2":
        return _estimators.k2_from_log_ratio(logratio).mean(-1)
    return _estimators.k3_from_log_ratio(logratio).mean(-1)


def _custom_policy_loss(fn, new_params, old_params, actions, advantages, beta: float,
                        clip: float) -> torch.Tensor:
    """Call ``PPOConfig.policy_loss_fn`` and check it returned a finite scalar tensor."""
    out = fn(new_params, old_params, actions, advantages, float(beta), float(clip))
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        raise ValueError("policy_loss_fn: must return a scalar torch.Tensor, got "
                         f"{type(out).__name__}{tuple(out.shape) if isinstance(out, torch.Tensor) else ''}")
    if not out.requires_grad:
        raise ValueError("policy_loss_fn: the returned loss does not depend on the policy's parameters "
                         "(no gradient): was new_params detached?")
    if not bool(torch.isfinite(out.detach())):
        raise FloatingPointError(f"policy_loss_fn: returned {float(out.detach())}")
    return out.reshape(())


def train(config: PPOConfig | None = None, progress: bool = True,
          callback: Callable[[int, "Agent", dict], Any] | None = None) -> PPOResult:
    """Train PPO as configured; return the history, the trained agent and solve statistics.

    ``callback(update, agent, record)``, if given, is called after every update with the
    1-based update index, the agent as it is after that update (e.g. to evaluate the
    policy of every update with :func:`evaluate`) and that update's history record. Its
    return value is ignored; it must not change the agent.
    """
    if callback is not None and not callable(callback):
        raise ValueError(f"callback: must be callable or None, got {type(callback).__name__}")
    cfg = config if config is not None else PPOConfig()
    if not isinstance(cfg, PPOConfig):
        raise ValueError(f"config: expected a PPOConfig, got {type(cfg).__name__}")
    t_start = time.perf_counter()
    device = _envs.resolve_device(None if cfg.device == "auto" else cfg.device)
    torch.manual_seed(cfg.seed)
    sample_gen = torch.Generator(device=device)
    sample_gen.manual_seed(cfg.seed + 1_000_003)

    env = _envs.make_env(cfg.env, cfg.num_envs, device=device, seed=cfg.seed, **(cfg.env_kwargs or {}))
    agent = Agent(env.obs_dim, n_actions=env.n_actions if env.discrete else None,
                  action_dim=None if env.discrete else env.action_dim,
                  hidden_sizes=cfg.hidden_sizes, log_std_init=cfg.log_std_init,
                  std_min=None if cfg.bug_no_std_floor else cfg.std_min).to(device)
    if cfg.init_agent is not None:                   # fine-tuning: start from given weights
        shapes = {k: v.shape for k, v in agent.state_dict().items()}
        if {k: v.shape for k, v in cfg.init_agent.state_dict().items()} != shapes:
            raise ValueError("init_agent: its networks do not match this environment and hidden_sizes")
        agent.load_state_dict(cfg.init_agent.state_dict())
    anchor = None                                    # (states, pi_A's distribution parameters there)
    if cfg.anchor_agent is not None:
        a_obs = torch.as_tensor(cfg.anchor_obs, dtype=torch.float32, device=device)
        if a_obs.ndim != 2 or a_obs.shape[1] != env.obs_dim or a_obs.shape[0] == 0:
            raise ValueError(f"anchor_obs: expected a non-empty (M, {env.obs_dim}) tensor of states, "
                             f"got shape {tuple(a_obs.shape)}")
        if cfg.anchor_agent.discrete != agent.discrete:
            raise ValueError("anchor_agent: its action type does not match the environment's")
        with torch.no_grad():
            anchor = (a_obs, tuple(p.detach() for p in copy.deepcopy(cfg.anchor_agent).to(device).dist_params(a_obs)))
    ent_ctrl = copy.deepcopy(cfg.ent_controller) if cfg.ent_controller is not None else None
    if ent_ctrl is not None and not env.discrete:
        raise ValueError("ent_controller: KL to the uniform policy needs a categorical policy (discrete actions)")
    optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps,
                                 fused=True if cfg.fused_adam else None)
    all_params = list(agent.parameters())
    actor_params = [p for n, p in agent.named_parameters() if not n.startswith("critic.")]

    uses_penalty = "kl_penalty" in cfg.objective
    builtin_penalty = uses_penalty and cfg.policy_loss_fn is None   # a policy_loss_fn brings its own
    controller = copy.deepcopy(cfg.kl_controller) if cfg.kl_controller is not None else (
        _ConstantBeta(cfg.kl_coef) if uses_penalty else None)
    kl_monitor = _monitor.KLMonitor(cfg.kl_ema_decay)

    T, N = cfg.num_steps, cfg.num_envs
    batch_size = T * N
    minibatch_size = batch_size // cfg.num_minibatches
    num_updates = cfg.total_timesteps // batch_size
    act_shape = () if env.discrete else (env.action_dim,)

    history: dict[str, list] = {k: [] for k in HISTORY_KEYS}
    result = PPOResult(history=history, agent=agent, config=cfg, kl_controller=controller,
                       hyperparameters=cfg.hyperparameters())
    result.ent_controller = ent_ctrl
    recent = deque(maxlen=cfg.solve_window)
    obs = env.reset(seed=cfg.seed)
    global_step = 0
    ep_start = torch.ones(N, dtype=torch.long, device=device)  # update of each copy's current episode's first action

    bar = tqdm(range(1, num_updates + 1), disable=not progress, desc=f"PPO {cfg.env}", mininterval=1.0)
    for update in bar:
        frac = 1.0 - (update - 1.0) / num_updates
        lr = cfg.learning_rate * frac if cfg.anneal_lr else cfg.learning_rate
        clip = cfg.clip_coef * frac if cfg.anneal_clip else cfg.clip_coef
        for group in optimizer.param_groups:
            group["lr"] = lr

        # ---- 1. rollout: only the actor runs per step ------------------------------------------
        rollout_version = agent.version
        steps = []                                   # per step: obs, action, reward, term, trunc, info
        with torch.no_grad():
            for t in range(T):
                action = agent.sample(agent.dist_params(obs), sample_gen)
                next_obs, reward, term, trunc, info = env.step(action)
                steps.append((obs, action, reward, term, trunc, info["final_obs"],
                              info["episode_return"], info["episode_length"]))
                obs = next_obs
            obs_buf, act_buf, rew_buf, term_buf, trunc_buf, final_obs_buf, epret_buf, eplen_buf = (
                torch.stack(column) for column in zip(*steps))  # each (T, N, ...)
        global_step += batch_size
        if agent.version != rollout_version:
            raise StaleLogProbError("the policy changed during the rollout")

        # episode statistics (a few device syncs per update)
        done_buf = term_buf | trunc_buf
        start_rows = []                              # (T, N): start update of the episode running at step t
        for t in range(T):
            start_rows.append(ep_start)
            # an episode that ends at step t is followed by one whose first action is at step t + 1
            ep_start = torch.where(done_buf[t], update if t < T - 1 else update + 1, ep_start)
        result.episode_start_updates.extend(torch.stack(start_rows)[done_buf].tolist())
        finished = epret_buf[done_buf].tolist()  # time-major order = order of completion
        result.episode_end_updates.extend([update] * len(finished))
        result.episode_lengths.extend(eplen_buf[done_buf].tolist())
        for r in finished:
            recent.append(r)
        result.episode_returns.extend(finished)
        result.episode_end_steps.extend([global_step] * len(finished))
        ep_mean = sum(recent) / len(recent) if recent else float("nan")

        # ---- 2. old log-probs, values and advantages, batched ---------------------------------
        with torch.no_grad():
            b_obs = obs_buf.reshape(batch_size, env.obs_dim)
            b_actions = act_buf.reshape(batch_size, *act_shape)
            old_params = tuple(p.detach() for p in agent.dist_params(b_obs))
            b_logprobs = agent.log_prob(old_params, b_actions)
            logprob_version = agent.version          # the policy that produced b_logprobs
            values = agent.value(b_obs).reshape(T, N)
            next_value = agent.value(obs)
            rewards = rew_buf * cfg.reward_scale
            if trunc_buf.any():                      # bootstrap truncated episodes from V(final obs)
                final_v = agent.value(final_obs_buf.reshape(batch_size, env.obs_dim)).reshape(T, N)
                rewards = rewards + cfg.gamma * final_v * trunc_buf
            advantages = gae(rewards, values, next_value, done_buf, cfg.gamma, cfg.gae_lambda)
            returns = advantages + values
            b_adv = advantages.reshape(-1)
            b_returns = returns.reshape(-1)
            b_values = values.reshape(-1)

        # ---- 3. optimise the surrogate for a few epochs ------------------------------------------
        beta = float(controller.value) if controller is not None else 0.0
        ent_coef = float(ent_ctrl.value) if ent_ctrl is not None else cfg.ent_coef
        clipfracs: list[torch.Tensor] = []
        grad_ratio = 0.0
        pg_loss = v_loss = penalty = torch.zeros((), device=device)
        epochs_run = 0
        if cfg.norm_adv and cfg.num_minibatches == 1:  # full-batch steps: normalise once
            b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)
        for epoch in range(cfg.update_epochs):
            if cfg.num_minibatches == 1:
                minibatches = [None]                 # None: the whole batch
            else:
                minibatches = torch.randperm(batch_size, device=device).split(minibatch_size)
            for i, mb in enumerate(minibatches):
                take = (lambda x: x) if mb is None else (lambda x, mb=mb: x[mb])  # noqa: E731
                mb_obs = take(b_obs)
                mb_old = tuple(take(p) for p in old_params)
                new_params = agent.dist_params(mb_obs)
                newlogprob = agent.log_prob(new_params, take(b_actions))
                if cfg.bug_recompute_old_logprobs:   # BUG: "old" log-probs from the current policy
                    b_logprobs = b_logprobs.clone()
                    if mb is None:
                        b_logprobs = newlogprob.detach()
                    else:
                        b_logprobs[mb] = newlogprob.detach()
                    logprob_version = agent.version
                mb_logprobs = take(b_logprobs)
                if cfg.check_policy_version:
                    check_logprobs_fresh(logprob_version, rollout_version)
                    if epoch == 0 and i == 0:        # same policy as the rollout: ratio must be 1
                        gap = (newlogprob.detach() - mb_logprobs).abs().max().item()
                        if not gap <= 1e-3:
                            raise StaleLogProbError(
                                f"stored old log-probs differ from the rollout policy's by {gap:.3g}")
                logratio = newlogprob - mb_logprobs
                if cfg.bug_flip_logratio:            # BUG: log pi_old - log pi_theta
                    logratio = -logratio
                if not cfg.bug_no_logratio_clamp:
                    logratio = logratio.clamp(-cfg.logratio_clamp, cfg.logratio_clamp)
                ratio = logratio.exp()
                with torch.no_grad():
                    clipfracs.append(((ratio - 1.0).abs() > clip).float().mean())

                mb_adv = take(b_adv)
                if cfg.norm_adv and mb is not None:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                if cfg.policy_loss_fn is None:        # the built-in objective
                    pg_loss = surrogate_loss(ratio, mb_adv, clip, cfg.objective)
                    if uses_penalty:
                        penalty = _kl_penalty_term(agent, cfg, mb_old, new_params, logratio)
                v_loss = 0.5 * ((agent.value(mb_obs) - take(b_returns)) ** 2).mean()
                if cfg.policy_loss_fn is not None:    # a pluggable loss replaces the built-in one
                    pg_loss = _custom_policy_loss(cfg.policy_loss_fn, new_params, mb_old,
                                                  take(b_actions), mb_adv, beta, clip)
                loss = pg_loss + cfg.vf_coef * v_loss
                if ent_coef != 0.0:
                    loss = loss - ent_coef * agent.entropy(new_params).mean()
                if builtin_penalty:
                    loss = loss + beta * penalty
                    if cfg.monitor_grad_ratio and i == len(minibatches) - 1:
                        # measured on the last minibatch of each epoch; the last value is logged
                        grad_ratio = _monitor.grad_norm_ratio(beta * penalty, pg_loss, actor_params)
                if anchor is not None and cfg.anchor_coef > 0:   # stay close to pi_A on its states
                    loss = loss + cfg.anchor_coef * agent.exact_kl(anchor[1], agent.dist_params(anchor[0])).mean()

                optimizer.zero_grad()
                loss.backward()
                if cfg.max_grad_norm is not None:
                    nn.utils.clip_grad_norm_(all_params, cfg.max_grad_norm, foreach=True)
                optimizer.step()
                agent.version += 1
            epochs_run = epoch + 1
            if cfg.target_kl is not None and epoch < cfg.update_epochs - 1:
                # early stopping: k3 estimate of KL(pi_old || pi_theta) on the whole batch, now
                with torch.no_grad():
                    lr_now = agent.log_prob(agent.dist_params(b_obs), b_actions) - b_logprobs
                    if not cfg.bug_no_logratio_clamp:
                        lr_now = lr_now.clamp(-cfg.logratio_clamp, cfg.logratio_clamp)
                    k3_now = _estimators.k3_from_log_ratio(lr_now).mean().item()
                if k3_now > cfg.target_kl:
                    break

        # ---- 4. monitor: exact KL(pi_old || pi_new) and estimators on the whole batch ----------
        with torch.no_grad():
            new_full = agent.dist_params(b_obs)
            exact = agent.exact_kl(old_params, new_full, reduce="sum")
            full_logratio = agent.log_prob(new_full, b_actions) - agent.log_prob(old_params, b_actions)
            # (recomputed from old_params: b_logprobs may have been overwritten by a bug switch)
            stats = kl_monitor.record(exact, full_logratio)
            ent_states = agent.entropy(new_full)
            entropy = ent_states.mean().item()
            kl_uniform = (math.log(env.n_actions) - ent_states).mean().item() if env.discrete else 0.0
            anchor_kl = (agent.exact_kl(anchor[1], agent.dist_params(anchor[0])).mean().item()
                         if anchor is not None else 0.0)
            var_y = b_returns.var()
            explained_var = (1 - (b_returns - b_values).var() / var_y).item() if var_y > 0 else float("nan")
        if not math.isfinite(stats["kl_exact_mean"]):
            raise FloatingPointError(f"the KL after update {update} is {stats['kl_exact_mean']}: "
                                     "the policy diverged (check the objective and the bug switches)")
        if controller is not None:
            controller.update(stats["kl_exact_mean"], batch_size)
        if ent_ctrl is not None:
            ent_ctrl.update(kl_uniform, batch_size)

        rec = {
            "update": update, "global_step": global_step,
            "wall_time": time.perf_counter() - t_start, "policy_version": agent.version,
            "learning_rate": lr, "clip_coef": clip, "beta": beta, **stats,
            "kl_penalty_value": float(penalty.detach()) if builtin_penalty else 0.0,
            "clip_frac": torch.stack(clipfracs).mean().item(), "entropy": entropy,
            "grad_ratio": grad_ratio, "policy_loss": float(pg_loss.detach()),
            "value_loss": float(v_loss.detach()),
            "epochs_run": epochs_run, "explained_variance": explained_var,
            "episodic_return": ep_mean, "episodes_finished": len(result.episode_returns),
            "ent_coef": ent_coef, "kl_uniform_mean": kl_uniform, "anchor_kl": anchor_kl,
        }
        for k in HISTORY_KEYS:
            history[k].append(rec[k])
        if callback is not None:
            callback(update, agent, rec)
        if progress and update % 10 == 0:
            bar.set_postfix(ret=f"{ep_mean:.1f}", kl=f"{stats['kl_exact_mean']:.4f}", refresh=False)

        if (cfg.stop_at_return is not None and len(recent) == cfg.solve_window
                and ep_mean >= cfg.stop_at_return):
            result.solved = True
            result.solved_at_step = global_step
            result.solved_at_time = time.perf_counter() - t_start
            break
    bar.close()
    result.wall_time = time.perf_counter() - t_start
    return result


# =====================================================================================
# Many seeds as one computation: train_seeds
# =====================================================================================
# K seeds train together: each weight of the K actors (and critics) is one tensor (K, out, in),
# the K seeds' environments are one envs.SeedBatch of K * num_envs copies, and each layer is
# one batched matrix product (torch.baddbmm) for all seeds. Every seed still draws its random
# numbers from its own generators exactly as train() draws them (initial weights, actions,
# initial states, minibatch permutations), so on the CPU seed s of a batched run is the run
# train(seed=s): the same actions and the same statistics (bit for bit on this machine's
# kernels; a test checks it to a float tolerance). A seed that reaches stop_at_return is
# taken out of the batch; the others go on.

class AgentEnsemble:
    """K categorical :class:`Agent` s with their weights stacked along a first dimension.

    ``params`` follow ``Agent.named_parameters()``'s order, each of shape ``(K, ...)``.
    :meth:`logits` and :meth:`value` take observations ``(K, B, obs_dim)``.
    """

    def __init__(self, agents: list[Agent]):
        if not agents or any(not a.discrete for a in agents):
            raise ValueError("agents: need one or more categorical-policy Agents")
        self.proto = agents[0]                   # log_prob, entropy, exact_kl work on any batch shape
        self.names = [n for n, _ in agents[0].named_parameters()]
        self.params = [torch.stack([dict(a.named_parameters())[n].detach() for a in agents]).requires_grad_()
                       for n in self.names]
        self.version = [a.version for a in agents]

    def _layers(self, net: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        p = [t for n, t in zip(self.names, self.params) if n.startswith(net + ".")]
        return list(zip(p[0::2], p[1::2]))           # (weight, bias) per Linear layer

    def _forward(self, net: str, x: torch.Tensor, members: list[int] | None = None) -> torch.Tensor:
        layers = self._layers(net)
        if members is not None:                  # only these members (x has their rows only)
            layers = [(w[members], b[members]) for w, b in layers]
        for i, (w, b) in enumerate(layers):
            # Three layouts of one product x W^T + b, chosen so that the kernels compute what
            # F.linear and its backward compute for one seed, bit for bit (measured on the CPU)
            if w.shape[1] == 1:                  # the value head: one F.linear per seed
                x = torch.stack([nn.functional.linear(*xwb) for xwb in zip(x.unbind(0), w.unbind(0), b.unbind(0))])
            elif i == 0:                         # the input layer as (W x^T)^T
                x = torch.baddbmm(b[:, :, None], w, x.transpose(1, 2)).transpose(1, 2)
            else:
                x = torch.baddbmm(b[:, None, :], x, w.transpose(1, 2))
            if i < len(layers) - 1:
                x = torch.tanh(x)
        return x

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """``(K, B, n_actions)`` logits of ``pi_theta(.|s)``."""
        return self._forward("actor", obs)

    def value(self, obs: torch.Tensor, members: list[int] | None = None) -> torch.Tensor:
        """``(K, B)`` values ``V(s)`` (``members``: only those members, ``obs`` has their rows)."""
        return self._forward("critic", obs, members).squeeze(-1)

    def agent(self, k: int) -> Agent:
        """Member ``k`` as a plain :class:`Agent` (a copy of its weights)."""
        a = copy.deepcopy(self.proto)
        with torch.no_grad():
            for (_, p), q in zip(a.named_parameters(), self.params):
                p.copy_(q[k])
        a.version = self.version[k]
        return a

    def keep(self, members: list[int]) -> list[torch.Tensor]:
        """Keep only ``members``; returns the new parameter tensors."""
        idx = torch.as_tensor(members, dtype=torch.long, device=self.params[0].device)
        self.params = [p.detach().index_select(0, idx).requires_grad_() for p in self.params]
        self.version = [self.version[k] for k in members]
        return self.params


#: Config fields :func:`train_seeds` does not batch (train those seeds one by one with :func:`train`).
NOT_BATCHED = ("policy_loss_fn", "bug_recompute_old_logprobs", "bug_flip_logratio", "bug_no_logratio_clamp",
               "bug_no_std_floor")

#: Config fields that may differ between the configs of one :func:`train_seeds` batch (besides ``seed``):
#: each seed may start from its own weights and keep to its own anchor (fine-tuning, chapter 13).
PER_SEED = ("init_agent", "anchor_agent", "anchor_obs")


def _batch_configs(config, seeds) -> list[PPOConfig]:
    """The configs of a :func:`train_seeds` batch: ``config`` once per seed, or a list of configs
    that agree on every field except ``seed`` and :data:`PER_SEED`."""
    if isinstance(config, (list, tuple)):
        if seeds is not None:
            raise ValueError("seeds: give the seeds in the configs (PPOConfig.seed) or as seeds=, not both")
        cfgs = list(config)
        if not cfgs or any(not isinstance(c, PPOConfig) for c in cfgs):
            raise ValueError("config: expected a PPOConfig or a non-empty list of PPOConfigs")
        for f in fields(PPOConfig):
            if f.name in ("seed", *PER_SEED):
                continue
            first = getattr(cfgs[0], f.name)
            for c in cfgs[1:]:
                v = getattr(c, f.name)
                if v is not first and v != first:
                    raise ValueError(f"config: {f.name} differs between the configs ({first!r} vs {v!r}); "
                                     f"only seed and {', '.join(PER_SEED)} may differ within one batch")
    else:
        cfg = config if config is not None else PPOConfig()
        if not isinstance(cfg, PPOConfig):
            raise ValueError(f"config: expected a PPOConfig, got {type(cfg).__name__}")
        cfgs = [replace(cfg, seed=s) for s in (range(10) if seeds is None else seeds)]   # checks every seed
    seeds = [c.seed for c in cfgs]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: need distinct seeds, got {seeds!r}")
    return cfgs


def _member_grad_norms(loss: torch.Tensor, params: list[torch.Tensor]) -> list[float]:
    """``||grad of loss[k]||`` over member ``k``'s slice of ``params``, for every member."""
    grads = torch.autograd.grad(loss.sum(), params, retain_graph=True, allow_unused=True)
    sq = [g.pow(2).flatten(1).sum(1) for g in grads if g is not None]
    return [math.sqrt(x) for x in torch.stack(sq, 1).sum(1).tolist()]


def _batch_anchor(cfgs: list[PPOConfig], env, device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Each member's anchor states and its ``pi_A``'s logits there, stacked: ``(K, M, obs_dim)``
    and ``(K, M, n_actions)``; None when no config has an anchor."""
    have = [c.anchor_agent is not None for c in cfgs]
    if not any(have):
        return None
    if not all(have):
        raise ValueError("anchor_agent: give every config of the batch an anchor, or none")
    states, logits = [], []
    for c in cfgs:
        a_obs = torch.as_tensor(c.anchor_obs, dtype=torch.float32, device=device)
        if a_obs.ndim != 2 or a_obs.shape[1] != env.obs_dim or a_obs.shape[0] == 0:
            raise ValueError(f"anchor_obs: expected a non-empty (M, {env.obs_dim}) tensor of states, "
                             f"got shape {tuple(a_obs.shape)}")
        if a_obs.shape[0] != (states[0].shape[0] if states else a_obs.shape[0]):
            raise ValueError(f"anchor_obs: train_seeds needs the same number of anchor states for every "
                             f"seed, got {states[0].shape[0]} and {a_obs.shape[0]}")
        if not c.anchor_agent.discrete:
            raise ValueError("anchor_agent: its action type does not match the environment's")
        with torch.no_grad():
            logits.append(copy.deepcopy(c.anchor_agent).to(device).dist_params(a_obs)[0].detach())
        states.append(a_obs)
    return torch.stack(states), torch.stack(logits)


def train_seeds(config: PPOConfig | Sequence[PPOConfig] | None = None, seeds: Sequence[int] | None = None,
                progress: bool = True,
                callback: Callable[[int, int, "Agent", dict], Any] | None = None) -> list[PPOResult]:
    """Train ``config`` once per seed in ``seeds`` (default ``range(10)``), all seeds as one
    batched computation.

    Returns one :class:`PPOResult` per seed, in the order of ``seeds``, each as
    ``train(replace(config, seed=s))`` returns it (the same history keys, one entry per update
    of that seed; ``wall_time`` and ``solved_at_time`` are seconds since the start of the
    batched run). A seed stops at ``stop_at_return`` as alone; the others go on.
    ``config`` may instead be a list of configs (then without ``seeds``), one per member, that
    differ only in ``seed`` and the fields of :data:`PER_SEED`: member ``i`` is
    ``train(config[i])``, e.g. each seed's ``pi_A`` fine-tuned with its own anchor
    (``init_agent``, ``anchor_agent``, ``anchor_obs``; the anchors need the same number of states).
    ``callback(seed, update, agent, record)`` is called after each update of each seed with a
    copy of that seed's agent. Categorical policies only (CartPole, DeceptiveChain), and none
    of the fields in :data:`NOT_BATCHED`.
    """
    cfgs = _batch_configs(config, seeds)
    cfg, seeds = cfgs[0], [c.seed for c in cfgs]
    for name in NOT_BATCHED:
        if getattr(cfg, name) not in (None, False):
            raise ValueError(f"{name}: not supported by train_seeds; train these seeds one by one with train()")
    if callback is not None and not callable(callback):
        raise ValueError(f"callback: must be callable or None, got {type(callback).__name__}")
    t_start = time.perf_counter()
    device = _envs.resolve_device(None if cfg.device == "auto" else cfg.device)
    env = _envs.SeedBatch(cfg.env, cfg.num_envs, seeds, device=device, **(cfg.env_kwargs or {}))
    if not env.discrete:
        raise ValueError(f"env: train_seeds batches categorical policies only, got {cfg.env!r}")
    agents, sample_gens, perm_gens = [], [], []
    for s, c in zip(seeds, cfgs):                    # each seed's generators, drawn as train() draws them
        torch.manual_seed(s)
        agents.append(Agent(env.obs_dim, n_actions=env.n_actions, hidden_sizes=cfg.hidden_sizes,
                            log_std_init=cfg.log_std_init, std_min=cfg.std_min).to(device))
        if c.init_agent is not None:                 # fine-tuning: start from given weights
            if ({k: v.shape for k, v in c.init_agent.state_dict().items()}
                    != {k: v.shape for k, v in agents[-1].state_dict().items()}):
                raise ValueError("init_agent: its networks do not match this environment and hidden_sizes")
            agents[-1].load_state_dict(c.init_agent.state_dict())
        perm_gens.append(torch.Generator().manual_seed(0))
        perm_gens[-1].set_state(torch.get_rng_state())   # train()'s randperm uses the global generator
        sample_gens.append(torch.Generator(device=device).manual_seed(s + 1_000_003))
    ens = AgentEnsemble(agents)
    proto = ens.proto
    anchor = _batch_anchor(cfgs, env, device)       # None, or (states (K, M, obs_dim), pi_A's logits there)
    optimizer = _optim.EnsembleAdam(ens.params, lr=cfg.learning_rate, eps=cfg.adam_eps)
    actor_idx = [i for i, n in enumerate(ens.names) if not n.startswith("critic.")]

    uses_penalty = "kl_penalty" in cfg.objective
    controllers = [copy.deepcopy(cfg.kl_controller) if cfg.kl_controller is not None else
                   (_ConstantBeta(cfg.kl_coef) if uses_penalty else None) for _ in seeds]
    ent_ctrls = [copy.deepcopy(cfg.ent_controller) if cfg.ent_controller is not None else None for _ in seeds]
    monitors = [_monitor.KLMonitor(cfg.kl_ema_decay) for _ in seeds]
    T, N = cfg.num_steps, cfg.num_envs
    batch_size = T * N
    minibatch_size = batch_size // cfg.num_minibatches
    num_updates = cfg.total_timesteps // batch_size
    results = [PPOResult(history={k: [] for k in HISTORY_KEYS}, agent=None, config=c, kl_controller=ctrl,
                         ent_controller=ec, hyperparameters=c.hyperparameters())
               for c, ctrl, ec in zip(cfgs, controllers, ent_ctrls)]
    recents = [deque(maxlen=cfg.solve_window) for _ in seeds]
    live = list(range(len(seeds)))                   # result index of each member still training
    obs = env.obs
    ep_start = torch.ones(len(seeds), N, dtype=torch.long, device=device)
    global_step = 0

    bar = tqdm(range(1, num_updates + 1), disable=not progress, desc=f"PPO {cfg.env} x{len(seeds)} seeds",
               mininterval=1.0)
    for update in bar:
        K = len(live)
        frac = 1.0 - (update - 1.0) / num_updates
        optimizer.lr = cfg.learning_rate * frac if cfg.anneal_lr else cfg.learning_rate
        clip = cfg.clip_coef * frac if cfg.anneal_clip else cfg.clip_coef

        # ---- 1. rollout: each seed's Exp(1) draws for the Gumbel-max trick, then the steps -------
        with torch.no_grad():
            log_e = torch.stack([torch.empty(T, N, env.n_actions, device=device).exponential_(generator=sample_gens[i])
                                 for i in live], 1).log()                       # (T, K, N, A)
            steps = []
            for t in range(T):
                action = torch.argmax(ens.logits(obs) - log_e[t], -1)           # (K, N)
                next_obs, reward, term, trunc, info = env.step(action)
                steps.append((obs, action, reward, term, trunc, info["final_obs"],
                              info["episode_return"], info["episode_length"]))
                obs = next_obs
            obs_buf, act_buf, rew_buf, term_buf, trunc_buf, final_obs_buf, epret_buf, eplen_buf = (
                torch.stack(column) for column in zip(*steps))                  # each (T, K, N, ...)
        global_step += batch_size

        # episode statistics, per seed in train()'s order (time-major), with one device sync
        done_buf = term_buf | trunc_buf
        start_rows = []
        for t in range(T):
            start_rows.append(ep_start)
            ep_start = torch.where(done_buf[t], update if t < T - 1 else update + 1, ep_start)
        d = done_buf.transpose(0, 1)
        table = torch.stack([x.transpose(0, 1).double()[d] for x in (torch.stack(start_rows), epret_buf, eplen_buf)], 1)
        counts, rows = d.sum((1, 2)).tolist(), table.tolist()
        ep_mean = []
        for k, i in enumerate(live):
            res, mine = results[i], rows[sum(counts[:k]):sum(counts[:k + 1])]
            res.episode_start_updates.extend(int(r[0]) for r in mine)
            res.episode_returns.extend(r[1] for r in mine)
            res.episode_lengths.extend(int(r[2]) for r in mine)
            res.episode_end_updates.extend([update] * len(mine))
            res.episode_end_steps.extend([global_step] * len(mine))
            recents[i].extend(r[1] for r in mine)
            ep_mean.append(sum(recents[i]) / len(recents[i]) if recents[i] else float("nan"))

        # ---- 2. old log-probs, values and advantages, batched over seeds and the rollout ------------
        def per_seed(x):                             # (T, K, N, ...) -> (K, T * N, ...), train()'s order
            return x.transpose(0, 1).reshape(K, batch_size, *x.shape[3:])
        b_obs, b_actions = per_seed(obs_buf), per_seed(act_buf)
        # The first step of epoch 0 (with full-batch steps) evaluates the rollout's policy on the
        # whole batch, as this does: compute it once, with gradients, and reuse it there.
        with torch.set_grad_enabled(cfg.num_minibatches == 1):
            first = (ens.logits(b_obs), ens.value(b_obs))
        with torch.no_grad():
            old_logits = first[0].detach()
            b_logprobs = proto.log_prob((old_logits,), b_actions)
            values = first[1].detach().reshape(K, T, N).transpose(0, 1)
            rewards = rew_buf * cfg.reward_scale
            cut = trunc_buf.any(2).any(0).nonzero().flatten().tolist()   # seeds with a truncated episode
            if cut:                                  # bootstrap truncated episodes from V(final obs)
                final_v = ens.value(per_seed(final_obs_buf)[cut], cut).reshape(len(cut), T, N).transpose(0, 1)
                rewards[:, cut] = rewards[:, cut] + cfg.gamma * final_v * trunc_buf[:, cut]
            advantages = gae(rewards, values, ens.value(obs), done_buf, cfg.gamma, cfg.gae_lambda)
            b_adv, b_returns = per_seed(advantages), per_seed(advantages + values)
            b_values = per_seed(values)

        # ---- 3. optimise, every seed on its own minibatches ----------------------------------------
        betas = [float(controllers[i].value) if controllers[i] is not None else 0.0 for i in live]
        ent_coefs = [float(ent_ctrls[i].value) if ent_ctrls[i] is not None else cfg.ent_coef for i in live]
        beta, ent_coef = (torch.tensor(x, device=device) for x in (betas, ent_coefs))
        use_ent = any(c != 0.0 for c in ent_coefs)
        stepping = [True] * K                        # False once target_kl stopped a seed's epochs
        n_steps, epochs_run, grad_ratio = [0] * K, [0] * K, [0.0] * K
        clipfracs, last = [], None                   # last: (pg, v, penalty) of each seed's last step
        rows_k = torch.arange(K, device=device)[:, None]
        if cfg.norm_adv and cfg.num_minibatches == 1:
            b_adv = (b_adv - b_adv.mean(-1, keepdim=True)) / (b_adv.std(-1, keepdim=True) + 1e-8)
        for epoch in range(cfg.update_epochs):
            if cfg.num_minibatches == 1:
                minibatches = [None]
            else:
                perms = torch.stack([torch.randperm(batch_size, generator=perm_gens[i]) if s  # as train()
                                     else torch.arange(batch_size) for i, s in zip(live, stepping)]).to(device)
                minibatches = perms.split(minibatch_size, 1)
            for j, mb in enumerate(minibatches):
                take = (lambda x: x) if mb is None else (lambda x, mb=mb: x[rows_k, mb])  # noqa: E731
                reuse = mb is None and epoch == 0
                new_logits = first[0] if reuse else ens.logits(take(b_obs))
                newlogprob = proto.log_prob((new_logits,), take(b_actions))
                mb_logprobs = take(b_logprobs)
                if cfg.check_policy_version and epoch == 0 and j == 0:
                    gap = (newlogprob.detach() - mb_logprobs).abs().max().item()
                    if not gap <= 1e-3:
                        raise StaleLogProbError(f"stored old log-probs differ from the rollout policy's by {gap:.3g}")
                logratio = (newlogprob - mb_logprobs).clamp(-cfg.logratio_clamp, cfg.logratio_clamp)
                ratio = logratio.exp()
                with torch.no_grad():
                    clipfracs.append(((ratio - 1.0).abs() > clip).float().mean(-1))
                mb_adv = take(b_adv)
                if cfg.norm_adv and mb is not None:
                    mb_adv = (mb_adv - mb_adv.mean(-1, keepdim=True)) / (mb_adv.std(-1, keepdim=True) + 1e-8)
                pg_loss = surrogate_loss(ratio, mb_adv, clip, cfg.objective)
                if uses_penalty:
                    penalty = _kl_penalty_term(proto, cfg, (take(old_logits),), (new_logits,), logratio)
                v_loss = 0.5 * (((first[1] if reuse else ens.value(take(b_obs))) - take(b_returns)) ** 2).mean(-1)
                loss = pg_loss + cfg.vf_coef * v_loss
                if use_ent:
                    loss = loss - ent_coef * proto.entropy((new_logits,)).mean(-1)
                if uses_penalty:
                    loss = loss + beta * penalty
                    if cfg.monitor_grad_ratio and j == len(minibatches) - 1:
                        actor = [ens.params[p] for p in actor_idx]
                        num, den = (_member_grad_norms(x, actor) for x in (beta * penalty, pg_loss))
                        for k in range(K):
                            if stepping[k]:
                                grad_ratio[k] = (num[k] / den[k] if den[k] else (0.0 if num[k] == 0 else math.inf))
                if anchor is not None and cfg.anchor_coef > 0:   # each seed stays close to its pi_A
                    loss = loss + cfg.anchor_coef * proto.exact_kl((anchor[1],), (ens.logits(anchor[0]),)).mean(-1)
                optimizer.zero_grad()
                loss.sum().backward()
                if cfg.max_grad_norm is not None:    # clip_grad_norm_ of each seed's own gradient
                    grads = [p.grad for p in ens.params]
                    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads], 1)
                    coef = (cfg.max_grad_norm / (torch.linalg.vector_norm(norms, dim=1) + 1e-6)).clamp(max=1.0)
                    for g in grads:
                        g.mul_(coef.reshape(K, *[1] * (g.ndim - 1)))
                members = [k for k in range(K) if stepping[k]]
                optimizer.step(None if len(members) == K else members)
                now = torch.stack([pg_loss.detach(), v_loss.detach(),
                                   penalty.detach() if uses_penalty else torch.zeros_like(v_loss)])
                mask = torch.tensor(stepping, device=device)
                last = now if last is None else torch.where(mask, now, last)
                for k in members:
                    ens.version[k] += 1
                    n_steps[k] += 1
            for k in members:
                epochs_run[k] = epoch + 1
            if cfg.target_kl is not None and epoch < cfg.update_epochs - 1:
                with torch.no_grad():
                    lr_now = (proto.log_prob((ens.logits(b_obs),), b_actions) - b_logprobs).clamp(
                        -cfg.logratio_clamp, cfg.logratio_clamp)
                    k3_now = _estimators.k3_from_log_ratio(lr_now).mean(-1).tolist()
                stepping = [s and not k3 > cfg.target_kl for s, k3 in zip(stepping, k3_now)]
                if not any(stepping):
                    break

        # ---- 4. monitor each seed on its whole batch ------------------------------------------------
        with torch.no_grad():
            new_full = ens.logits(b_obs)
            exact = proto.exact_kl((old_logits,), (new_full,))
            full_logratio = proto.log_prob((new_full,), b_actions) - b_logprobs
            ent_states = proto.entropy((new_full,))
            # per seed: var() of a whole row rounds as train() does, var(-1) of the stack not quite
            var_y = torch.stack([y.var() for y in b_returns])
            var_res = torch.stack([y.var() for y in b_returns - b_values])
            cf = torch.stack(clipfracs, 1)           # (K, steps): a stopped seed's steps are a prefix
            cf_mean = (cf.mean(-1) if min(n_steps) == len(clipfracs)
                       else torch.stack([cf[k, :n_steps[k]].mean() for k in range(K)]))
            anchor_kl = (proto.exact_kl((anchor[1],), (ens.logits(anchor[0]),)).mean(-1) if anchor is not None
                         else torch.zeros(K, device=device))
            per = torch.stack([ent_states.mean(-1), (math.log(env.n_actions) - ent_states).mean(-1),
                               1 - var_res / var_y, var_y, cf_mean, *last, anchor_kl]).tolist()
        finished = []
        for k, i in enumerate(live):
            entropy, kl_uniform, ev, vy, clip_frac, pg, vl, pen, a_kl = (col[k] for col in per)
            stats = monitors[i].record(exact[k], full_logratio[k])
            if not math.isfinite(stats["kl_exact_mean"]):
                raise FloatingPointError(f"seed {seeds[i]}: the KL after update {update} is "
                                         f"{stats['kl_exact_mean']}: the policy diverged")
            if controllers[i] is not None:
                controllers[i].update(stats["kl_exact_mean"], batch_size)
            if ent_ctrls[i] is not None:
                ent_ctrls[i].update(kl_uniform, batch_size)
            res = results[i]
            rec = {"update": update, "global_step": global_step, "wall_time": time.perf_counter() - t_start,
                   "policy_version": ens.version[k], "learning_rate": optimizer.lr, "clip_coef": clip,
                   "beta": betas[k], **stats,
                   "kl_penalty_value": pen if uses_penalty else 0.0, "clip_frac": clip_frac,
                   "entropy": entropy, "grad_ratio": grad_ratio[k], "policy_loss": pg, "value_loss": vl,
                   "epochs_run": epochs_run[k], "explained_variance": ev if vy > 0 else float("nan"),
                   "episodic_return": ep_mean[k], "episodes_finished": len(res.episode_returns),
                   "ent_coef": ent_coefs[k], "kl_uniform_mean": kl_uniform, "anchor_kl": a_kl}
            for key in HISTORY_KEYS:
                res.history[key].append(rec[key])
            if callback is not None:
                callback(seeds[i], update, ens.agent(k), rec)
            if (cfg.stop_at_return is not None and len(recents[i]) == cfg.solve_window
                    and ep_mean[k] >= cfg.stop_at_return):
                res.solved, res.solved_at_step = True, global_step
                res.solved_at_time = time.perf_counter() - t_start
                finished.append(k)
        for k in finished:
            results[live[k]].agent = ens.agent(k)
            results[live[k]].wall_time = time.perf_counter() - t_start
        if finished:                                 # take the solved seeds out of the batch
            keep = [k for k in range(K) if k not in finished]
            if not keep:
                break
            optimizer.keep(keep, ens.keep(keep))
            env.keep(keep)
            if anchor is not None:
                anchor = tuple(x[keep] for x in anchor)
            live = [live[k] for k in keep]
            obs, ep_start = obs[keep], ep_start[keep]
        if progress and update % 10 == 0:
            bar.set_postfix(seeds_left=len(live), refresh=False)
    bar.close()
    for k, i in enumerate(live):
        if results[i].agent is None:
            results[i].agent = ens.agent(k)
            results[i].wall_time = time.perf_counter() - t_start
    return results


def evaluate(agent: Agent, env: str = "CartPole", num_episodes: int = 16, seed: int = 12345,
             deterministic: bool = True, device: str = "cpu",
             env_kwargs: dict | None = None) -> list[float]:
    """Returns of ``num_episodes`` full episodes of ``agent`` (one per env copy, run in parallel).

    ``deterministic=True`` takes the most likely action (argmax / Gaussian mean); otherwise
    actions are sampled with a generator seeded by ``seed``. The same ``seed`` gives the same
    initial states, so two agents can be compared on identical starts. ``env_kwargs`` go to
    the environment's constructor (a changed task, as in ``PPOConfig.env_kwargs``).
    """
    if not isinstance(num_episodes, int) or num_episodes < 1:
        raise ValueError(f"num_episodes: must be a positive integer, got {num_episodes!r}")
    if env_kwargs is not None and not isinstance(env_kwargs, dict):
        raise ValueError(f"env_kwargs: must be a dict or None, got {type(env_kwargs).__name__}")
    e = _envs.make_env(env, num_episodes, device=device, seed=seed, **(env_kwargs or {}))
    if e.discrete != agent.discrete:
        raise ValueError(f"env: {env!r} does not match the agent's action type")
    gen = torch.Generator(device=e.device)
    gen.manual_seed(seed + 1)
    obs = e.reset(seed=seed)
    returns = torch.zeros(num_episodes, device=e.device)
    alive = torch.ones(num_episodes, dtype=torch.bool, device=e.device)
    with torch.inference_mode():
        for _ in range(e.max_episode_steps):
            params = agent.dist_params(obs)
            if deterministic:
                action = params[0].argmax(-1) if agent.discrete else params[0]
            else:
                action = agent.sample(params, gen)
            obs, reward, term, trunc, _ = e.step(action)
            returns += reward * alive
            alive &= ~(term | trunc)
            if not alive.any():
                break
    return returns.tolist()
