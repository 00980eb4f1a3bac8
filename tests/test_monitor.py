"""The KL formulas the monitor uses (divergences, estimators) and its statistics against torch.distributions, numpy and hand values."""
import math

import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Independent, Normal, kl_divergence

from klbook_lib import divergences, monitor
from klbook_lib.estimators import k1_from_log_ratio, k3_from_log_ratio

torch.set_num_threads(1)


def test_categorical_kl_hand_value():
    p = torch.tensor([[0.5, 0.5]])
    q = torch.tensor([[0.25, 0.75]])
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    got = divergences.kl_from_logits(p.log(), q.log())
    assert got.item() == pytest.approx(expected, rel=1e-6)
    # unnormalised logits give the same answer
    assert divergences.kl_from_logits(p.log() + 3.0, q.log() - 1.0).item() == pytest.approx(expected, rel=1e-5)


def test_categorical_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(50, 6, generator=g, dtype=torch.float64) * 2
    b = torch.randn(50, 6, generator=g, dtype=torch.float64) * 2
    ref = kl_divergence(Categorical(logits=a), Categorical(logits=b))
    assert torch.allclose(divergences.kl_from_logits(a, b), ref, atol=1e-12)
    assert torch.allclose(divergences.kl_from_logits(a, a), torch.zeros(50, dtype=torch.float64), atol=1e-12)


def test_categorical_kl_zero_probability_in_old():
    old = torch.tensor([[0.0, -math.inf]])   # pi_old = (1, 0)
    new = torch.tensor([[0.0, 0.0]])         # pi_new = (1/2, 1/2)
    assert divergences.kl_from_logits(old, new).item() == pytest.approx(math.log(2), rel=1e-6)


def test_gaussian_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(1)
    mu0, mu1 = torch.randn(40, 3, generator=g), torch.randn(40, 3, generator=g)
    s0, s1 = torch.rand(40, 3, generator=g) + 0.2, torch.rand(40, 3, generator=g) + 0.2
    ref = kl_divergence(Independent(Normal(mu0, s0), 1), Independent(Normal(mu1, s1), 1))
    got = divergences.gaussian_kl(mu0, s0, mu1, s1, reduce="sum")
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert torch.allclose(divergences.gaussian_kl(mu0, s0, mu1, s1, reduce="mean"), ref / 3, rtol=1e-5, atol=1e-6)


def test_gaussian_kl_hand_value():
    # KL(N(0,1) || N(1,2^2)) = log 2 + (1 + 1)/(2*4) - 1/2
    got = divergences.gaussian_kl(torch.tensor([[0.0]]), torch.tensor([[1.0]]),
                                  torch.tensor([[1.0]]), torch.tensor([[2.0]]), reduce="sum")
    assert got.item() == pytest.approx(math.log(2) + 0.25 - 0.5, rel=1e-6)


def test_gaussian_kl_rejects_bad_input():
    one = torch.ones(1, 1)
    with pytest.raises(ValueError, match="reduce"):
        divergences.gaussian_kl(one, one, one, one, reduce="max")
    with pytest.raises(ValueError, match="std"):
        divergences.gaussian_kl(one, -one, one, one)
    with pytest.raises(ValueError, match="logits_q"):
        divergences.kl_from_logits(torch.zeros(2, 3), torch.zeros(2, 4))


def test_k1_k3_hand_values():
    lr = torch.tensor([math.log(2.0), 0.0, -math.log(2.0)])
    assert k1_from_log_ratio(lr).tolist() == pytest.approx([-math.log(2), 0.0, math.log(2)])
    assert k3_from_log_ratio(lr).tolist() == pytest.approx([1 - math.log(2), 0.0, -0.5 + math.log(2)])
    assert (k3_from_log_ratio(torch.linspace(-5, 5, 101)) >= 0).all()


