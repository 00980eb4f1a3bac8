"""klbook_lib.diagnostics against independent computations.

References: per-state, per-action gradients from plain autograd (the Fisher trace), an
explicitly perturbed copy of the network and the quadratic form of a brute-force Fisher
matrix (the random-step KL), planted change points (the phase split), hand-built
histories (the run diagnosis), and a deterministic policy on the chain (rollouts).
"""
import math

import numpy as np
import pytest
import torch

from klbook_lib import diagnostics as D
from klbook_lib import envs, monitor, ppo

torch.set_num_threads(1)


def _agent(seed=0, obs_dim=4, n_actions=3, gain=1.0):
    torch.manual_seed(seed)
    agent = ppo.Agent(obs_dim, n_actions=n_actions, hidden_sizes=(8, 8))
    torch.nn.init.orthogonal_(agent.actor[-1].weight, gain)   # not the tiny default gain
    return agent


def _brute_fisher(agent, obs):
    """Full Fisher matrix and trace from per-state, per-action autograd gradients."""
    params = list(agent.actor.parameters())
    d = sum(p.numel() for p in params)
    F = torch.zeros(d, d, dtype=torch.float64)
    for s in obs:
        logp = torch.log_softmax(agent.actor(s[None])[0], -1)
        for a in range(logp.shape[0]):
            g = torch.autograd.grad(logp[a], params, retain_graph=True)
            g = torch.cat([x.reshape(-1) for x in g]).double()
            F += logp[a].exp().item() * torch.outer(g, g)
    return F / len(obs)


def test_fisher_trace_matches_per_action_autograd():
    agent = _agent()
    obs = torch.randn(12, 4, generator=torch.Generator().manual_seed(1))
    F = _brute_fisher(agent, obs)
    got = D.fisher_trace(agent, obs)
    assert got["param"] == pytest.approx(torch.trace(F).item(), rel=1e-4)
    with torch.no_grad():
        p = torch.softmax(agent.actor(obs), -1)
    assert got["logit"] == pytest.approx((1 - (p ** 2).sum(-1)).mean().item(), rel=1e-6)
    assert got["ratio"] == pytest.approx(got["param"] / got["logit"], rel=1e-12)


def test_fisher_trace_two_actions_factorises():
    """For two actions tr F_s = pi_0 pi_1 |grad (z_0 - z_1)|^2 (exercise 13.2)."""
    agent = _agent(n_actions=2)
    obs = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))
    params = list(agent.actor.parameters())
    total = 0.0
    for s in obs:
        z = agent.actor(s[None])[0]
        g = torch.autograd.grad(z[0] - z[1], params)
        p = torch.softmax(z, -1).detach()
        total += (p[0] * p[1]).item() * sum((x ** 2).sum().item() for x in g)
    assert D.fisher_trace(agent, obs)["param"] == pytest.approx(total / len(obs), rel=1e-4)


def test_random_step_kl_is_the_quadratic_form_for_small_steps():
    agent = _agent(seed=3)
    obs = torch.randn(10, 4, generator=torch.Generator().manual_seed(4))
    F = _brute_fisher(agent, obs)
    eps, n_dir = 1e-3, 6
    # the same directions as random_step_kl draws (documented: randn per parameter, in order)
    gen = torch.Generator().manual_seed(9)
    quad = []
    for _ in range(n_dir):
        u = torch.cat([torch.randn(p.shape, generator=gen).double().reshape(-1)
                       for p in agent.actor.parameters()])
        u = eps * u / u.norm()
        quad.append(0.5 * (u @ F @ u).item())
    got = D.random_step_kl(agent, obs, eps, num_directions=n_dir, seed=9)
    # third-order terms are O(eps^3): relative error O(eps) with a moderate constant
    assert got == pytest.approx(np.mean(quad), rel=2e-2)


def test_random_step_kl_equals_the_kl_of_an_explicitly_moved_network():
    agent = _agent(seed=5)
    obs = torch.randn(7, 4, generator=torch.Generator().manual_seed(6))
    gen = torch.Generator().manual_seed(0)
    u = [torch.randn(p.shape, generator=gen) for p in agent.actor.parameters()]
    norm = torch.sqrt(sum((x ** 2).sum() for x in u))
    moved = ppo.Agent(4, n_actions=3, hidden_sizes=(8, 8))
    with torch.no_grad():
        for q, p, x in zip(moved.actor.parameters(), agent.actor.parameters(), u):
            q.copy_(p + 0.3 * x / norm)
        p_old = torch.softmax(agent.actor(obs), -1).double()
        p_new = torch.softmax(moved.actor(obs), -1).double()
    expected = (p_old * (p_old.log() - p_new.log())).sum(-1).mean().item()
    # both sides are float32 networks: the KL of a small step is a difference of nearby log-probabilities,
    # so float32 rounding (which differs between CPUs' kernels) leaves about 1e-5 of relative error
    assert D.random_step_kl(agent, obs, 0.3, num_directions=1, seed=0) == pytest.approx(expected, rel=1e-4)


