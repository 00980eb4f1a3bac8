"""Tests of klbook_lib.rlhf.overopt: best-of-n, its KL, the unbiased estimator, the scaling-law fits.

References are independent of the code under test: brute-force enumeration of every
n-tuple of draws (with ties broken uniformly at random by hand), every subset of a pool,
every pool of a small discrete distribution, scipy's quadrature for the continuous
best-of-n KL, and synthetic data with known coefficients for the fits.
"""
from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import integrate

from klbook_lib.rlhf import data, overopt as O, pipeline as P
from klbook_lib.rlhf.models import ScalarHeadModel
from rlhf_helpers import micro_policy, small_tokenizer

torch.set_num_threads(1)


# --------------------------------------------------------------------------- brute force
def brute_force_bon(p, s, n):
    """Best-of-n distribution by enumerating all K**n tuples; ties split uniformly among tied draws."""
    K = len(p)
    out = np.zeros(K)
    for tup in itertools.product(range(K), repeat=n):
        prob = np.prod([p[i] for i in tup])
        best = max(s[i] for i in tup)
        winners = [i for i in tup if s[i] == best]          # tied draws, one entry per draw
        for i in winners:
            out[i] += prob / len(winners)
    return out


def subset_mean(sel, val, n):
    """Mean over all size-n subsets of the value of the subset's element with the largest selector."""
    tot, cnt = 0.0, 0
    for sub in itertools.combinations(range(len(sel)), n):
        best = max(sub, key=lambda i: (sel[i], i))          # ties: the later index (a stable sort's pick)
        tot += val[best]
        cnt += 1
    return tot / cnt


# --------------------------------------------------------------------------- the bound
@pytest.mark.parametrize("n", [1, 2, 3, 10, 100])
def test_bound_is_the_continuous_kl(n):
    # With a continuous score, u = F(score) of the pick has density n u^(n-1) on [0, 1]
    # against the uniform density of a plain sample: KL = int n u^(n-1) log(n u^(n-1)) du.
    f = lambda u: n * u ** (n - 1) * math.log(n * u ** (n - 1)) if u > 0 else 0.0
    kl, err = integrate.quad(f, 0, 1, limit=200)
    assert O.bon_kl_bound(n) == pytest.approx(kl, abs=1e-8 + 10 * err)


def test_bound_values_and_errors():
    assert O.bon_kl_bound(1) == 0.0
    assert O.bon_kl_bound(2) == pytest.approx(math.log(2) - 0.5)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="n"):
            O.bon_kl_bound(bad)


# --------------------------------------------------------------------------- exact discrete BoN
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_bon_distribution_matches_enumeration_with_ties(n):
    p = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    s = np.array([1.0, 3.0, 2.0, 3.0, 0.5])                # outcomes 1 and 3 tie
    expected = brute_force_bon(p, s, n)
    np.testing.assert_allclose(O.bon_distribution(p, s, n), expected, rtol=1e-12, atol=1e-15)
    assert O.bon_distribution(p, s, n).sum() == pytest.approx(1.0)


def test_bon_kl_matches_enumeration_and_is_below_the_bound():
    rng = np.random.default_rng(0)
    for _ in range(20):
        K = int(rng.integers(2, 6))
        p = rng.dirichlet(np.ones(K))
        s = rng.integers(0, 3, K).astype(float)            # many ties
        n = int(rng.integers(1, 5))
        q = brute_force_bon(p, s, n)
        on = q > 0
        kl = float(np.sum(q[on] * np.log(q[on] / p[on])))
        assert O.bon_kl(p, s, n) == pytest.approx(kl, abs=1e-12)
        assert O.bon_kl(p, s, n) <= O.bon_kl_bound(n) + 1e-12


def test_bon_kl_approaches_the_bound_for_many_small_atoms_only():
    n = 16
    many = np.full(20000, 1 / 20000)
    assert O.bon_kl(many, np.arange(20000.0), n) == pytest.approx(O.bon_kl_bound(n), abs=2e-3)
    # one atom holding half the mass at the top: best-of-n picks it almost surely, KL ~ log 2
    big = np.array([0.5] + [0.5 / 100] * 100)
    scores = np.concatenate([[1e9], np.arange(100.0)])
    assert O.bon_kl(big, scores, n) == pytest.approx(math.log(2), abs=1e-3)
    assert O.bon_kl(big, scores, n) < O.bon_kl_bound(n) - 1.0