def test_k1_k3_unbiased_for_kl_old_new():
    """a ~ pi_old, log r = log pi_new(a) - log pi_old(a): E[k1] = E[k3] = KL(pi_old || pi_new)."""
    g = torch.Generator().manual_seed(2)
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64)
    kl = float((p * (p / q).log()).sum())
    n = 200_000
    a = torch.multinomial(p, n, replacement=True, generator=g)
    lr = q.log()[a] - p.log()[a]
    for est in (k1_from_log_ratio(lr), k3_from_log_ratio(lr)):
        se = est.std().item() / math.sqrt(n)
        assert abs(est.mean().item() - kl) < 5 * se  # 5 standard errors


def test_summarize_matches_numpy():
    x = torch.arange(1, 101, dtype=torch.float32)
    s = monitor.summarize(x, "v")
    assert s["v_mean"] == pytest.approx(50.5)
    assert s["v_max"] == 100.0
    assert s["v_p90"] == pytest.approx(np.percentile(np.arange(1, 101), 90))
    assert s["v_p99"] == pytest.approx(np.percentile(np.arange(1, 101), 99))
    with pytest.raises(ValueError, match="values"):
        monitor.summarize(torch.zeros(0), "v")


def test_ema():
    e = monitor.EMA(0.5)
    assert e.update(4.0) == 4.0
    assert e.update(0.0) == 2.0
    assert e.update(2.0) == 2.0
    with pytest.raises(ValueError, match="decay"):
        monitor.EMA(1.0)
    with pytest.raises(ValueError, match="x"):
        e.update(float("nan"))


def test_clip_fraction():
    r = torch.tensor([1.0, 1.1, 1.3, 0.7, 0.85])
    assert monitor.clip_fraction(r, 0.2) == pytest.approx(2 / 5)  # 1.3 and 0.7 are outside [0.8, 1.2]
    with pytest.raises(ValueError, match="clip"):
        monitor.clip_fraction(r, -0.1)


def test_grad_norm_ratio_hand_value():
    w = torch.tensor([3.0, 4.0], requires_grad=True)
    penalty = 0.5 * (w ** 2).sum()   # gradient w, norm 5
    pg = w.sum()                     # gradient (1, 1), norm sqrt(2)
    assert monitor.grad_norm_ratio(penalty, pg, [w]) == pytest.approx(5 / math.sqrt(2))
    zero = (w * 0).sum()
    assert monitor.grad_norm_ratio(zero, pg, [w]) == 0.0
    assert monitor.grad_norm_ratio(pg, zero, [w]) == math.inf
    with pytest.raises(ValueError, match="params"):
        monitor.grad_norm_ratio(pg, pg, [torch.zeros(2)])


def test_klmonitor_record():
    m = monitor.KLMonitor(ema_decay=0.5)
    exact = torch.tensor([0.1, 0.3])
    lr = torch.tensor([0.0, math.log(2.0)])
    rec = m.record(exact, lr)
    assert rec["kl_exact_mean"] == pytest.approx(0.2)
    assert rec["kl_exact_max"] == pytest.approx(0.3)
    assert rec["k1_mean"] == pytest.approx(-math.log(2) / 2)
    assert rec["k3_max"] == pytest.approx(1 - math.log(2))
    assert rec["kl_ema"] == pytest.approx(0.2)
    rec2 = m.record(torch.tensor([0.4, 0.4]), lr)
    assert rec2["kl_ema"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="logratio"):
        m.record(exact, torch.zeros(3))


