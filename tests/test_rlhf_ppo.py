"""Tests of the PPO-RLHF loop: sampling, GAE, one update, KL logging, controller, cache."""
import copy
import math
import os

import numpy as np
import pytest
import torch

from klbook_lib.rlhf import data, models, ppo
from rlhf_helpers import micro_policy, small_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok():
    return small_tokenizer()


class TokenCountReward:
    """A stand-in reward model: the number of times ``token`` occurs in the sequence."""

    def __init__(self, token):
        self.token = token

    def score(self, input_ids, attention_mask):
        return ((input_ids == self.token) & (attention_mask == 1)).float().sum(1)


def test_gae_matches_the_direct_sum():
    # A_t = sum_l (gamma*lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t, V = 0 after the end
    rng = np.random.default_rng(0)
    B, N, gamma, lam = 4, 7, 0.9, 0.8
    lengths = [7, 3, 1, 5]
    r = rng.normal(size=(B, N))
    v = rng.normal(size=(B, N))
    mask = np.array([[1] * L + [0] * (N - L) for L in lengths])
    adv, ret = ppo.gae(torch.tensor(r * mask), torch.tensor(v * mask), torch.tensor(mask), gamma, lam)
    for b, L in enumerate(lengths):
        vv = np.append(v[b, :L], 0.0)
        delta = r[b, :L] + gamma * vv[1:] - vv[:-1]
        for t in range(L):
            expected = sum((gamma * lam) ** k * delta[t + k] for k in range(L - t))
            assert adv[b, t].item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
            assert ret[b, t].item() == pytest.approx(expected + v[b, t], rel=1e-9, abs=1e-12)
        assert np.all(adv[b, L:].numpy() == 0)


def test_sampling_is_the_full_softmax_at_temperature(tok):
    # the first sampled token's frequencies match softmax(logits / T): no hidden top-k
    m = micro_policy(tok)
    T, n = 2.0, 4000
    g = torch.Generator().manual_seed(0)
    ro = ppo.sample_responses(m, tok, ["the food was"] * n, max_new_tokens=1, temperature=T, generator=g)
    ids, mask = ppo.encode_prompts(tok, ["the food was"])
    p = torch.softmax(models.lm_logits(m, ids, mask)[0, -1] / T, -1).double()
    counts = torch.bincount(ro.response_ids[:, 0], minlength=len(tok)).double()
    freq = counts / n
    se = (p * (1 - p) / n).sqrt()
    assert torch.all((freq - p).abs() <= 5 * se + 1.0 / n)   # 5 standard errors per token
    top50 = set(torch.topk(p, 50).indices.tolist())
    outside = sum(c for i, c in enumerate(counts.tolist()) if i not in top50)
    expected_outside = n * (1 - p[list(top50)].sum().item())
    assert outside > 0.5 * expected_outside > 100       # top-k=50 would make this zero


def test_rollout_masks_after_eos(tok):
    m = micro_policy(tok)
    g = torch.Generator().manual_seed(1)
    ro = ppo.sample_responses(m, tok, ["the bed was", "i found the menu"] * 50, max_new_tokens=12,
                              temperature=1.0, generator=g)
    ids, mk = ro.response_ids, ro.response_mask
    assert 0 < int(ro.has_eos.sum()) < ids.shape[0]   # both branches below are exercised
    for b in range(ids.shape[0]):
        row, mrow = ids[b].tolist(), mk[b].tolist()
        if tok.eos_token_id in row:
            e = row.index(tok.eos_token_id)
            assert mrow[:e + 1] == [1] * (e + 1) and all(x == 0 for x in mrow[e + 1:])
            assert all(x == tok.pad_token_id for x in row[e + 1:])
            assert bool(ro.has_eos[b])
        else:
            assert all(mrow) and not bool(ro.has_eos[b])
    assert ro.input_ids.shape[1] == ro.prompt_len + ids.shape[1]


def test_missing_eos_gets_the_penalty_score(tok):
    m = micro_policy(tok)
    g = torch.Generator().manual_seed(2)
    ro = ppo.sample_responses(m, tok, ["the food was"] * 40, max_new_tokens=2, generator=g)
    rm = TokenCountReward(tok.encode(" good", add_special_tokens=False)[0])
    scores, raw = ppo.reward_scores(rm, ro, missing_eos_score=-3.0)
    assert torch.all(scores[~ro.has_eos] == -3.0)
    assert torch.all(scores[ro.has_eos] == raw[ro.has_eos])
    assert (~ro.has_eos).any()


