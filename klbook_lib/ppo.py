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
``PPOConfig.cartpole_bench()``.

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
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn
from tqdm import tqdm

from klbook_lib import envs as _envs
from klbook_lib import monitor as _monitor

__all__ = ["PPOConfig", "PPOResult", "Agent", "train", "evaluate", "check_logprobs_fresh", "StaleLogProbError", "HISTORY_KEYS",
           "OBJECTIVES", "KL_PENALTY_ESTIMATORS"]

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


@dataclass
class PPOConfig:
    """Every hyperparameter of :func:`train`. The defaults are the fast CartPole preset.

    Invalid values raise ``ValueError`` naming the field.
    """

    # --- environment and run -----------------------------------------------------------
    env: str = "CartPole"
    """Environment name: "CartPole" (categorical policy), "Pendulum" or "PendulumArray"
    (Gaussian policy with 1 or 3 action dimensions); see :mod:`klbook_lib.envs`."""
    num_envs: int = 32
    """Number of environment copies stepped in parallel."""
    num_steps: int = 8
    """Steps per copy per rollout; the batch has ``num_envs * num_steps`` transitions."""
    total_timesteps: int = 100_000
    """Environment steps of the whole run (an upper bound when ``stop_at_return`` is set)."""
    seed: int = 0
    """Seeds the network initialisation, action sampling and the environments."""
    device: str = "cpu"
    """"cpu", "cuda" or "auto" (CUDA if available). At 32 envs the CPU is the faster one."""
    stop_at_return: float | None = 475.0
    """Stop as soon as the mean return of the last ``solve_window`` finished episodes reaches
    this value (CartPole-v1's "solved" threshold is 475); ``None`` runs all ``total_timesteps``."""
    solve_window: int = 20
    """Number of finished episodes in the rolling mean return."""

    # --- optimisation ----------------------------------------------------------------------
    learning_rate: float = 8e-3
    """Adam step size (shared by actor and critic)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over ``total_timesteps``."""
    update_epochs: int = 3
    """Passes over each batch."""
    num_minibatches: int = 1
    """Minibatches per epoch (1 = full-batch steps)."""
    max_grad_norm: float | None = 0.5
    """Clip the global gradient norm to this value; ``None`` disables clipping."""
    adam_eps: float = 1e-5
    """Adam's epsilon."""
    fused_adam: bool = True
    """Use :class:`FusedAdam` (PyTorch's fused Adam kernel called directly, much less overhead
    for small nets); False uses ``torch.optim.Adam``."""

    # --- returns and advantages ------------------------------------------------------------
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.9
    """GAE lambda (Schulman et al. 2016)."""
    norm_adv: bool = True
    """Normalise advantages per minibatch to zero mean and unit standard deviation."""
    reward_scale: float = 1.0
    """Multiply rewards by this before computing returns (the history reports raw returns)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""

    # --- policy objective ----------------------------------------------------------------------
    objective: str = "clip"
    """"clip" (clipped surrogate), "kl_penalty" (surrogate minus beta * KL) or "clip+kl_penalty"."""
    clip_coef: float = 0.3
    """Clip range epsilon of the clipped surrogate."""
    anneal_clip: bool = True
    """Decay ``clip_coef`` linearly to 0 over ``total_timesteps``."""
    kl_coef: float = 0.0
    """Fixed beta, used when the objective has a KL penalty and ``kl_controller`` is None."""
    kl_controller: Any = None
    """An object with ``.value`` (beta) and ``.update(kl, n_steps)``, e.g. from
    :mod:`klbook_lib.controllers`; fed the exact mean KL(pi_old || pi_theta) after each
    update with ``n_steps`` = batch size. Deep-copied by :func:`train`."""
    kl_penalty_estimator: str = "exact"
    """The KL term in the loss: "exact" (closed form per state), or "k1", "k2", "k3" on the
    sampled actions (``a ~ pi_old``)."""
    target_kl: float | None = None
    """Early stopping: after each epoch, stop the update if the mean k3 estimate of
    KL(pi_old || pi_theta) over the batch exceeds this (CleanRL compares the same k3 with
    target_kl; Stable-Baselines3 with 1.5 * target_kl)."""
    logratio_clamp: float = 20.0
    """Clamp ``log r`` to ``[-c, c]`` before ``exp`` (keeps ratios finite)."""

    # --- networks -------------------------------------------------------------------------------
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layers of both the actor and the (separate) critic; tanh activations."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (state-independent parameter)."""
    std_min: float = 0.01
    """Floor on the Gaussian policy's standard deviation."""

    # --- checks and monitoring -----------------------------------------------------------------
    check_policy_version: bool = True
    """Raise :class:`StaleLogProbError` if the stored old log-probs were not produced by the
    policy version that collected the batch (checked at every optimizer step)."""
    monitor_grad_ratio: bool = True
    """Log ||grad of KL penalty|| / ||grad of surrogate|| on the last minibatch of each update
    (only when the objective has a KL penalty; 0 otherwise)."""
    kl_ema_decay: float = 0.9
    """Decay of the moving average ``kl_ema`` of the mean exact KL (weight ``1 - decay`` on the
    new value; it averages over about ``1 / (1 - decay)`` updates: 10 for the default 0.9)."""

    # --- deliberate bugs for the bug-zoo chapter (all off by default) ---------------------------
    bug_recompute_old_logprobs: bool = False
    """BUG: recompute ``log pi_old`` with the current policy inside the update loop, so the
    ratio is always 1 and clipping never acts (with ``check_policy_version`` it raises)."""
    bug_flip_logratio: bool = False
    """BUG: use ``log pi_old - log pi_theta`` as the log-ratio."""
    bug_no_logratio_clamp: bool = False
    """BUG: exponentiate the log-ratio without the clamp."""
    bug_no_std_floor: bool = False
    """BUG: no floor on the Gaussian standard deviation."""
    kl_action_reduce: str = "sum"
    """How the Gaussian KL penalty combines action dimensions: "sum" (correct: the KL of the
    joint policy) or "mean" (BUG: divides the penalty by the action dimension). The monitor
    always reports the correct (summed) KL."""

    # --- a pluggable policy loss (e.g. an exercise's own) ----------------------------------------
    policy_loss_fn: Any = None
    """``None`` (the built-in objective) or a function that replaces the policy part of the loss:
    ``policy_loss_fn(new_params, old_params, actions, advantages, beta, clip)`` is called on each
    minibatch with the distribution parameters of pi_theta (``(logits,)`` or ``(mean, std)``, with
    gradients) and of pi_old (detached), the actions, the (normalised) advantages, the current
    ``beta`` (0 without a penalty) and clip range, and returns the scalar to minimise; the value
    loss (and the entropy bonus) are added to it. It is logged as ``policy_loss``; ``grad_ratio``
    is then 0. Exercise 3 plugs its KL-penalty loss in here (:mod:`klbook_lib.tasks.cartpole_kl`)."""

    # --- KL as a tool: exploration, changed tasks, forgetting (chapter "KL as a tool") ------------
    env_kwargs: dict | None = None
    """Keyword arguments for the environment's constructor (:func:`klbook_lib.envs.make_env`),
    e.g. ``{"length": 0.25}`` for a CartPole with a shorter pole, ``{"length": 8}`` for the
    chain. ``None``: the defaults."""
    ent_controller: Any = None
    """``None`` or an object with ``.value`` and ``.update(kl_uniform, n_steps)`` (e.g.
    :class:`klbook_lib.controllers.EntropyBandController`) that sets the entropy coefficient:
    each update uses ``ent_controller.value`` in place of ``ent_coef``, and after the update
    the controller is fed the batch mean of ``KL(pi_theta(.|s) || uniform) = log|A| - H(pi_theta(.|s))``.
    Categorical policies only. Deep-copied by :func:`train`."""
    init_agent: Any = None
    """``None`` or an :class:`Agent` whose weights (actor and critic) the run starts from, e.g.
    a policy trained on another task (fine-tuning). The given agent is not changed."""
    anchor_agent: Any = None
    """``None`` or an :class:`Agent` ``pi_A`` to stay close to: the loss gets
    ``anchor_coef * mean_s KL(pi_A(.|s) || pi_theta(.|s))`` over the states ``anchor_obs`` (a
    penalty against forgetting, in the style of policy distillation). With an anchor the
    history's ``anchor_kl`` records that mean KL after every update (also at ``anchor_coef = 0``)."""
    anchor_obs: Any = None
    """A tensor ``(M, obs_dim)`` of states for the anchor penalty (e.g. states ``pi_A`` visits on its own task)."""
    anchor_coef: float = 0.0
    """Weight of the anchor penalty (0: none)."""

    # --- presets ----------------------------------------------------------------------------------
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
        lr 1e-2; still 3 full-batch epochs, lr and clip 0.3 decayed to 0 over
        ``total_timesteps`` (100k), gamma 0.99, lambda 0.9, 64x64 tanh nets. It reached the
        475 rolling mean on every seed 0-15 within 100k steps (median about 37k steps,
        the defaults about 55k); the optimum is sharp, so check all seeds after any change."""
        base = dict(cls.CARTPOLE_BENCH)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def pendulum(cls, **overrides) -> "PPOConfig":
        """A Gaussian-policy preset for Pendulum-v1: 32 envs x 32 steps, 10 epochs of 4
        minibatches, constant lr 3e-3 and clip 0.2, gamma 0.9, rewards scaled by 0.1.
        In 20k steps the deterministic return rises from about -1200 to about -500 to -600."""
        base = dict(env="Pendulum", num_envs=32, num_steps=32, total_timesteps=50_000,
                    stop_at_return=None, learning_rate=3e-3, anneal_lr=False, update_epochs=10,
                    num_minibatches=4, gamma=0.9, gae_lambda=0.95, clip_coef=0.2,
                    anneal_clip=False, reward_scale=0.1, log_std_init=-0.5, max_grad_norm=0.5)
        base.update(overrides)
        return cls(**base)

    # --- validation -------------------------------------------------------------------------------
    def __post_init__(self):
        def pos_int(name):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: must be a positive integer, got {v!r}")

        def number(name, lo=None, hi=None, lo_open=False, hi_open=False, allow_none=False):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name}: must be a finite number, got {v!r}")
            if lo is not None and (v < lo or (lo_open and v == lo)):
                raise ValueError(f"{name}: must be {'>' if lo_open else '>='} {lo}, got {v}")
            if hi is not None and (v > hi or (hi_open and v == hi)):
                raise ValueError(f"{name}: must be {'<' if hi_open else '<='} {hi}, got {v}")

        if self.env not in _envs.ENVS:
            raise ValueError(f"env: must be one of {sorted(_envs.ENVS)}, got {self.env!r}")
        for name in ("num_envs", "num_steps", "total_timesteps", "update_epochs",
                     "num_minibatches", "solve_window"):
            pos_int(name)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed: must be a non-negative integer, got {self.seed!r}")
        if self.device not in ("cpu", "cuda", "auto") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device: must be 'cpu', 'cuda' or 'auto', got {self.device!r}")
        batch = self.num_envs * self.num_steps
        if batch % self.num_minibatches:
            raise ValueError(f"num_minibatches: must divide the batch size num_envs*num_steps={batch}, "
                             f"got {self.num_minibatches}")
        if self.total_timesteps < batch:
            raise ValueError(f"total_timesteps: must be at least one batch ({batch}), got {self.total_timesteps}")
        number("stop_at_return", allow_none=True)
        number("learning_rate", lo=0, lo_open=True)
        number("max_grad_norm", lo=0, lo_open=True, allow_none=True)
        number("adam_eps", lo=0, lo_open=True)
        number("gamma", lo=0, hi=1)
        number("gae_lambda", lo=0, hi=1)
        number("reward_scale", lo=0, lo_open=True)
        number("vf_coef", lo=0)
        number("ent_coef")
        number("clip_coef", lo=0, lo_open=True)
        number("kl_coef", lo=0)
        number("target_kl", lo=0, lo_open=True, allow_none=True)
        number("logratio_clamp", lo=0, lo_open=True)
        number("std_min", lo=0, lo_open=True)
        number("log_std_init")
        number("kl_ema_decay", lo=0, hi=1, hi_open=True)
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective: must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.kl_penalty_estimator not in KL_PENALTY_ESTIMATORS:
            raise ValueError(f"kl_penalty_estimator: must be one of {KL_PENALTY_ESTIMATORS}, "
                             f"got {self.kl_penalty_estimator!r}")
        if self.kl_action_reduce not in ("sum", "mean"):
            raise ValueError(f"kl_action_reduce: must be 'sum' or 'mean', got {self.kl_action_reduce!r}")
        if self.kl_controller is not None:
            if not hasattr(self.kl_controller, "value") or not callable(getattr(self.kl_controller, "update", None)):
                raise ValueError("kl_controller: needs a .value attribute and an .update(kl, n_steps) method, "
                                 f"got {type(self.kl_controller).__name__}")
        if self.policy_loss_fn is not None and not callable(self.policy_loss_fn):
            raise ValueError(f"policy_loss_fn: must be callable or None, got {type(self.policy_loss_fn).__name__}")
        if self.env_kwargs is not None and not isinstance(self.env_kwargs, dict):
            raise ValueError(f"env_kwargs: must be a dict or None, got {type(self.env_kwargs).__name__}")
        if self.ent_controller is not None:
            if not hasattr(self.ent_controller, "value") or not callable(getattr(self.ent_controller, "update", None)):
                raise ValueError("ent_controller: needs a .value attribute and an .update(kl_uniform, n_steps) "
                                 f"method, got {type(self.ent_controller).__name__}")
        for name in ("init_agent", "anchor_agent"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), Agent):
                raise ValueError(f"{name}: must be an Agent or None, got {type(getattr(self, name)).__name__}")
        number("anchor_coef", lo=0)
        if (self.anchor_agent is None) != (self.anchor_obs is None):
            raise ValueError("anchor_obs: give anchor_agent and anchor_obs together (or neither)")
        if self.anchor_coef > 0 and self.anchor_agent is None:
            raise ValueError("anchor_coef: > 0 needs an anchor_agent and anchor_obs")
        if "kl_penalty" in self.objective and self.kl_controller is None and self.kl_coef == 0:
            raise ValueError(f"kl_coef: objective {self.objective!r} needs kl_coef > 0 or a kl_controller")
        hs = tuple(self.hidden_sizes)
        if not hs or any(not isinstance(h, int) or h < 1 for h in hs):
            raise ValueError(f"hidden_sizes: must be a non-empty tuple of positive integers, got {self.hidden_sizes!r}")
        self.hidden_sizes = hs


class FusedAdam:
    """Adam (Kingma and Ba 2015) through PyTorch's fused kernel, called directly.

    The update is the one of ``torch.optim.Adam(params, lr, eps=eps, fused=True)`` (a test
    checks they agree). ``torch.optim.Adam.step`` spends about as long on Python
    bookkeeping as on arithmetic for a model this small; here the state lists are built once.
    ``lr`` may be changed between steps.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("params: no parameter requires a gradient")
        self.lr, self.betas, self.eps = float(lr), betas, float(eps)
        self.exp_avgs = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p) for p in self.params]
        self.steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        idx = [i for i, p in enumerate(self.params) if p.grad is not None]
        if len(idx) < len(self.params):  # parameters without a gradient keep their state
            pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        else:
            pick = lambda xs: xs  # noqa: E731
        params, steps = pick(self.params), pick(self.steps)
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(params, [p.grad for p in params], pick(self.exp_avgs), pick(self.exp_avg_sqs),
                           [], steps, lr=self.lr, beta1=self.betas[0], beta2=self.betas[1],
                           weight_decay=0.0, eps=self.eps, amsgrad=False, maximize=False)


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
            return _monitor.categorical_kl(old[0], new[0])
        return _monitor.gaussian_kl(old[0], old[1], new[0], new[1], reduce=reduce)


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

