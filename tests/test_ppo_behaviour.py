"""PPO: behavioural replacements for tests that could not fail (issue 22, item 10).

Each test here checks what a switch or a logged statistic *does*, against a control run that
differs only in that switch, so that it fails if the switch stops having its effect:

- ``bug_flip_logratio`` turns the update against the advantage (the policy gets worse where
  the correct run gets better);
- ``bug_no_logratio_clamp`` really removes the clamp (with a clamp so tight that it freezes the
  update, only the bugged run moves);
- ``bug_no_std_floor`` really removes the floor on the Gaussian standard deviation;
- a fixed KL coefficient on top of clipping pulls the update towards ``pi_old`` (a smaller KL
  per update than clipping alone);
- the logged ``k3_mean`` estimates the exact ``KL(pi_old || pi_new)`` that the monitor also logs
  (``k3 >= 0`` holds by construction and tests nothing).
"""
import numpy as np
import pytest
import torch

from klbook_lib import ppo

torch.set_num_threads(1)

SHORT = dict(total_timesteps=2048, stop_at_return=None)  # 8 updates of 256 steps


def _returns(history, last: int = 3) -> float:
    """Mean episodic return over the last ``last`` updates (NaN entries skipped)."""
    r = np.asarray(history["episodic_return"][-last:], dtype=float)
    return float(np.nanmean(r))


def test_flipped_logratio_moves_the_policy_against_the_advantage():
    """With log pi_old - log pi_theta the surrogate's gradient at pi_old is minus the policy
    gradient, so CartPole's return falls where the correct update raises it (3 seeds each;
    the gap is far larger than the seed-to-seed spread)."""
    kw = dict(total_timesteps=4096, stop_at_return=None)
    good = [_returns(ppo.train(ppo.PPOConfig(seed=s, **kw), progress=False).history) for s in range(3)]
    bad = [_returns(ppo.train(ppo.PPOConfig(seed=s, bug_flip_logratio=True, **kw),
                              progress=False).history) for s in range(3)]
    assert min(good) > max(bad), (good, bad)
    # the bugged policy ends below a uniformly random CartPole policy (about 22 steps)
    assert max(bad) < 20, bad


def test_no_logratio_clamp_switch_removes_the_clamp():
    """A clamp of 1e-3 nats makes the log-ratio's gradient zero on every sample that leaves
    [-1e-3, 1e-3], so after the first of the 3 epochs the policy part of the update stalls;
    with the clamp switched off the same configuration keeps moving and ends each run with
    a clearly larger total KL (about twice, in 3 of 3 seeds; 1.5 leaves room)."""
    for seed in range(3):
        kw = dict(logratio_clamp=1e-3, seed=seed, **SHORT)
        clamped = ppo.train(ppo.PPOConfig(**kw), progress=False).history["kl_exact_mean"]
        free = ppo.train(ppo.PPOConfig(bug_no_logratio_clamp=True, **kw),
                         progress=False).history["kl_exact_mean"]
        assert sum(free) > 1.5 * sum(clamped), (seed, sum(free), sum(clamped))


def test_no_std_floor_switch_removes_the_floor():
    """With a floor above the initial standard deviation (1), the floored agent's std is the
    floor; with the floor switched off it is exp(log_std), about 1."""
    kw = dict(env="PendulumArray", total_timesteps=1024, std_min=2.0)
    floored = ppo.train(ppo.PPOConfig.pendulum(**kw), progress=False).agent
    free = ppo.train(ppo.PPOConfig.pendulum(bug_no_std_floor=True, **kw), progress=False).agent
    obs = torch.zeros(4, floored.actor[0].in_features)
    std_floored = floored.dist_params(obs)[1]
    std_free = free.dist_params(obs)[1]
    assert torch.allclose(std_floored, torch.full_like(std_floored, 2.0))
    assert float(std_free.max()) < 1.5, std_free


def test_fixed_penalty_on_top_of_clipping_keeps_the_update_closer():
    """clip+kl_penalty with a fixed beta = 5 against plain clipping, same seeds: the penalty
    lowers the KL between consecutive policies in every seed."""
    kw = dict(update_epochs=10, anneal_lr=False, learning_rate=3e-3, **SHORT)
    for seed in range(3):
        clip = ppo.train(ppo.PPOConfig(objective="clip", seed=seed, **kw), progress=False).history
        pen = ppo.train(ppo.PPOConfig(objective="clip+kl_penalty", kl_coef=5.0, kl_penalty_estimator="k3",
                                      seed=seed, **kw), progress=False).history
        assert pen["beta"] == [5.0] * 8                      # fixed: no controller changes it
        assert sum(pen["kl_exact_mean"]) < 0.7 * sum(clip["kl_exact_mean"]), seed


def test_k3_mean_estimates_the_exact_kl():
    """k3 on actions drawn from pi_old is unbiased for KL(pi_old || pi_new); summed over 16
    updates of 256 samples its relative error is a few per cent (the per-update standard error
    is about KL / sqrt(256) times a constant of order one), so 25 % is a wide margin. A k3 that
    averaged the log-ratio (k1), dropped the ``r - 1`` term or divided by the batch twice would
    be off by far more; so would a k3 computed on a different batch than the exact KL."""
    h = ppo.train(ppo.PPOConfig(total_timesteps=4096, stop_at_return=None), progress=False).history
    k3, exact = (np.asarray(h[k], dtype=float) for k in ("k3_mean", "kl_exact_mean"))
    assert exact.sum() > 0
    assert abs(k3.sum() - exact.sum()) < 0.25 * exact.sum(), (k3.sum(), exact.sum())
