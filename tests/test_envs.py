"""Batched CartPole / Pendulum against scalar references written from the published equations.

The references below are plain Python floats, written from the CartPole-v1 equations
(Barto, Sutton and Anderson 1983, as in Gymnasium's cartpole.py: Euler integration) and
the Pendulum-v1 equations (Gymnasium's pendulum.py), not from klbook_lib.envs.
"""
import math
import random

import pytest
import torch

from klbook_lib import envs

torch.set_num_threads(1)


def cartpole_ref(state, action):
    """One CartPole-v1 step: returns (next_state, reward, terminated)."""
    x, x_dot, th, th_dot = state
    g, mc, mp, half_len, f_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    f = f_mag if action == 1 else -f_mag
    c, s = math.cos(th), math.sin(th)
    tmp = (f + mp * half_len * th_dot * th_dot * s) / (mc + mp)
    th_acc = (g * s - c * tmp) / (half_len * (4.0 / 3.0 - mp * c * c / (mc + mp)))
    x_acc = tmp - mp * half_len * th_acc * c / (mc + mp)
    nxt = [x + tau * x_dot, x_dot + tau * x_acc, th + tau * th_dot, th_dot + tau * th_acc]
    limit = 12 * 2 * math.pi / 360
    term = abs(nxt[0]) > 2.4 or abs(nxt[2]) > limit
    return nxt, 1.0, term


def pendulum_ref(state, u):
    """One Pendulum-v1 step: returns (next_state, reward)."""
    th, th_dot = state
    u = min(max(u, -2.0), 2.0)
    norm = ((th + math.pi) % (2 * math.pi)) - math.pi
    cost = norm ** 2 + 0.1 * th_dot ** 2 + 0.001 * u ** 2
    new_dot = th_dot + (3 * 10.0 / 2 * math.sin(th) + 3.0 * u) * 0.05
    new_dot = min(max(new_dot, -8.0), 8.0)
    return [th + new_dot * 0.05, new_dot], -cost


def test_cartpole_step_matches_scalar_reference():
    rng = random.Random(0)
    n = 64
    env = envs.CartPole(n, device="cpu", seed=0, dtype=torch.float64)
    states = [[rng.uniform(-2.5, 2.5), rng.uniform(-3, 3), rng.uniform(-0.25, 0.25), rng.uniform(-3, 3)]
              for _ in range(n)]
    actions = [rng.randrange(2) for _ in range(n)]
    env.state = torch.tensor(states, dtype=torch.float64)
    _, reward, term, trunc, info = env.step(torch.tensor(actions))
    for i in range(n):
        nxt, r, t = cartpole_ref(states[i], actions[i])
        assert info["final_obs"][i].tolist() == pytest.approx(nxt, abs=1e-12)
        assert reward[i].item() == r
        assert bool(term[i]) == t
    assert not trunc.any()
    assert 0 < int(term.sum()) < n  # the random states cover both outcomes


def test_cartpole_float32_trajectory_tracks_reference():
    env = envs.CartPole(1, device="cpu", seed=3)
    s = env.state[0].tolist()
    ref = [float(v) for v in s]
    for step in range(20):
        a = step % 2
        _, _, term, _, info = env.step(torch.tensor([a]))
        ref, _, t = cartpole_ref(ref, a)
        assert info["final_obs"][0].tolist() == pytest.approx(ref, abs=1e-5)
        if t:
            break


def test_pendulum_step_matches_scalar_reference():
    rng = random.Random(1)
    n = 64
    env = envs.Pendulum(n, device="cpu", seed=0, dtype=torch.float64)
    states = [[rng.uniform(-7, 7), rng.uniform(-8, 8)] for _ in range(n)]
    torques = [rng.uniform(-3, 3) for _ in range(n)]  # some outside [-2, 2]: clipped
    env.state = torch.tensor(states, dtype=torch.float64)
    _, reward, term, trunc, info = env.step(torch.tensor(torques, dtype=torch.float64).unsqueeze(1))
    for i in range(n):
        nxt, r = pendulum_ref(states[i], torques[i])
        th, dot = nxt
        assert info["final_obs"][i].tolist() == pytest.approx([math.cos(th), math.sin(th), dot], abs=1e-12)
        assert env.state[i].tolist() == pytest.approx(nxt, abs=1e-12)
        assert reward[i].item() == pytest.approx(r, abs=1e-12)
    assert not term.any() and not trunc.any()


