"""diagnostics.evaluate_agents (chapter 5's batched evaluation) against kb.ppo.evaluate."""
import numpy as np
import pytest
import torch

import klbook_lib as kb
from klbook_lib import diagnostics


@pytest.fixture(scope="module")
def agents():
    """Policies of different quality: every other update of two short runs."""
    kept = []

    def keep(seed, update, agent, record):
        if update % 2 == 0:
            kept.append(agent)

    cfg = kb.ppo.PPOConfig(total_timesteps=256 * 12, stop_at_return=None)
    kb.ppo.train_seeds(cfg, [0, 1], progress=False, callback=keep)
    return kept


@pytest.mark.parametrize("deterministic", [True, False])
def test_equals_evaluate_one_agent_at_a_time(agents, deterministic):
    batched = diagnostics.evaluate_agents(agents, "CartPole", 8, seed=777,
                                          deterministic=deterministic)
    alone = np.array([kb.ppo.evaluate(a, "CartPole", 8, seed=777, deterministic=deterministic)
                      for a in agents])
    assert batched.shape == (len(agents), 8)
    np.testing.assert_allclose(batched, alone, atol=1e-6)
    assert len(np.unique(batched.mean(1))) > 3        # the agents do differ


def test_changed_task_and_seed(agents):
    short = dict(length=0.05)
    batched = diagnostics.evaluate_agents(agents[:3], "CartPole", 4, seed=5,
                                          deterministic=False, env_kwargs=short)
    alone = np.array([kb.ppo.evaluate(a, "CartPole", 4, seed=5, deterministic=False,
                                      env_kwargs=short) for a in agents[:3]])
    np.testing.assert_allclose(batched, alone, atol=1e-6)
    # a different seed gives other starts (and draws): not the same returns everywhere
    other = diagnostics.evaluate_agents(agents[:3], "CartPole", 4, seed=6,
                                        deterministic=False, env_kwargs=short)
    assert not np.array_equal(batched, other)


def test_bad_input(agents):
    with pytest.raises(ValueError, match="agents"):
        diagnostics.evaluate_agents([], "CartPole")
    with pytest.raises(ValueError, match="num_episodes"):
        diagnostics.evaluate_agents(agents[:1], "CartPole", 0)
    with pytest.raises(ValueError, match="env_kwargs"):
        diagnostics.evaluate_agents(agents[:1], "CartPole", 2, env_kwargs=[1])
    torch.manual_seed(0)
    gaussian = kb.ppo.Agent(3, action_dim=1)
    with pytest.raises(ValueError, match="agent"):
        diagnostics.evaluate_agents([gaussian], "Pendulum", 2)
