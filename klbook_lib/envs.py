"""Batched torch environments: N copies of CartPole-v1 or Pendulum-v1 stepped at once.

Also: CartPole with other physics (``CartPole(length=0.05)``, a changed task) and
:class:`DeceptiveChain`, a small deep-sea style task where exploration matters.

Both classes keep their physical state in a tensor ``env.state`` of shape ``(N, state_dim)``
on ``env.device``; the caller may read it and assign to it (tests set a state and compare
one step with a scalar reference written from the published equations).

The step API follows Gymnasium's vector environments with *same-step auto-reset*::

    obs, reward, terminated, truncated, info = env.step(action)

For every copy whose episode ended at this step (``terminated | truncated``) the returned
``obs`` is already the first observation of its next episode; the last observation of the
finished episode is in ``info["final_obs"]`` (needed to bootstrap the value of a truncated
episode), and ``info["episode_return"]`` / ``info["episode_length"]`` hold the return and
length of the episode that just finished (meaningful where ``done``). Only finished copies
are reset. Nothing in ``step`` synchronises with the device, so the same code runs on CUDA.

Randomness: each environment object owns one ``torch.Generator`` on its device, seeded by
``seed`` (or by ``reset(seed=...)``). Initial states are drawn from it, so a batch is
reproducible given ``(seed, num_envs)``. To make every copy independently reproducible,
pass a list of seeds to :meth:`reset`: copy ``i`` then draws its first state from its own
generator seeded with ``seed[i]`` (the same state a single-copy environment with that seed
draws first).

:class:`SeedBatch` steps K such environments (one per seed, each with its own generator) as
one batch of ``K * N`` copies: the batched trainer :func:`klbook_lib.ppo.train_seeds` uses it.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["CartPole", "Pendulum", "PendulumArray", "DeceptiveChain", "make_env", "angle_normalize",
           "resolve_device", "SeedBatch"]


def _check_num_envs(num_envs: int) -> int:
    if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
        raise ValueError(f"num_envs: must be a positive integer, got {num_envs!r}")
    return num_envs


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``torch.device`` of ``device``; ``None`` or ``"auto"``: CUDA if available, else the CPU.

    Raises ``ValueError`` when CUDA is asked for and not available.
    """
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but torch.cuda.is_available() is False")
    return device