def test_pendulum_array_is_k_independent_pendulums():
    rng = random.Random(2)
    env = envs.PendulumArray(5, device="cpu", seed=0, dtype=torch.float64, n_pendulums=3)
    states = [[rng.uniform(-4, 4) if j % 2 == 0 else rng.uniform(-8, 8) for j in range(6)] for _ in range(5)]
    torques = [[rng.uniform(-3, 3) for _ in range(3)] for _ in range(5)]
    env.state = torch.tensor(states, dtype=torch.float64)
    _, reward, term, _, info = env.step(torch.tensor(torques, dtype=torch.float64))
    assert info["final_obs"].shape == (5, 9) and not term.any()
    for i in range(5):
        total = 0.0
        for j in range(3):
            nxt, r = pendulum_ref(states[i][2 * j:2 * j + 2], torques[i][j])
            total += r
            assert env.state[i, 2 * j:2 * j + 2].tolist() == pytest.approx(nxt, abs=1e-12)
            th, dot = nxt
            assert info["final_obs"][i, 3 * j:3 * j + 3].tolist() == pytest.approx(
                [math.cos(th), math.sin(th), dot], abs=1e-12)
        assert reward[i].item() == pytest.approx(total, abs=1e-12)
    with pytest.raises(ValueError, match="n_pendulums"):
        envs.PendulumArray(2, device="cpu", n_pendulums=0)


def test_initial_state_distributions():
    cp = envs.CartPole(4096, device="cpu", seed=0)
    s = cp.state
    assert s.abs().max() <= 0.05
    # U(-0.05, 0.05) has standard deviation 0.1/sqrt(12); mean within 5 standard errors of 0
    se = 0.1 / math.sqrt(12) / math.sqrt(s.numel())
    assert abs(s.mean().item()) < 5 * se
    pd = envs.Pendulum(4096, device="cpu", seed=0)
    assert pd.state[:, 0].abs().max() <= math.pi and pd.state[:, 1].abs().max() <= 1.0
    assert pd.state[:, 0].std().item() == pytest.approx(2 * math.pi / math.sqrt(12), rel=0.05)


def test_autoreset_only_finished_envs_and_episode_stats():
    env = envs.CartPole(3, device="cpu", seed=0, dtype=torch.float64)
    for _ in range(4):
        env.step(torch.ones(3, dtype=torch.long))
    before = env.state.clone()
    # env 1: about to leave the track to the right
    env.state[1] = torch.tensor([2.399, 1.0, 0.0, 0.0], dtype=torch.float64)
    before[1] = env.state[1]
    obs, reward, term, trunc, info = env.step(torch.ones(3, dtype=torch.long))
    assert term.tolist() == [False, True, False]
    expect1, _, _ = cartpole_ref(before[1].tolist(), 1)
    assert info["final_obs"][1].tolist() == pytest.approx(expect1, abs=1e-12)
    assert obs[1].abs().max() <= 0.05                      # fresh episode
    assert info["episode_return"][1].item() == 5.0       # 5 steps of reward 1
    assert info["episode_length"][1].item() == 5
    assert env.elapsed.tolist() == [5, 0, 5]
    for i in (0, 2):                                      # untouched copies continue
        expect, _, _ = cartpole_ref(before[i].tolist(), 1)
        assert obs[i].tolist() == pytest.approx(expect, abs=1e-12)


def test_truncation_at_max_episode_steps():
    env = envs.Pendulum(2, device="cpu", seed=0)
    for t in range(1, 201):
        _, _, term, trunc, info = env.step(torch.zeros(2, 1))
        assert not term.any()
        assert bool(trunc.all()) == (t == 200)
    assert info["episode_length"].tolist() == [200, 200]
    assert env.elapsed.tolist() == [0, 0]
    cp = envs.CartPole(2, device="cpu", seed=0)
    cp.elapsed[:] = 499
    cp.state[:] = 0.0                                     # upright: does not terminate this step
    _, _, term, trunc, _ = cp.step(torch.tensor([0, 1]))
    assert trunc.tolist() == [True, True] and not term.any()
    assert cp.max_episode_steps == 500


def test_seeding_determinism():
    def rollout(seed):
        env = envs.CartPole(8, device="cpu", seed=seed)
        out = [env.reset(seed=seed).clone()]
        gen = torch.Generator().manual_seed(0)
        for _ in range(300):                              # long enough for many auto-resets
            a = torch.randint(0, 2, (8,), generator=gen)
            out.append(env.step(a)[0].clone())
        return torch.stack(out)

    a, b, c = rollout(1), rollout(1), rollout(2)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_per_env_seeds_match_single_env():
    batch = envs.Pendulum(3, device="cpu", seed=0)
    obs = batch.reset(seed=[7, 8, 9])
    for i, s in enumerate([7, 8, 9]):
        single = envs.Pendulum(1, device="cpu", seed=s)
        assert torch.equal(single.obs[0], obs[i])


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_num_envs(bad):
    with pytest.raises(ValueError, match="num_envs"):
        envs.CartPole(bad, device="cpu")