def test_bon_input_errors():
    with pytest.raises(ValueError, match="probs"):
        O.bon_kl([0.5, 0.6], [1, 2], 2)
    with pytest.raises(ValueError, match="probs"):
        O.bon_kl([1.5, -0.5], [1, 2], 2)
    with pytest.raises(ValueError, match="scores"):
        O.bon_distribution([0.5, 0.5], [1, 2, 3], 2)
    with pytest.raises(ValueError, match="n"):
        O.bon_distribution([0.5, 0.5], [1, 2], 0)


# --------------------------------------------------------------------------- the estimator
def test_bon_weights_match_subset_counts():
    m, n = 7, 3
    counts = np.zeros(m)
    for sub in itertools.combinations(range(m), n):
        counts[max(sub)] += 1
    np.testing.assert_allclose(O.bon_weights(m, n), counts / counts.sum(), rtol=1e-12)
    np.testing.assert_allclose(O.bon_weights(5, 1), np.full(5, 0.2))
    np.testing.assert_allclose(O.bon_weights(5, 5), [0, 0, 0, 0, 1])
    with pytest.raises(ValueError, match="n: must be at most m"):
        O.bon_weights(3, 4)


def test_bon_estimate_is_the_mean_over_all_subsets():
    rng = np.random.default_rng(1)
    sel = rng.normal(size=(3, 8))
    sel[0, 2] = sel[0, 5]                                  # a tie
    val = rng.normal(size=(3, 8))
    ns = [1, 2, 3, 5, 8]
    est = O.bon_estimate(sel, val, ns)
    assert est.shape == (3, len(ns))
    for r in range(3):
        for j, n in enumerate(ns):
            assert est[r, j] == pytest.approx(subset_mean(sel[r], val[r], n), abs=1e-12)
    np.testing.assert_allclose(O.bon_estimate(sel[1], val[1], ns), est[1])


def test_bon_estimate_is_unbiased_over_all_pools():
    # Every pool of m i.i.d. draws from a small distribution, weighted by its probability:
    # the expected estimate equals the exact best-of-n expectation.
    p = np.array([0.5, 0.3, 0.2])
    s = np.array([0.0, 2.0, 1.0])                          # distinct scores
    v = np.array([1.0, -1.0, 3.0])
    m = 4
    for n in (1, 2, 3, 4):
        exact = float(O.bon_distribution(p, s, n) @ v)
        mean = 0.0
        for pool in itertools.product(range(3), repeat=m):
            prob = np.prod(p[list(pool)])
            mean += prob * O.bon_estimate(s[list(pool)], v[list(pool)], [n])[0]
        assert mean == pytest.approx(exact, abs=1e-12)


def test_bon_estimate_errors():
    with pytest.raises(ValueError, match="values"):
        O.bon_estimate([1, 2], [1, 2, 3], [1])
    with pytest.raises(ValueError, match="finite"):
        O.bon_estimate([1, np.nan], [1, 2], [1])
    with pytest.raises(ValueError, match="n: must be at most"):
        O.bon_estimate([1, 2], [1, 2], [3])


# --------------------------------------------------------------------------- fits
@pytest.mark.parametrize("form", ["bon", "rl"])
def test_fits_recover_known_coefficients(form):
    alpha, beta = 0.8, 0.15
    d = np.linspace(0.05, 4.0, 40)
    g = d if form == "bon" else np.log(d)
    r = d * (alpha - beta * g)
    fit = (O.fit_bon if form == "bon" else O.fit_rl)(d, r)
    assert (fit.alpha, fit.beta) == (pytest.approx(alpha, abs=1e-10), pytest.approx(beta, abs=1e-10))
    assert fit.rmse < 1e-10 and fit.n_points == 40
    # with noise of sd 0.01 the coefficients come back to within a few standard errors
    rng = np.random.default_rng(2)
    noisy = (O.fit_bon if form == "bon" else O.fit_rl)(d, r + rng.normal(0, 0.01, d.size))
    assert abs(noisy.alpha - alpha) < 0.02 and abs(noisy.beta - beta) < 0.02