def test_measure_is_zero_kl_against_itself(tok):
    m = micro_policy(tok)
    g = torch.Generator().manual_seed(3)
    ro = ppo.sample_responses(m, tok, ["the view was"] * 16, max_new_tokens=6, generator=g)
    st = ppo.measure(m, copy.deepcopy(m), TokenCountReward(5), tok, ro)
    for k in ("kl_exact_seq", "k1_seq", "k3_seq", "kl_exact_token"):
        assert abs(st[k]) < 1e-6, (k, st[k])
    # entropy of a near-uniform random network is close to log(vocab)
    assert st["entropy_token"] == pytest.approx(math.log(len(tok)), abs=0.3)


def _step_setup(tok, seed=0):
    policy = micro_policy(tok, seed)
    ref = models.frozen_copy(policy)
    value = models.ScalarHeadModel.from_policy(policy)
    good = tok.encode(" good", add_special_tokens=False)[0]
    return policy, ref, value, TokenCountReward(good), good


def test_one_ppo_step_moves_toward_higher_reward(tok):
    # on a fixed batch, the update must raise the importance-weighted mean reward
    # sum_b w_b s_b / sum_b w_b, with w_b = pi_new(y_b) / pi_old(y_b)
    policy, ref, value, rm, good = _step_setup(tok)
    cfg = ppo.PPOConfig(batch_size=64, minibatch_size=32, max_new_tokens=6, lr=3e-3, ppo_epochs=2,
                        missing_eos_score=None)
    g = torch.Generator().manual_seed(4)
    ro = ppo.sample_responses(policy, tok, ["the food was"] * 64, 6, 1.0, g)
    scores = rm.score(ro.input_ids, ro.attention_mask)
    assert scores.std() > 0
    seq_lp = lambda model: (ppo.response_logits(model, ro).log_softmax(-1)
                            .gather(-1, ro.response_ids[..., None]).squeeze(-1) * ro.response_mask).sum(1)
    with torch.no_grad():
        before = seq_lp(policy)
    opt_pi = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    opt_v = torch.optim.Adam(value.parameters(), lr=cfg.value_lr)
    stats, diag = ppo.ppo_step(policy, ref, rm, value, ro, 0.0, cfg, opt_pi, opt_v, torch.Generator().manual_seed(0))
    with torch.no_grad():
        after = seq_lp(policy)
    w = torch.exp(after - before)
    assert (w * scores).sum() / w.sum() > scores.mean() + 0.01
    assert stats["score"] == pytest.approx(scores.mean().item())
    assert diag["approx_kl_k3"] >= 0
    # the probability of the rewarded token rose
    ids, mask = ppo.encode_prompts(tok, ["the food was"])
    p_before = torch.softmax(models.lm_logits(ref, ids, mask)[0, -1], -1)[good]
    p_after = torch.softmax(models.lm_logits(policy, ids, mask)[0, -1], -1)[good]
    assert p_after > p_before


def _mini_pipeline(tok):
    from klbook_lib.rlhf.pipeline import RLHFPipeline
    policy = micro_policy(tok)
    rm = models.ScalarHeadModel.from_policy(policy)
    for p in rm.parameters():
        p.requires_grad_(False)
    return RLHFPipeline(preset="tiny", seed=0, device="cpu", tokenizer=tok, corpus=[], prompts=data.all_prompts(),
                        train_pairs=[], heldout_pairs=[], sft_model=models.frozen_copy(policy), reward_model=rm)


def test_run_rlhf_with_proportional_controller(tok, tmp_path):
    from klbook_lib.controllers import ProportionalKL
    pipe = _mini_pipeline(tok)
    ctl = ProportionalKL(beta=0.2, target=1.0, horizon=100)
    cfg = ppo.PPOConfig(batch_size=16, minibatch_size=8, max_new_tokens=5, lr=1e-2)
    res = ppo.run_rlhf(pipe, steps=3, seed=0, controller=ctl, config=cfg, progress=False,
                       checkpoint_dir=tmp_path, checkpoint_every=3)
    h = res.history
    assert len(h) == 3 and h[0]["beta"] == pytest.approx(0.2)
    for a, b in zip(h[:-1], h[1:]):   # Ziegler et al.'s rule, written out independently
        e = min(max(a["k1_seq"] / 1.0 - 1, -0.2), 0.2)
        assert b["beta"] == pytest.approx(a["beta"] * (1 + e * 16 / 100), rel=1e-9)
    assert h[0]["kl_exact_seq"] == pytest.approx(0.0, abs=1e-6)   # iteration 0 samples pi_ref itself
    assert h[-1]["kl_exact_seq"] > 0
    assert (tmp_path / "iter_0003" / "config.json").exists()
    for key in ("score", "true_reward", "kl_exact_seq", "k1_seq", "k3_seq", "k1_token", "k3_token",
                "entropy_token", "response_length", "beta"):
        assert all(math.isfinite(row[key]) for row in h), key
    # the pipeline's pi_ref was not touched
    assert all(not p.requires_grad for p in pipe.ref_model.parameters())