def test_bad_arguments():
    env = envs.CartPole(4, device="cpu")
    with pytest.raises(ValueError, match="action"):
        env.step(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="seed"):
        env.reset(seed=[1, 2])
    with pytest.raises(ValueError, match="name"):
        envs.make_env("MountainCar", 2)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device"):
            envs.CartPole(2, device="cuda")


def test_against_gymnasium_if_installed():
    """Cross-check with Gymnasium itself when the optional benchmark extras are installed."""
    gym = pytest.importorskip("gymnasium")
    import numpy as np

    g = gym.make("CartPole-v1").unwrapped
    g.reset(seed=0)
    env = envs.CartPole(1, device="cpu", dtype=torch.float64)
    rng = random.Random(5)
    for _ in range(30):
        s = [rng.uniform(-2, 2), rng.uniform(-2, 2), rng.uniform(-0.2, 0.2), rng.uniform(-2, 2)]
        a = rng.randrange(2)
        g.state = np.array(s)
        gobs, grew, gterm, _, _ = g.step(a)
        env.state = torch.tensor([s], dtype=torch.float64)
        _, rew, term, _, info = env.step(torch.tensor([a]))
        assert info["final_obs"][0].tolist() == pytest.approx(gobs.tolist(), abs=1e-6)
        assert bool(term[0]) == gterm and rew.item() == grew
    p = gym.make("Pendulum-v1").unwrapped
    p.reset(seed=0)
    env = envs.Pendulum(1, device="cpu", dtype=torch.float64)
    for _ in range(30):
        s = [rng.uniform(-6, 6), rng.uniform(-8, 8)]
        u = rng.uniform(-2.5, 2.5)
        p.state = np.array(s)
        pobs, prew, _, _, _ = p.step(np.array([u]))
        env.state = torch.tensor([s], dtype=torch.float64)
        _, rew, _, _, info = env.step(torch.tensor([[u]], dtype=torch.float64))
        assert info["final_obs"][0].tolist() == pytest.approx(pobs.tolist(), abs=1e-5)
        assert rew.item() == pytest.approx(float(prew), abs=1e-6)


# ---------------------------------------------------------------- chapter 13: changed tasks and the chain

def cartpole_ref_physics(state, action, g, mc, mp, half_len, f_mag):
    """One CartPole step with other constants (the equations of cartpole_ref)."""
    x, x_dot, th, th_dot = state
    f = f_mag if action == 1 else -f_mag
    c, s = math.cos(th), math.sin(th)
    tmp = (f + mp * half_len * th_dot * th_dot * s) / (mc + mp)
    th_acc = (g * s - c * tmp) / (half_len * (4.0 / 3.0 - mp * c * c / (mc + mp)))
    x_acc = tmp - mp * half_len * th_acc * c / (mc + mp)
    return [x + 0.02 * x_dot, x_dot + 0.02 * x_acc, th + 0.02 * th_dot, th_dot + 0.02 * th_acc]


def test_cartpole_with_changed_physics_matches_the_equations():
    rng = random.Random(7)
    physics = dict(gravity=20.0, length=0.05, masspole=0.3, masscart=2.0, force_mag=4.0)
    env = envs.CartPole(16, device="cpu", dtype=torch.float64, **physics)
    states = [[rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(-0.1, 0.1), rng.uniform(-1, 1)]
              for _ in range(16)]
    actions = [rng.randrange(2) for _ in range(16)]
    env.state = torch.tensor(states, dtype=torch.float64)
    _, _, _, _, info = env.step(torch.tensor(actions))
    for i in range(16):
        ref = cartpole_ref_physics(states[i], actions[i], 20.0, 2.0, 0.3, 0.05, 4.0)
        assert info["final_obs"][i].tolist() == pytest.approx(ref, abs=1e-12)
    # the defaults are untouched, on the class and on other instances
    assert envs.CartPole.length == 0.5 and envs.CartPole(1).polemass_length == pytest.approx(0.05)
    with pytest.raises(ValueError, match="length"):
        envs.CartPole(2, length=0.0)
    with pytest.raises(ValueError, match="gravity"):
        envs.CartPole(2, gravity=float("nan"))
    e = envs.make_env("CartPole", 2, length=2.0)
    assert e.length == 2.0