@pytest.mark.parametrize("form", ["bon", "rl"])
def test_peak_matches_a_grid_search(form):
    fit = O.ScalingFit(form, 0.9, 0.3, 0.0, 2)
    grid = np.linspace(1e-4, 30, 300001)
    vals = fit.predict(grid)
    d_star, r_star = fit.peak()
    assert d_star == pytest.approx(grid[vals.argmax()], abs=2e-4)
    assert r_star == pytest.approx(vals.max(), abs=1e-8)
    assert O.ScalingFit(form, 0.9, -0.1, 0.0, 2).peak() == (math.inf, math.inf)


def test_rl_form_is_zero_at_zero_and_fit_errors():
    assert O.fit_rl([0.0, 1.0, 2.0], [0.0, 1.0, 1.5]).predict(0.0) == 0.0
    with pytest.raises(ValueError, match="d: need at least 2"):
        O.fit_bon([1.0], [1.0])
    with pytest.raises(ValueError, match="r:"):
        O.fit_bon([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="d: distances"):
        O.fit_rl([-1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite"):
        O.fit_rl([1.0, np.inf], [1.0, 2.0])


# --------------------------------------------------------------------------- caching, gold scorer
def test_cached_json_computes_once_per_settings(tmp_path):
    entry = tmp_path / "rlhf-fake"
    entry.mkdir()
    pipe = SimpleNamespace(cache_path=str(entry))
    calls = []

    def compute():
        calls.append(1)
        return {"x": len(calls)}

    assert P.cached_json("t", pipe, {"a": 1}, compute) == {"x": 1}
    assert P.cached_json("t", pipe, {"a": 1}, compute) == {"x": 1}       # from the cache
    assert P.cached_json("t", pipe, {"a": 2}, compute) == {"x": 2}       # other settings, recomputed
    assert len(calls) == 2
    with pytest.raises(ValueError, match="pipe"):
        P.cached_json("t", SimpleNamespace(cache_path=None), {}, compute)


def test_gold_reward_model_scores_the_true_reward():
    tok = small_tokenizer()
    rm = ScalarHeadModel.from_policy(micro_policy(tok))
    prompts = data.all_prompts()
    gold = O.gold_reward_model(rm, tok, prompts)
    responses = [" really lovely and the staff was friendly .", " bad", " okay , fine and plain ."]
    prompts_used = ["the coffee was", "overall the room was", "i found the menu"]
    from klbook_lib.rlhf.models import encode_texts
    ids, mask = encode_texts(tok, [p + r for p, r in zip(prompts_used, responses)])
    got = gold.score(ids, mask)
    expected = torch.tensor([data.true_reward(r) for r in responses])
    torch.testing.assert_close(got, expected)
    # its network is the reward model's (so a PPO value model copied from it starts alike)
    x = rm(ids, mask)
    torch.testing.assert_close(gold(ids, mask), x)
    with pytest.raises(ValueError, match="input_ids"):
        ids2, mask2 = encode_texts(tok, ["no prompt here ."])
        gold.score(ids2, mask2)


def test_cache_key_ignores_docstrings_and_comments_but_not_code(tmp_path):
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('"""Doc."""\ndef f(x):\n    """Old."""\n    return x + 1  # one\n')
    b.write_text('"""Other doc."""\ndef f(x):\n    """New words."""\n    # a comment\n    return x + 1\n')
    c.write_text('"""Doc."""\ndef f(x):\n    """Old."""\n    return x + 2\n')
    assert P.source_key(a) == P.source_key(b)
    assert P.source_key(a) != P.source_key(c)
    # the folder's key follows the files named, and only those (distillation caches do not
    # depend on the best-of-n code of overopt.py)
    entry = tmp_path / "rlhf-fake"
    entry.mkdir()
    pipe = SimpleNamespace(cache_path=str(entry))
    assert P.cache_dir_for("t", pipe, {}, [a]) == P.cache_dir_for("t", pipe, {}, [b])
    assert P.cache_dir_for("t", pipe, {}, [a]) != P.cache_dir_for("t", pipe, {}, [c])
    assert P.cache_dir_for("t", pipe, {}) != P.cache_dir_for("t", pipe, {}, [a])