def test_training_is_deterministic(tok):
    cfg = ppo.PPOConfig(batch_size=8, minibatch_size=8, max_new_tokens=4)
    a = ppo.run_rlhf(_mini_pipeline(tok), beta=0.1, steps=2, seed=5, config=cfg, progress=False).history
    b = ppo.run_rlhf(_mini_pipeline(tok), beta=0.1, steps=2, seed=5, config=cfg, progress=False).history
    assert [r["score"] for r in a] == [r["score"] for r in b]
    assert [r["kl_exact_seq"] for r in a] == [r["kl_exact_seq"] for r in b]


@pytest.mark.parametrize("kwargs, word", [
    (dict(batch_size=0), "batch_size"), (dict(temperature=0.0), "temperature"),
    (dict(kl_estimator="k4"), "kl_estimator"), (dict(gamma=1.5), "gamma"),
    (dict(batch_size=8, minibatch_size=16), "minibatch_size"),
])
def test_bad_config_raises(kwargs, word):
    with pytest.raises(ValueError, match=word):
        ppo.PPOConfig(**kwargs).check()


def test_bad_run_arguments(tok):
    pipe = _mini_pipeline(tok)
    with pytest.raises(ValueError, match="steps"):
        ppo.run_rlhf(pipe, steps=0)
    with pytest.raises(ValueError, match="beta"):
        ppo.run_rlhf(pipe, beta=-1.0, steps=1, progress=False)
    with pytest.raises(ValueError, match="temperature"):
        ppo.sample_responses(pipe.sft_model, tok, ["the food was"], temperature=0.0)


def test_build_pipeline_caches_atomically(tmp_path, monkeypatch):
    from klbook_lib.rlhf import pipeline as pl
    small = dict(n_corpus=300, n_pairs=200, sft_steps=3, sft_batch=8, sft_lr=1e-3,
                 rm_steps=2, rm_batch=8, rm_lr=1e-3)
    monkeypatch.setitem(pl.SETTINGS, "tiny", small)
    monkeypatch.setenv("KLBOOK_CACHE", str(tmp_path))
    a = pl.build_pipeline("tiny", seed=0, device="cpu", progress=False)
    entries = os.listdir(tmp_path)
    assert entries == [os.path.basename(a.cache_path)]            # no temporary directory left
    assert pl.code_version() in a.cache_path
    b = pl.build_pipeline("tiny", seed=0, device="cpu", progress=False)   # loads, does not retrain
    assert os.listdir(tmp_path) == entries
    for x, y in zip(a.sft_model.parameters(), b.sft_model.parameters()):
        assert torch.equal(x, y)
    for x, y in zip(a.reward_model.parameters(), b.reward_model.parameters()):
        assert torch.equal(x, y)
    assert a.metrics == b.metrics and 0 <= a.metrics["rm_heldout_accuracy"] <= 1
    assert [p.prompt for p in a.train_pairs] == [p.prompt for p in b.train_pairs]
    with pytest.raises(ValueError, match="preset"):
        pl.build_pipeline("enormous")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            pl.build_pipeline("tiny", device="cuda")