class _BatchedEnv:
    """Shared bookkeeping: step counters, episode statistics, seeding, auto-reset."""

    state_dim: int
    obs_dim: int
    discrete: bool
    n_actions: int | None = None
    action_dim: int = 1
    action_low: float | None = None
    action_high: float | None = None

    def __init__(self, num_envs: int, device: str | torch.device | None, seed: int,
                 max_episode_steps: int, dtype: torch.dtype):
        self.num_envs = _check_num_envs(num_envs)
        if not isinstance(max_episode_steps, int) or max_episode_steps < 1:
            raise ValueError(f"max_episode_steps: must be a positive integer, got {max_episode_steps!r}")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype: must be torch.float32 or torch.float64, got {dtype}")
        self.device = resolve_device(device)
        self.dtype = dtype
        self.max_episode_steps = max_episode_steps
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))
        n = self.num_envs
        self.state = torch.zeros(n, self.state_dim, device=self.device, dtype=dtype)
        self.elapsed = torch.zeros(n, dtype=torch.long, device=self.device)
        self.episode_return = torch.zeros(n, device=self.device, dtype=dtype)
        self.reset()

    # --- to be provided by subclasses -------------------------------------------------
    def _sample_initial(self, n: int, generator: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def _obs(self, state: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _dynamics(self, state: torch.Tensor, action: torch.Tensor):
        """Return ``(next_state, reward, terminated)`` for a batch."""
        raise NotImplementedError

    # --- public API ---------------------------------------------------------------------
    def reset(self, seed: int | Sequence[int] | None = None) -> torch.Tensor:
        """Reset every copy; return the observations ``(N, obs_dim)``.

        ``seed`` may be an int (reseeds the batch generator) or a list of ``N`` ints
        (copy ``i`` draws its initial state from a generator seeded with ``seed[i]``).
        """
        n = self.num_envs
        if seed is None:
            init = self._sample_initial(n, self.generator)
        elif isinstance(seed, int):
            self.generator.manual_seed(seed)
            init = self._sample_initial(n, self.generator)
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"seed: a list of seeds must have num_envs={n} entries, got {len(seeds)}")
            rows = []
            for s in seeds:
                g = torch.Generator(device=self.device)
                g.manual_seed(int(s))
                rows.append(self._sample_initial(1, g))
            init = torch.cat(rows)
            # the batch generator continues from the first seed, so later resets are reproducible
            self.generator.manual_seed(int(seeds[0]))
        self.state = init
        self.elapsed.zero_()
        self.episode_return.zero_()
        return self._obs(self.state)

    @property
    def obs(self) -> torch.Tensor:
        """The current observations ``(N, obs_dim)``."""
        return self._obs(self.state)

    def step(self, action: torch.Tensor):
        """Advance every copy by one step; see the module docstring for the return values."""
        next_state, reward, terminated = self._dynamics(self.state, action)
        elapsed = self.elapsed + 1
        ep_return = self.episode_return + reward
        truncated = (elapsed >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        info = {"final_obs": self._obs(next_state), "episode_return": ep_return,
                "episode_length": elapsed}
        # Auto-reset only the finished copies. On the CPU, checking whether any copy finished
        # is free; on a GPU it would synchronise, so there we always draw fresh states.
        if self.device.type == "cpu" and not bool(done.any()):
            self.state, self.elapsed, self.episode_return = next_state, elapsed, ep_return
        else:
            fresh = self._sample_initial(self.num_envs, self.generator)
            self.state = torch.where(done[:, None], fresh, next_state)
            self.elapsed = elapsed.masked_fill(done, 0)
            self.episode_return = ep_return.masked_fill(done, 0.0)
        return self._obs(self.state), reward, terminated, truncated, info


class CartPole(_BatchedEnv):
    """N copies of CartPole-v1 (Barto, Sutton and Anderson 1983; Gymnasium's constants).

    State ``(x, x_dot, theta, theta_dot)``; the observation is the state. Actions are
    0 (push left) and 1 (push right) with force 10 N; explicit Euler with ``tau = 0.02`` s;
    the episode terminates when ``|x| > 2.4`` or ``|theta| > 12`` degrees and is truncated
    after ``max_episode_steps = 500`` steps. The reward is 1 per step, including the step
    that terminates. Initial state components are i.i.d. ``U(-0.05, 0.05)``.

    ``gravity``, ``length`` (half the pole's length), ``masspole``, ``masscart`` and
    ``force_mag`` replace CartPole-v1's constants for this instance (a changed task).
    """

    state_dim = 4
    obs_dim = 4
    discrete = True
    n_actions = 2

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masscart + masspole
    length = 0.5  # half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def __init__(self, num_envs: int = 1, device: str | torch.device | None = None, seed: int = 0,
                 max_episode_steps: int = 500, dtype: torch.dtype = torch.float32,
                 gravity: float | None = None, length: float | None = None,
                 masspole: float | None = None, masscart: float | None = None,
                 force_mag: float | None = None):
        # Optional physics changes (a changed task for transfer and forgetting experiments);
        # None keeps CartPole-v1's constant. ``length`` is half the pole's length, as above.
        for name, value in (("gravity", gravity), ("length", length), ("masspole", masspole),
                            ("masscart", masscart), ("force_mag", force_mag)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
            setattr(self, name, float(value))
        self.total_mass = self.masscart + self.masspole
        self.polemass_length = self.masspole * self.length
        dev = resolve_device(device)
        self._forces = torch.tensor([-self.force_mag, self.force_mag], device=dev, dtype=dtype)
        self._limits = torch.tensor([self.x_threshold, self.theta_threshold_radians], device=dev, dtype=dtype)
        super().__init__(num_envs, dev, seed, max_episode_steps, dtype)

    def _sample_initial(self, n, generator):
        u = torch.rand(n, 4, generator=generator, device=self.device, dtype=self.dtype)
        return u * 0.1 - 0.05

    def _obs(self, state):
        return state

    def _dynamics(self, state, action):
        if action.shape != (self.num_envs,):
            raise ValueError(f"action: expected shape ({self.num_envs},), got {tuple(action.shape)}")
        x_dot, theta, theta_dot = state[:, 1], state[:, 2], state[:, 3]
        force = self._forces[action]                          # -10 N for action 0, +10 N for 1
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        # temp = (force + m_p l theta_dot^2 sin(theta)) / (m_c + m_p)
        temp = torch.addcmul(force, theta_dot * theta_dot, sintheta, value=self.polemass_length)
        temp = temp / self.total_mass
        # theta_acc = (g sin(theta) - cos(theta) temp) / (l (4/3 - m_p cos^2(theta) / (m_c + m_p)))
        numerator = torch.addcmul(self.gravity * sintheta, costheta, temp, value=-1.0)
        denominator = self.length * (4.0 / 3.0 - self.masspole * costheta * costheta / self.total_mass)
        thetaacc = numerator / denominator
        # x_acc = temp - m_p l theta_acc cos(theta) / (m_c + m_p)
        xacc = torch.addcmul(temp, thetaacc, costheta, value=-self.polemass_length / self.total_mass)
        # explicit Euler: every component moves with the derivative at the start of the step
        next_state = torch.add(state, torch.stack([x_dot, xacc, theta_dot, thetaacc], 1), alpha=self.tau)
        out = next_state[:, 0::2].abs() > self._limits       # |x| > 2.4 or |theta| > 12 degrees
        terminated = out.any(1)
        reward = torch.ones_like(theta)
        return next_state, reward, terminated


def angle_normalize(x: torch.Tensor) -> torch.Tensor:
    """Wrap an angle to ``[-pi, pi)``."""
    return torch.remainder(x + math.pi, 2 * math.pi) - math.pi


class Pendulum(_BatchedEnv):
    """N copies of Pendulum-v1: swing a pendulum up and hold it (continuous torque).

    State ``(theta, theta_dot)`` with ``theta = 0`` upright; observation
    ``(cos theta, sin theta, theta_dot)``. Action: torque, clipped to ``[-2, 2]``.
    Reward ``-(angle_normalize(theta)^2 + 0.1 theta_dot^2 + 0.001 u^2)``; semi-implicit
    Euler with ``dt = 0.05``, ``g = 10``, ``m = l = 1``, speed clipped to ``[-8, 8]``.
    Never terminates; truncated after ``max_episode_steps = 200`` steps. Initial
    ``theta ~ U(-pi, pi)``, ``theta_dot ~ U(-1, 1)``.
    """

    state_dim = 2
    obs_dim = 3
    discrete = False
    action_dim = 1
    action_low = -2.0
    action_high = 2.0

    g = 10.0
    m = 1.0
    l = 1.0
    dt = 0.05
    max_speed = 8.0
    max_torque = 2.0

    def __init__(self, num_envs: int = 1, device: str | torch.device | None = None, seed: int = 0,
                 max_episode_steps: int = 200, dtype: torch.dtype = torch.float32):
        super().__init__(num_envs, device, seed, max_episode_steps, dtype)

    def _sample_initial(self, n, generator):
        u = torch.rand(n, 2, generator=generator, device=self.device, dtype=self.dtype)
        high = torch.tensor([math.pi, 1.0], device=self.device, dtype=self.dtype)
        return (2 * u - 1) * high

    def _obs(self, state):
        th, thdot = state.unbind(1)
        return torch.stack([torch.cos(th), torch.sin(th), thdot], 1)

    def _dynamics(self, state, action):
        if action.shape not in ((self.num_envs,), (self.num_envs, 1)):
            raise ValueError(f"action: expected shape ({self.num_envs}, 1), got {tuple(action.shape)}")
        u = action.reshape(self.num_envs).to(state.dtype).clamp(-self.max_torque, self.max_torque)
        th, thdot = state.unbind(1)
        costs = angle_normalize(th) ** 2 + 0.1 * thdot ** 2 + 0.001 * u ** 2
        newthdot = thdot + (3 * self.g / (2 * self.l) * torch.sin(th) + 3.0 / (self.m * self.l ** 2) * u) * self.dt
        newthdot = newthdot.clamp(-self.max_speed, self.max_speed)
        newth = th + newthdot * self.dt
        next_state = torch.stack([newth, newthdot], 1)
        terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        return next_state, -costs, terminated


class PendulumArray(Pendulum):
    """``k`` independent Pendulum-v1 systems per copy, driven by a ``k``-dimensional torque.

    State ``(theta_1, thdot_1, ..., theta_k, thdot_k)``, observation the ``k`` Pendulum
    observations side by side, reward the sum of the ``k`` Pendulum rewards. It exists to
    give a Gaussian policy several action dimensions (where summing or averaging a KL over
    action dimensions makes a difference); with ``k = 1`` it is :class:`Pendulum`.
    """

    def __init__(self, num_envs: int = 1, device: str | torch.device | None = None, seed: int = 0,
                 max_episode_steps: int = 200, dtype: torch.dtype = torch.float32, n_pendulums: int = 3):
        if not isinstance(n_pendulums, int) or n_pendulums < 1:
            raise ValueError(f"n_pendulums: must be a positive integer, got {n_pendulums!r}")
        self.k = n_pendulums
        self.state_dim = 2 * n_pendulums
        self.obs_dim = 3 * n_pendulums
        self.action_dim = n_pendulums
        super().__init__(num_envs, device, seed, max_episode_steps, dtype)

    def _sample_initial(self, n, generator):
        return super()._sample_initial(n * self.k, generator).reshape(n, self.state_dim)

    def _obs(self, state):
        return super()._obs(state.reshape(-1, 2)).reshape(state.shape[0], self.obs_dim)

    def _dynamics(self, state, action):
        if action.shape != (self.num_envs, self.k):
            raise ValueError(f"action: expected shape ({self.num_envs}, {self.k}), got {tuple(action.shape)}")
        n = self.num_envs
        self.num_envs = n * self.k               # reuse the single-pendulum equations row-wise
        try:
            nxt, reward, term = super()._dynamics(state.reshape(-1, 2), action.reshape(-1, 1))
        finally:
            self.num_envs = n
        return nxt.reshape(n, self.state_dim), reward.reshape(n, self.k).sum(1), term.reshape(n, self.k).any(1)


class DeceptiveChain(_BatchedEnv):
    """N copies of a deceptive chain: a small reward for quitting now, a large one at the far end.

    Positions ``0 .. length-1``; every episode starts at position 0. Two actions in every
    position: *quit* ends the episode with reward ``quit_reward``; *continue* moves one
    position on with reward ``-move_cost``, and from the last position it ends the episode
    with reward ``goal_reward`` instead. The observation is the one-hot position
    (``obs_dim = length``). Every episode ends after at most ``length`` steps (terminated;
    never truncated).

    The task is deceptive in the sense of the deep-sea environment of Osband et al. (2020):
    quitting at once is the best *myopic* choice in every position, while the optimal policy
    continues ``length`` times, which a uniformly random policy does with probability
    ``2 ** -length``. By default action 1 means continue everywhere; with ``action_seed`` the
    meaning of the two actions is swapped in a random half of the positions (drawn once from
    that seed, the same for all copies), so that "always press 1" is no longer a shortcut.
    """

    state_dim = 1
    discrete = True
    n_actions = 2

    def __init__(self, num_envs: int = 1, device: str | torch.device | None = None, seed: int = 0,
                 length: int = 10, quit_reward: float = 0.1, goal_reward: float = 1.0,
                 move_cost: float = 0.0, action_seed: int | None = None,
                 dtype: torch.dtype = torch.float32):
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(f"length: must be a positive integer, got {length!r}")
        for name, value in (("quit_reward", quit_reward), ("goal_reward", goal_reward),
                            ("move_cost", move_cost)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name}: must be a finite number, got {value!r}")
        if action_seed is not None and (not isinstance(action_seed, int) or isinstance(action_seed, bool)):
            raise ValueError(f"action_seed: must be an integer or None, got {action_seed!r}")
        self.length = length
        self.obs_dim = length
        self.quit_reward, self.goal_reward, self.move_cost = float(quit_reward), float(goal_reward), float(move_cost)
        dev = resolve_device(device)
        if action_seed is None:
            cont = torch.ones(length, dtype=torch.long)
        else:
            g = torch.Generator().manual_seed(action_seed)
            cont = torch.randint(0, 2, (length,), generator=g)
        self.continue_action = cont.to(dev)
        """``continue_action[p]``: the action that continues from position ``p``."""
        self._eye = torch.eye(length, device=dev, dtype=dtype)
        self._rewards = torch.tensor([self.quit_reward, -self.move_cost, self.goal_reward],
                                     device=dev, dtype=dtype)           # quit, move on, goal
        super().__init__(num_envs, dev, seed, length, dtype)

    def _sample_initial(self, n, generator):
        return torch.zeros(n, 1, device=self.device, dtype=self.dtype)

    def _obs(self, state):
        return self._eye[state[:, 0].long()]

    def _dynamics(self, state, action):
        if action.shape != (self.num_envs,):
            raise ValueError(f"action: expected shape ({self.num_envs},), got {tuple(action.shape)}")
        pos = state[:, 0].long()
        cont = action.long() == self.continue_action[pos]
        goal = cont & (pos == self.length - 1)
        terminated = goal | ~cont
        reward = self._rewards[cont.long() + goal.long()]        # 0: quit, 1: move on, 2: goal
        next_pos = torch.where(terminated, pos, pos + 1)
        return next_pos[:, None].to(state.dtype), reward, terminated


ENVS = {"CartPole": CartPole, "Pendulum": Pendulum, "PendulumArray": PendulumArray,
        "DeceptiveChain": DeceptiveChain}


def make_env(name: str, num_envs: int, device: str | torch.device | None = "cpu", seed: int = 0,
             **kwargs) -> _BatchedEnv:
    """Build a batched environment by name: ``"CartPole"``, ``"Pendulum"``, ``"PendulumArray"``
    or ``"DeceptiveChain"``; ``kwargs`` go to its constructor (e.g. ``length=0.25`` for a
    CartPole with a shorter pole, ``length=8`` for the chain)."""
    if name not in ENVS:
        raise ValueError(f"name: unknown environment {name!r}; choose one of {sorted(ENVS)}")
    return ENVS[name](num_envs=num_envs, device=device, seed=seed, **kwargs)


class SeedBatch:
    """``K`` independent batched environments, one per seed, stepped as one batch of ``K * N`` copies.

    Member ``k`` is ``make_env(name, num_envs, seed=seeds[k], **kwargs)``: it keeps that
    environment's own generator, so its copies start from, and reset to, exactly the states
    that environment alone draws (it draws fresh states only at the steps where one of its own
    copies finished, as :meth:`step` of one environment does). One call of the dynamics
    advances every copy of every member; the arithmetic is elementwise, so member ``k``'s
    trajectory is the single environment's, bit for bit, for the same actions.

    Shapes carry the member first: observations ``(K, N, obs_dim)``, rewards and flags
    ``(K, N)``; ``step`` takes actions ``(K, N)`` (or ``(K, N, action_dim)``) and returns what
    :meth:`_BatchedEnv.step` returns, reshaped so. :meth:`keep` drops members (seeds that are done).
    """

    def __init__(self, name: str, num_envs: int, seeds: Sequence[int], device: str | torch.device | None = "cpu",
                 **kwargs):
        seeds = [int(s) for s in seeds]
        if not seeds:
            raise ValueError("seeds: need at least one seed")
        self.members = [make_env(name, num_envs, device=device, seed=s, **kwargs) for s in seeds]
        self.seeds = seeds
        self.num_envs = _check_num_envs(num_envs)
        self.batch = make_env(name, len(seeds) * num_envs, device=device, seed=0, **kwargs)  # the dynamics
        for attr in ("obs_dim", "discrete", "n_actions", "action_dim", "max_episode_steps", "device"):
            setattr(self, attr, getattr(self.batch, attr))
        self.reset()

    @property
    def num_members(self) -> int:
        return len(self.members)

    def reset(self) -> torch.Tensor:
        """Reset every member as ``env.reset(seed=its seed)`` does; return observations ``(K, N, obs_dim)``."""
        for m, s in zip(self.members, self.seeds):
            m.reset(seed=s)
        self.state = torch.cat([m.state for m in self.members])
        self.elapsed = torch.zeros(self.state.shape[0], dtype=torch.long, device=self.device)
        self.episode_return = torch.zeros(self.state.shape[0], device=self.device, dtype=self.batch.dtype)
        return self.obs

    @property
    def obs(self) -> torch.Tensor:
        return self.batch._obs(self.state).reshape(self.num_members, self.num_envs, -1)

    def step(self, action: torch.Tensor):
        """Advance every copy of every member by one step (see the module docstring)."""
        k, n = self.num_members, self.num_envs
        next_state, reward, terminated = self.batch._dynamics(self.state, action.reshape(k * n, *action.shape[2:]))
        elapsed = self.elapsed + 1
        ep_return = self.episode_return + reward
        truncated = (elapsed >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        info = {"final_obs": self.batch._obs(next_state).reshape(k, n, -1),
                "episode_return": ep_return.reshape(k, n), "episode_length": elapsed.reshape(k, n)}
        finished = done.reshape(k, n).any(1).tolist() if self.device.type == "cpu" else [True] * k
        if not any(finished):
            self.state, self.elapsed, self.episode_return = next_state, elapsed, ep_return
        else:                                   # each member draws from its own generator, as alone
            rows = [m._sample_initial(n, m.generator) if f else next_state[i * n:(i + 1) * n]
                    for i, (m, f) in enumerate(zip(self.members, finished))]
            self.state = torch.where(done[:, None], torch.cat(rows), next_state)
            self.elapsed = elapsed.masked_fill(done, 0)
            self.episode_return = ep_return.masked_fill(done, 0.0)
        shape = (k, n)
        return self.obs, reward.reshape(shape), terminated.reshape(shape), truncated.reshape(shape), info

    def keep(self, members: Sequence[int]) -> None:
        """Keep only the members at these indices (in this order)."""
        members = [int(i) for i in members]
        if not members:
            raise ValueError("members: keep at least one member")
        n = self.num_envs
        rows = torch.cat([torch.arange(i * n, (i + 1) * n, device=self.device) for i in members])
        self.state, self.elapsed = self.state[rows], self.elapsed[rows]
        self.episode_return = self.episode_return[rows]
        self.members = [self.members[i] for i in members]
        self.seeds = [self.seeds[i] for i in members]
        self.batch.num_envs = len(members) * n