def _kl_penalty_term(agent: Agent, cfg: PPOConfig, old_params, new_params, logratio) -> torch.Tensor:
    """The mean KL term in the loss, estimating KL(pi_old || pi_theta) on the minibatch."""
    est = cfg.kl_penalty_estimator
    if est == "exact":
        return agent.exact_kl(old_params, new_params, reduce=cfg.kl_action_reduce).mean()
    if est == "k1":
        return (-logratio).mean()
    if est == "k2":
        return (0.5 * logratio ** 2).mean()
    return (torch.expm1(logratio) - logratio).mean()  # k3


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
    device = _envs._resolve_device(None if cfg.device == "auto" else cfg.device)
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
    if cfg.fused_adam:
        optimizer = FusedAdam(agent.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps)
    else:
        optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps)
    all_params = list(agent.parameters())
    actor_params = [p for n, p in agent.named_parameters() if not n.startswith("critic.")]

    uses_penalty = "kl_penalty" in cfg.objective
    controller = copy.deepcopy(cfg.kl_controller) if cfg.kl_controller is not None else (
        _ConstantBeta(cfg.kl_coef) if uses_penalty else None)
    kl_monitor = _monitor.KLMonitor(cfg.kl_ema_decay)

    T, N = cfg.num_steps, cfg.num_envs
    batch_size = T * N
    minibatch_size = batch_size // cfg.num_minibatches
    num_updates = cfg.total_timesteps // batch_size
    act_shape = () if env.discrete else (env.action_dim,)

    history: dict[str, list] = {k: [] for k in HISTORY_KEYS}
    result = PPOResult(history=history, agent=agent, config=cfg, kl_controller=controller)
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
        if cfg.fused_adam:
            optimizer.lr = lr
        else:
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
            # GAE: delta_t = r_t + gamma V(s_{t+1}) (1 - done_t) - V(s_t);
            #      A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}
            nonterminal = (~done_buf).float()
            next_values = torch.cat([values[1:], next_value[None]])
            deltas = rewards + cfg.gamma * next_values * nonterminal - values
            decay = (cfg.gamma * cfg.gae_lambda) * nonterminal
            adv_rows = [deltas[T - 1]]
            for t in range(T - 2, -1, -1):
                adv_rows.append(torch.addcmul(deltas[t], decay[t], adv_rows[-1]))
            advantages = torch.stack(adv_rows[::-1])
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
                if "clip" in cfg.objective:
                    pg_loss = torch.max(-mb_adv * ratio,
                                        -mb_adv * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()
                else:
                    pg_loss = (-mb_adv * ratio).mean()
                if uses_penalty:
                    penalty = _kl_penalty_term(agent, cfg, mb_old, new_params, logratio)
                v_loss = 0.5 * ((agent.value(mb_obs) - take(b_returns)) ** 2).mean()
                loss = pg_loss + cfg.vf_coef * v_loss
                if ent_coef != 0.0:
                    loss = loss - ent_coef * agent.entropy(new_params).mean()
                if uses_penalty:
                    loss = loss + beta * penalty
                if cfg.policy_loss_fn is not None:    # a pluggable loss replaces the objective above
                    pg_loss = _custom_policy_loss(cfg.policy_loss_fn, new_params, mb_old,
                                                  take(b_actions), mb_adv, beta, clip)
                    loss = pg_loss + cfg.vf_coef * v_loss
                    if ent_coef != 0.0:
                        loss = loss - ent_coef * agent.entropy(new_params).mean()
                elif uses_penalty and cfg.monitor_grad_ratio and i == len(minibatches) - 1:
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
                    k3_now = (torch.expm1(lr_now) - lr_now).mean().item()
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
            "kl_penalty_value": float(penalty.detach()) if uses_penalty else 0.0,
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