def _chain_episode(actions, length, cont, quit_reward=0.1, goal_reward=1.0, move_cost=0.0):
    """Return and length of one chain episode played from `actions` (a scalar reference)."""
    pos, total = 0, 0.0
    for t, a in enumerate(actions):
        if a != cont[pos]:
            return total + quit_reward, t + 1
        if pos == length - 1:
            return total + goal_reward, t + 1
        total -= move_cost
        pos += 1
    raise AssertionError("the episode did not end")


def test_deceptive_chain_every_action_sequence():
    L = 6
    for action_seed in (None, 3):
        env = envs.DeceptiveChain(2 ** L, length=L, quit_reward=0.3, move_cost=0.01,
                                  action_seed=action_seed, dtype=torch.float64)
        cont = env.continue_action.tolist()
        if action_seed is None:
            assert cont == [1] * L
        else:
            assert 0 < sum(cont) < L      # this seed swaps the meaning in some positions
        assert env.obs_dim == L and (env.obs == torch.eye(L)[0]).all()
        seqs = [[(i >> t) & 1 for t in range(L)] for i in range(2 ** L)]
        returns = [None] * (2 ** L)
        for t in range(L):
            _, _, term, trunc, info = env.step(torch.tensor([s[t] for s in seqs]))
            assert not trunc.any()
            for i in torch.nonzero(term).flatten().tolist():
                if returns[i] is None:
                    returns[i] = (info["episode_return"][i].item(), info["episode_length"][i].item())
        for i, s in enumerate(seqs):
            ref_ret, ref_len = _chain_episode(s, L, cont, 0.3, 1.0, 0.01)
            assert returns[i][0] == pytest.approx(ref_ret, abs=1e-12) and returns[i][1] == ref_len
        # exactly one sequence reaches the goal
        assert sum(r[0] > 0.5 for r in returns) == 1


def test_deceptive_chain_bad_arguments():
    with pytest.raises(ValueError, match="length"):
        envs.DeceptiveChain(2, length=0)
    with pytest.raises(ValueError, match="quit_reward"):
        envs.DeceptiveChain(2, quit_reward=float("inf"))
    with pytest.raises(ValueError, match="action_seed"):
        envs.DeceptiveChain(2, action_seed=1.5)
    with pytest.raises(ValueError, match="action"):
        envs.DeceptiveChain(2).step(torch.zeros(3, dtype=torch.long))


def test_resolve_device():
    assert envs.resolve_device("cpu") == torch.device("cpu")
    assert envs.resolve_device(None).type in ("cpu", "cuda")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device"):
            envs.resolve_device("cuda")


@pytest.mark.parametrize("name, kwargs", [("CartPole", {}), ("DeceptiveChain", {"length": 4}),
                                          ("PendulumArray", {})])
def test_seed_batch_steps_each_member_as_its_own_env(name, kwargs):
    """A SeedBatch of K seeds, driven by the same actions, reproduces K environments stepped one
    by one (make_env(seed=s) then reset(seed=s)), also after dropping members."""
    seeds, n = [3, 0, 7], 5
    alone = [envs.make_env(name, n, seed=s, **kwargs) for s in seeds]
    first = [e.reset(seed=s) for e, s in zip(alone, seeds)]
    batch = envs.SeedBatch(name, n, seeds, **kwargs)
    assert torch.equal(batch.obs, torch.stack(first))
    gen = torch.Generator().manual_seed(0)
    finished = 0
    for t in range(300):
        k = batch.num_members
        act = (torch.randint(0, 2, (k, n), generator=gen) if batch.discrete
               else torch.randn(k, n, batch.action_dim, generator=gen))
        obs, rew, term, trunc, info = batch.step(act)
        for i, e in enumerate(alone):
            o, r, te, tr, inf = e.step(act[i])
            assert torch.equal(obs[i], o) and torch.equal(rew[i], r)
            assert torch.equal(term[i], te) and torch.equal(trunc[i], tr)
            assert torch.equal(info["final_obs"][i], inf["final_obs"])
            assert torch.equal(info["episode_return"][i], inf["episode_return"])
            finished += int((te | tr).sum())
        if t == 150:
            batch.keep([2, 0])
            alone = [alone[2], alone[0]]
    assert finished > 0                      # resets happened (else the test checks less than it says)
    with pytest.raises(ValueError, match="seeds"):
        envs.SeedBatch(name, n, [], **kwargs)