def test_sensitivity_functions_reject_bad_input():
    agent = _agent()
    obs = torch.randn(3, 4)
    with pytest.raises(ValueError, match="obs"):
        D.fisher_trace(agent, torch.randn(3, 5))
    with pytest.raises(ValueError, match="obs"):
        D.fisher_trace(agent, torch.randn(0, 4))
    with pytest.raises(ValueError, match="step_size"):
        D.random_step_kl(agent, obs, 0.0)
    with pytest.raises(ValueError, match="num_directions"):
        D.random_step_kl(agent, obs, 0.1, num_directions=0)
    gaussian = ppo.Agent(3, action_dim=1)
    with pytest.raises(ValueError, match="agent"):
        D.fisher_trace(gaussian, torch.randn(2, 3))
    with pytest.raises(ValueError, match="agent"):
        D.fisher_trace("not an agent", obs)


def _planted(levels, lengths, noise=0.2, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([np.exp(rng.normal(np.log(v), noise, n)) for v, n in zip(levels, lengths)])


def test_kl_phases_recovers_planted_change_points():
    kl = _planted([0.05, 0.004, 0.0003], [40, 100, 60])
    phases = D.kl_phases({"kl_exact_mean": kl})
    assert [p["start"] for p in phases][0] == 0 and phases[-1]["stop"] == 200
    assert abs(phases[1]["start"] - 40) <= 2 and abs(phases[2]["start"] - 140) <= 2
    assert [p["label"] for p in phases] == ["adjustment", "adjustment", "polishing"]
    for p, level in zip(phases, (0.05, 0.004, 0.0003)):
        assert p["median_kl"] == pytest.approx(level, rel=0.25)
    # the same values in random order: no phase structure
    shuffled = np.random.default_rng(1).permutation(kl)
    assert len(D.kl_phases({"kl_exact_mean": shuffled})) == 1
    # a constant level: one phase, labelled polishing
    flat = D.kl_phases({"kl": _planted([0.01], [100])}, key="kl")
    assert len(flat) == 1 and flat[0]["label"] == "polishing"


def test_kl_phases_respects_max_phases_and_min_length():
    kl = _planted([0.05, 0.004, 0.0003], [40, 100, 60])
    assert len(D.kl_phases({"kl_exact_mean": kl}, max_phases=2)) == 2
    phases = D.kl_phases({"kl_exact_mean": _planted([0.05, 0.001], [5, 95])}, min_length=10)
    assert all(p["stop"] - p["start"] >= 10 for p in phases)


@pytest.mark.parametrize("kwargs, match", [
    (dict(history=[1, 2, 3]), "history"),
    (dict(history={"other": [1.0]}), "history"),
    (dict(history={"kl_exact_mean": []}), "history"),
    (dict(history={"kl_exact_mean": [0.1, float("nan")]}), "history"),
    (dict(history={"kl_exact_mean": [0.1] * 30}, max_phases=0), "max_phases"),
    (dict(history={"kl_exact_mean": [0.1] * 30}, min_gain=1.5), "min_gain"),
    (dict(history={"kl_exact_mean": [0.1] * 30}, adjust_ratio=1.0), "adjust_ratio"),
])
def test_kl_phases_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        D.kl_phases(**kwargs)


def test_diagnose_run_flags():
    small = {"kl_exact_mean": [1e-5] * 30, "kl_uniform_mean": [0.05] * 30}
    large = {"kl_exact_mean": [0.5] * 30, "kl_uniform_mean": [0.2] * 30}
    ok = {"kl_exact_mean": [0.01] * 30, "kl_uniform_mean": [0.3] * 30}
    collapsed = {"kl_exact_mean": [0.01] * 30, "kl_uniform_mean": [0.68] * 30}
    assert D.diagnose_run(small, n_actions=2)["flags"] == ["kl_too_small"]
    assert D.diagnose_run(large, n_actions=2)["flags"] == ["kl_too_large"]
    res = D.diagnose_run(ok, n_actions=2)
    assert res["ok"] and res["flags"] == [] and res["median_kl"] == pytest.approx(0.01)
    assert D.diagnose_run(collapsed, n_actions=2)["flags"] == ["collapsed"]
    # the gauge from the entropy: log 2 - H; 0.9 log 2 is the threshold
    h = {"kl_exact_mean": [0.01] * 30, "entropy": [0.05] * 30}
    assert D.diagnose_run(h, n_actions=2)["flags"] == ["collapsed"]
    assert D.diagnose_run(h, n_actions=2)["kl_uniform"] == pytest.approx(math.log(2) - 0.05)
    # the same entropy, 0.15 nats: log 2 - 0.15 < 0.9 log 2, but log 8 - 0.15 > 0.9 log 8
    h = {"kl_exact_mean": [0.01] * 30, "entropy": [0.15] * 30}
    assert D.diagnose_run(h, n_actions=2)["flags"] == []
    assert D.diagnose_run(h, n_actions=8)["flags"] == ["collapsed"]
    # without n_actions the collapse check is skipped, and says so
    res = D.diagnose_run(collapsed)
    assert res["flags"] == [] and "collapsed" not in res["checks"]
    # only the first `window` updates count
    late = {"kl_exact_mean": [0.01] * 20 + [1.0] * 100}
    assert D.diagnose_run(late, window=20)["ok"]


@pytest.mark.parametrize("kwargs, match", [
    (dict(window=0), "window"), (dict(window=50), "history"), (dict(kl_band=(0.1, 0.01)), "kl_band"),
    (dict(collapse=1.0), "collapse"), (dict(n_actions=1), "n_actions"),
])
def test_diagnose_run_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        D.diagnose_run({"kl_exact_mean": [0.01] * 30}, **kwargs)


def test_collect_rollout_marks_episode_ends_and_groups():
    """A policy that always continues finishes every chain of length L after exactly L steps."""
    agent = ppo.Agent(5, n_actions=2, hidden_sizes=(4,))
    with torch.no_grad():
        agent.actor[-1].weight.zero_()
        agent.actor[-1].bias.copy_(torch.tensor([-50.0, 50.0]))     # action 1: continue
    groups = [envs.DeceptiveChain(2, length=5), envs.DeceptiveChain(3, length=5)]
    out = D.collect_rollout(agent, groups, 12, seed=0)
    assert out["obs"].shape == (12, 5, 5) and out["actions"].shape == (12, 5)
    assert out["group"].tolist() == [0, 0, 1, 1, 1]
    expected = torch.zeros(12, dtype=torch.bool)
    expected[[4, 9]] = True
    assert (out["done"] == expected[:, None]).all()
    assert (out["obs"].argmax(-1) == (torch.arange(12) % 5)[:, None]).all()
    # consecutive calls continue where the last one stopped
    nxt = D.collect_rollout(agent, groups, 3, seed=0)
    assert (nxt["obs"].argmax(-1)[0] == 2).all()


def test_collect_states_and_bad_input():
    agent = ppo.Agent(4, n_actions=2)
    s = D.collect_states(agent, "CartPole", num_envs=3, num_steps=4, seed=0)
    assert s.shape == (12, 4)
    assert torch.equal(s, D.collect_states(agent, "CartPole", num_envs=3, num_steps=4, seed=0))
    with pytest.raises(ValueError, match="num_steps"):
        D.collect_rollout(agent, envs.CartPole(2), 0)
    with pytest.raises(ValueError, match="envs"):
        D.collect_rollout(agent, [envs.CartPole(2), envs.Pendulum(2)], 3)
    with pytest.raises(ValueError, match="env_kwargs"):
        D.collect_states(agent, env_kwargs=[1])
    with pytest.raises(ValueError, match="agent"):
        D.collect_states(object())


def test_the_monitor_average_is_per_sample_not_per_episode():
    """KLMonitor's mean is batch_mean(by='sample'); on this batch by='episode' differs."""
    kl = torch.tensor([[1.0, 4.0], [1.0, 4.0], [5.0, 4.0], [5.0, 4.0]], dtype=torch.float64)
    done = torch.tensor([[0, 0], [1, 0], [0, 0], [0, 0]], dtype=torch.bool)
    kl[3, 1] = 8.0
    logged = monitor.KLMonitor().record(kl.reshape(-1), torch.zeros(8, dtype=torch.float64))
    assert logged["kl_exact_mean"] == pytest.approx(kl.mean().item(), abs=1e-12)
    assert monitor.batch_mean(kl, done, by="sample") == pytest.approx(logged["kl_exact_mean"], abs=1e-12)
    # fragments (1,1), (5,5), (4,4,4,8): means 1, 5, 5
    assert monitor.batch_mean(kl, done, by="episode") == pytest.approx(11 / 3)