def test_klmonitor_record_agrees_with_summarize():
    g = torch.Generator().manual_seed(3)
    exact = torch.rand(257, generator=g)
    lr = torch.randn(257, generator=g) * 0.3
    rec = monitor.KLMonitor().record(exact, lr)
    expected = {**monitor.summarize(exact, "kl_exact"), **monitor.summarize(k1_from_log_ratio(lr), "k1"),
                **monitor.summarize(k3_from_log_ratio(lr), "k3")}
    for key, value in expected.items():
        assert rec[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert rec["k3_p99"] == pytest.approx(float(np.percentile(k3_from_log_ratio(lr).numpy(), 99)), rel=1e-5)


# ---------------------------------------------------------------- chapter 13: the gauge and averaging

def test_kl_to_uniform_against_scipy_and_entropy():
    from scipy.special import rel_entr

    g = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(50, 6, generator=g, dtype=torch.float64)
    logits[0] = torch.tensor([0.0, -1e4, 0, 0, 0, 0])          # an action with probability 0
    got = monitor.kl_to_uniform(logits)
    p = torch.softmax(logits, -1).numpy()
    expected = rel_entr(p, np.full_like(p, 1 / 6)).sum(-1)
    assert np.allclose(got.numpy(), expected, atol=1e-12)
    assert torch.allclose(got, math.log(6) - Categorical(logits=logits).entropy(), atol=1e-12)
    assert monitor.kl_to_uniform(torch.zeros(3, 4)).abs().max() < 1e-7
    with pytest.raises(ValueError, match="logits"):
        monitor.kl_to_uniform(torch.zeros(3, 1))


def test_exploration_stats_quantiles_and_share_near_deterministic():
    from scipy.stats import entropy

    g = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(200, 3, generator=g, dtype=torch.float64)
    stats = monitor.exploration_stats(logits, near_deterministic=0.5)
    p = torch.softmax(logits, -1).numpy()
    kl = math.log(3) - entropy(p, axis=-1)
    assert stats["kl_uniform_mean"] == pytest.approx(kl.mean(), abs=1e-12)
    assert stats["kl_uniform_min"] == pytest.approx(kl.min(), abs=1e-12)
    assert stats["kl_uniform_max"] == pytest.approx(kl.max(), abs=1e-12)
    for q, key in ((0.1, "kl_uniform_p10"), (0.5, "kl_uniform_p50"), (0.9, "kl_uniform_p90")):
        assert stats[key] == pytest.approx(np.quantile(kl, q), abs=1e-12)
    assert stats["frac_near_deterministic"] == pytest.approx(np.mean(kl > 0.5 * math.log(3)))
    with pytest.raises(ValueError, match="near_deterministic"):
        monitor.exploration_stats(logits, near_deterministic=1.0)


def _fragments_by_hand(done):
    """Fragment id of every sample, by a plain loop over copies and steps."""
    T, N = len(done), len(done[0])
    ids = [[0] * N for _ in range(T)]
    k = -1
    for n in range(N):
        new = True
        for t in range(T):
            if new:
                k += 1
            ids[t][n] = k
            new = bool(done[t][n])
    return ids


def test_episode_segments_and_batch_mean_against_a_loop():
    rng = np.random.default_rng(3)
    for T, N, p in [(6, 4, 0.3), (1, 3, 0.5), (9, 1, 0.4), (5, 5, 0.0), (4, 2, 1.0)]:
        done = rng.random((T, N)) < p
        values = rng.random((T, N))
        ids = _fragments_by_hand(done.tolist())
        assert monitor.episode_segments(torch.tensor(done)).tolist() == ids
        frags = {}
        for t in range(T):
            for n in range(N):
                frags.setdefault(ids[t][n], []).append(values[t, n])
        by_episode = np.mean([np.mean(v) for v in frags.values()])
        v, d = torch.tensor(values), torch.tensor(done)
        assert monitor.batch_mean(v, d, by="episode") == pytest.approx(by_episode, abs=1e-12)
        assert monitor.batch_mean(v, d, by="sample") == pytest.approx(values.mean(), abs=1e-12)


def test_per_env_summary_and_bad_input():
    values = torch.tensor([[1.0, 2.0, 0.0], [3.0, 2.0, 5.0]])
    done = torch.tensor([[True, False, True], [True, False, False]])
    out = monitor.per_env_summary(values, done)
    assert out["mean"].tolist() == [2.0, 2.0, 2.5] and out["max"].tolist() == [3.0, 2.0, 5.0]
    assert out["episodes_finished"].tolist() == [2, 0, 1]
    assert set(monitor.per_env_summary(values)) == {"mean", "max"}
    with pytest.raises(ValueError, match="values"):
        monitor.batch_mean(torch.zeros(4), torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="done"):
        monitor.batch_mean(values, torch.zeros(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="by"):
        monitor.batch_mean(values, done, by="env")
    with pytest.raises(ValueError, match="done"):
        monitor.per_env_summary(values, torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="done"):
        monitor.episode_segments(torch.zeros(0, 3, dtype=torch.bool))