def test_demo_fails_clearly_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from klbook_lib.rlhf import demo
    assert demo.main(["--preset", "small", "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


class ScaledCountReward(TokenCountReward):
    """``scale`` times the token count: scores large enough for the score clip to bind."""

    def __init__(self, token, scale):
        super().__init__(token)
        self.scale = scale

    def score(self, input_ids, attention_mask):
        return self.scale * super().score(input_ids, attention_mask)


def test_measure_standard_errors_match_a_direct_computation(tok):
    # per-response quantities recomputed independently (torch.distributions KL per position,
    # data.true_reward per text); the standard error is numpy's ddof=1 std / sqrt(n)
    policy, ref = micro_policy(tok, seed=1), micro_policy(tok, seed=2)
    good = tok.encode(" good", add_special_tokens=False)[0]
    rm = ScaledCountReward(good, 3.0)
    g = torch.Generator().manual_seed(11)
    ro = ppo.sample_responses(policy, tok, ["the food was", "i found the menu"] * 12, max_new_tokens=6, generator=g)
    st = ppo.measure(policy, ref, rm, tok, ro)
    with torch.no_grad():
        lp, lq = ppo.response_logits(policy, ro), ppo.response_logits(ref, ro)
    per_pos = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=lp.double()),
                                                torch.distributions.Categorical(logits=lq.double()))
    kl_seq = (per_pos * ro.response_mask).sum(1).numpy()
    true_r = np.array([data.true_reward(r) for r in ro.responses])
    scores = rm.score(ro.input_ids, ro.attention_mask).numpy()
    n = len(ro.responses)
    assert st["kl_exact_seq"] == pytest.approx(kl_seq.mean(), rel=1e-4)
    assert st["kl_exact_seq_se"] == pytest.approx(kl_seq.std(ddof=1) / np.sqrt(n), rel=1e-4)
    assert st["true_reward_se"] == pytest.approx(true_r.std(ddof=1) / np.sqrt(n), rel=1e-6)
    assert st["score_se"] == pytest.approx(scores.std(ddof=1) / np.sqrt(n), rel=1e-5)
    assert st["score_abs_max"] == pytest.approx(np.abs(scores).max())
    assert st["kl_exact_seq_se"] > 0 and st["true_reward_se"] > 0


def test_score_clipped_fraction_counts_the_scores_the_clip_changes(tok):
    policy, ref, value, _, good = _step_setup(tok)
    rm = ScaledCountReward(good, 4.0)              # 0, 4, 8, ...: counts of 2 or more exceed the clip of 5
    cfg = ppo.PPOConfig(batch_size=32, minibatch_size=16, max_new_tokens=8, missing_eos_score=None,
                        score_clip=5.0)
    g = torch.Generator().manual_seed(5)
    prompts = ["the food was good good good"] * 32
    ro = ppo.sample_responses(policy, tok, prompts, 8, 1.0, g)
    scores = rm.score(ro.input_ids, ro.attention_mask)
    expected = float((scores.abs() > 5.0).float().mean())
    assert 0 < expected                           # the prompt itself holds three rewarded tokens
    opt_pi = torch.optim.Adam(policy.parameters(), lr=1e-3)
    opt_v = torch.optim.Adam(value.parameters(), lr=1e-3)
    _, diag = ppo.ppo_step(policy, ref, rm, value, ro, 0.1, cfg, opt_pi, opt_v, torch.Generator().manual_seed(0))
    assert diag["score_clipped_fraction"] == pytest.approx(expected)


def test_prompts_can_be_restricted_for_training_and_evaluation(tok):
    pipe = _mini_pipeline(tok)
    held = [p for p in pipe.prompts if "pizza" in p]
    stats, ro = ppo.evaluate_policy(pipe, pipe.ref_model, n=12, seed=0, max_new_tokens=3, prompts=held)
    assert set(ro.prompts) <= set(held) and len(ro.prompts) == 12
    # the default is every prompt of the pipeline, as before
    _, ro_all = ppo.evaluate_policy(pipe, pipe.ref_model, n=12, seed=0, max_new_tokens=3)
    _, ro_explicit = ppo.evaluate_policy(pipe, pipe.ref_model, n=12, seed=0, max_new_tokens=3,
                                         prompts=pipe.prompts)
    assert ro_all.prompts == ro_explicit.prompts and ro_all.responses == ro_explicit.responses
    cfg = ppo.PPOConfig(batch_size=8, minibatch_size=8, max_new_tokens=3)
    train = [p for p in pipe.prompts if "pizza" not in p]
    seen = []
    orig = ppo.sample_responses

    def spy(policy, tokenizer, prompts, *args, **kwargs):
        seen.extend(prompts)
        return orig(policy, tokenizer, prompts, *args, **kwargs)

    ppo.sample_responses = spy
    try:
        ppo.run_rlhf(pipe, beta=0.1, steps=2, seed=0, config=cfg, progress=False, prompts=train)
    finally:
        ppo.sample_responses = orig
    assert len(seen) == 16 and not any("pizza" in p for p in seen)
    for bad in ([], "the food was", [1, 2]):
        with pytest.raises(ValueError, match="prompts"):
            ppo.evaluate_policy(pipe, pipe.ref_model, n=2, prompts=bad)
        with pytest.raises(ValueError, match="prompts"):
            ppo.run_rlhf(pipe, steps=1, progress=False, prompts=bad)
