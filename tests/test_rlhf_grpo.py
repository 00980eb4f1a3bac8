"""Tests of klbook_lib.rlhf.grpo: group-relative advantages, the GRPO loss, verifiable rewards, the loop.

References are independent of the code under test: advantages from numpy (``ddof=1``) and
hand-computed groups; the loss from explicit Python loops over tokens; the expected gradient
of the k3 term from klbook_lib.seqkl's enumeration and from the partial forward-KL gradient
built with seqkl.position_kl; the policy-gradient term from autograd on the exact expected
reward of an enumerable policy.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import klbook_lib.seqkl as S
from klbook_lib.rlhf import data, grpo, ppo
from rlhf_helpers import micro_policy, small_tokenizer

torch.set_num_threads(1)
DT = torch.float64


# --------------------------------------------------------------------------- advantages
def test_group_advantages_hand_case():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    # group 1: mean 0.25, sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5; group 2: all equal
    a = grpo.group_advantages(r, 4, eps=0.0)
    torch.testing.assert_close(a, torch.tensor([1.5, -0.5, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0]))
    a_eps = grpo.group_advantages(r, 4)                      # eps = 1e-4 in the denominator
    assert a_eps[0].item() == pytest.approx(0.75 / 0.5001, rel=1e-6)
    # Dr. GRPO: centred only
    torch.testing.assert_close(grpo.group_advantages(r, 4, scale=False),
                               torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0, 0.0]))


def test_group_advantages_against_numpy():
    rng = np.random.default_rng(0)
    for G in (2, 3, 8):
        r = rng.normal(size=5 * G)
        got = grpo.group_advantages(torch.tensor(r), G, eps=1e-4).numpy()
        g = r.reshape(-1, G)
        want = ((g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-4)).reshape(-1)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        # every group's advantages sum to zero
        np.testing.assert_allclose(got.reshape(-1, G).sum(1), 0.0, atol=1e-10)


def test_token_advantages_follow_the_mask():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 1, 1, 1]])     # right, right, left padded
    a = grpo.token_advantages(torch.tensor([2.0, -1.0, 0.5]), mask)
    torch.testing.assert_close(a, torch.tensor([[2.0, 2.0, 2.0, 0.0], [-1.0, 0.0, 0.0, 0.0],
                                                [0.0, 0.5, 0.5, 0.5]]))


# --------------------------------------------------------------------------- the loss
def _loss_by_hand(lp, old, ref, adv, mask, beta, eps, aggregation, max_tokens=None):
    """GRPO's loss written out token by token (floats, Python loops)."""
    B, T = len(mask), len(mask[0])
    per_seq, n_tok = [], 0
    for b in range(B):
        total, n = 0.0, 0
        for t in range(T):
            if not mask[b][t]:
                continue
            ratio = math.exp(lp[b][t] - old[b][t])
            clipped = min(max(ratio, 1 - eps), 1 + eps)
            pg = min(ratio * adv[b], clipped * adv[b])
            rho = math.exp(ref[b][t] - lp[b][t])
            k3 = rho - math.log(rho) - 1
            total += -(pg - beta * k3)
            n += 1
        per_seq.append((total, n))
        n_tok += n
    if aggregation == "sequence_mean":
        return sum(s / n for s, n in per_seq) / B
    if aggregation == "token_mean":
        return sum(s for s, _ in per_seq) / n_tok
    return sum(s for s, _ in per_seq) / (B * max_tokens)


@pytest.mark.parametrize("aggregation", grpo.AGGREGATIONS)
def test_grpo_loss_against_a_loop_with_padding(aggregation):
    g = torch.Generator().manual_seed(1)
    B, T = 6, 5
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0],
                         [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    lp = -torch.rand(B, T, generator=g, dtype=DT) * 3
    old = lp + 0.3 * torch.randn(B, T, generator=g, dtype=DT)        # some ratios leave [0.8, 1.2]
    ref = lp + 0.5 * torch.randn(B, T, generator=g, dtype=DT)
    adv = torch.randn(B, generator=g, dtype=DT)
    # junk on the pads, as a real forward pass leaves there
    lp_j, old_j, ref_j = lp.clone(), old.clone(), ref.clone()
    lp_j[mask == 0] = -float("inf")
    old_j[mask == 0] = float("nan")
    ref_j[mask == 0] = 7.0
    loss, st = grpo.grpo_loss(lp_j, old_j, ref_j, adv, mask, beta=0.3, clip_range=0.2,
                              aggregation=aggregation, max_tokens=8)
    want = _loss_by_hand(lp.tolist(), old.tolist(), ref.tolist(), adv.tolist(), mask.tolist(), 0.3, 0.2,
                         aggregation, 8)
    assert loss.item() == pytest.approx(want, rel=1e-12, abs=1e-12)
    # clip fraction counted over real tokens only
    ratio = (lp - old).exp()
    n_out = int((((ratio - 1).abs() > 0.2) & (mask == 1)).sum())
    assert 0 < n_out < int(mask.sum())
    assert st["clipfrac"] == pytest.approx(n_out / int(mask.sum()))


def test_grpo_loss_on_policy_is_advantage_weighted_likelihood_plus_k3():
    # ratio = 1 at the first update: the surrogate's gradient is A * grad log pi; k3's value is the KL estimate
    lp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=DT, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5]], dtype=DT)
    mask = torch.ones(1, 3)
    loss, st = grpo.grpo_loss(lp, lp.detach(), ref, torch.tensor([2.0], dtype=DT), mask, beta=0.5)
    d = (ref - lp).detach()
    k3 = (d.exp() - 1 - d)
    assert loss.item() == pytest.approx(-2.0 + 0.5 * k3.mean().item(), rel=1e-12)
    assert st["k3"] == pytest.approx(k3.mean().item(), rel=1e-12)
    loss.backward()
    # d/dlp: -A/T from the surrogate, beta * (1 - exp(ref - lp)) / T from k3
    want = (-2.0 + 0.5 * (1 - d.exp())) / 3
    torch.testing.assert_close(lp.grad, want, atol=1e-12, rtol=0)


def _enumerated(space, theta, ref, old=None):
    """Every sequence of the space as a padded batch: log-probs [N, T] under theta, ref, old."""
    lp = S.token_logprobs(space, theta)
    lq = S.token_logprobs(space, ref)
    lo = lp.detach() if old is None else S.token_logprobs(space, old)
    return lp, lq, lo


def _expected_grpo_gradient(space, theta, ref, old, adv_of_seq, beta, aggregation, max_tokens=None):
    """sum_y mu(y) * grad grpo_loss([y]): the exact expectation of a one-sequence batch's gradient."""
    leaf = theta.clone().requires_grad_(True)
    lp, lq, lo = _enumerated(space, leaf, ref, old)
    mu = S.sequence_logprobs(space, theta if old is None else old).exp().detach()
    total = 0.0
    for n in range(space.n_sequences):
        loss, _ = grpo.grpo_loss(lp[n:n + 1], lo[n:n + 1], lq[n:n + 1], adv_of_seq[n:n + 1],
                                 space.mask[n:n + 1], beta, aggregation=aggregation, max_tokens=max_tokens)
        total = total + mu[n] * loss
    return torch.autograd.grad(total, leaf)[0]


@pytest.mark.parametrize("off_policy", [False, True])
def test_k3_term_gradient_matches_seqkl_exact_expectation(off_policy):
    # variable lengths (EOS) so that GRPO's 1/|o_i| matters
    sp = S.sequence_space(3, 3, eos=2)
    ref = S.random_logits(sp, seed=3)
    theta = ref + S.random_logits(sp, seed=4)
    old = theta - 0.4 * S.random_logits(sp, seed=5) if off_policy else None
    zero_adv = torch.zeros(sp.n_sequences, dtype=DT)
    got = _expected_grpo_gradient(sp, theta, ref, old, zero_adv, 1.0, "sequence_mean")
    want = S.expected_gradient(sp, theta, ref, "k3", "loss", behaviour_logits=old, weights="none",
                               aggregation="sequence_mean")
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    # it is not the gradient of the sequence KL
    assert S.gradient_error(got, S.exact_kl_gradient(sp, theta, ref))["rel_error"] > 0.05


def test_k3_term_on_policy_is_the_partial_forward_kl_gradient():
    # On-policy with a constant normaliser (Dr. GRPO, L = T) the k3 term's expected gradient is
    # (1/T) x the partial gradient of the FORWARD per-position KLs along pi_theta's prefixes
    # (built here from seqkl.position_kl, not from any estimator).
    sp = S.sequence_space(3, 3, eos=2)
    ref = S.random_logits(sp, seed=13)
    theta = ref + S.random_logits(sp, seed=14)
    got = _expected_grpo_gradient(sp, theta, ref, None, torch.zeros(sp.n_sequences, dtype=DT), 1.0,
                                  "constant", max_tokens=sp.length)
    leaf = theta.clone().requires_grad_(True)
    mu = S.sequence_logprobs(sp, theta).exp().detach()
    partial = torch.autograd.grad((mu * S.position_kl(sp, ref, leaf).sum(1)).sum(), leaf)[0]
    torch.testing.assert_close(got, partial / sp.length, atol=1e-12, rtol=0)
    # GRPO's own 1/|o_i| changes the direction once lengths differ, not only the scale
    seq_mean = _expected_grpo_gradient(sp, theta, ref, None, torch.zeros(sp.n_sequences, dtype=DT), 1.0,
                                       "sequence_mean")
    assert S.gradient_error(seq_mean, partial)["cosine"] < 1 - 1e-3


def test_policy_gradient_term_is_the_reinforce_gradient():
    # beta = 0, on-policy, advantage = reward, Dr. GRPO's constant normaliser L = T:
    # E[grad loss] = -(1/T) grad E[r]
    sp = S.sequence_space(3, 3, eos=1)
    theta = S.random_logits(sp, seed=6)
    r = torch.randn(sp.n_sequences, generator=torch.Generator().manual_seed(7), dtype=DT)
    got = _expected_grpo_gradient(sp, theta, theta, None, r, 0.0, "constant", max_tokens=sp.length)
    leaf = theta.clone().requires_grad_(True)
    want = -torch.autograd.grad(S.expected_reward(sp, leaf, r), leaf)[0] / sp.length
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("call, match", [
    (lambda: grpo.group_advantages(torch.zeros(6), 4), "group_size"),
    (lambda: grpo.group_advantages(torch.zeros(6), 1), "group_size"),
    (lambda: grpo.group_advantages(torch.zeros(2, 3), 3), "rewards"),
    (lambda: grpo.group_advantages(torch.tensor([1.0, float("nan")]), 2), "rewards"),
    (lambda: grpo.group_advantages(torch.zeros(4), 2, eps=-1), "eps"),
    (lambda: grpo.token_advantages(torch.zeros(3), torch.ones(2, 4)), "advantages"),
    (lambda: grpo.grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2),
                            torch.ones(2, 3), 0.1), "ref_logprobs"),
    (lambda: grpo.grpo_loss(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2, 3), torch.zeros(2),
                            torch.ones(2, 3), 0.1), "old_logprobs"),
    (lambda: grpo.grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2),
                            torch.tensor([[1, 1, 1], [0, 0, 0]]), 0.1), "response_mask"),
    (lambda: grpo.grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2),
                            torch.ones(2, 3), -0.1), "beta"),
    (lambda: grpo.grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2),
                            torch.ones(2, 3), 0.1, clip_range=0), "clip_range"),
    (lambda: grpo.grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2),
                            torch.ones(2, 3), 0.1, aggregation="mean"), "aggregation"),
    (lambda: grpo.grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2),
                            torch.ones(2, 3), 0.1, aggregation="constant"), "max_tokens"),
    (lambda: grpo.grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2),
                            torch.ones(2, 3), 0.1, aggregation="constant", max_tokens=2), "max_tokens"),
    (lambda: grpo.grpo_loss(torch.tensor([[0.0, float("nan")]]), torch.zeros(1, 2), torch.zeros(1, 2),
                            torch.zeros(1), torch.ones(1, 2), 0.1), "logprobs"),
    (lambda: grpo.prompt_noun("the weather was"), "prompt"),
    (lambda: grpo.three_adjectives("the food was", 3), "response"),
    (lambda: grpo.verifiable_rewards(["the food was"], [" good ."], rule="length"), "rule"),
    (lambda: grpo.verifiable_rewards(["the food was"], [" good .", " bad ."]), "prompts, responses"),
    (lambda: grpo.verifiable_rewards(["the food was"], [" good ."], [True, False]), "finished"),
    (lambda: grpo.GRPOConfig(group_size=1).check(), "group_size"),
    (lambda: grpo.GRPOConfig(lr=0).check(), "lr"),
    (lambda: grpo.GRPOConfig(updates_per_batch=0).check(), "updates_per_batch"),
    (lambda: grpo.GRPOConfig(aggregation="sum").check(), "aggregation"),
])
def test_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------------------- verifiable rewards
@pytest.mark.parametrize("response, finished, want", [
    (" great , bland and okay .", True, 1.0),
    (" great , great and great .", True, 1.0),      # repeats allowed
    (" great , bland and okay .", False, 0.0),     # cut off by the length limit
    (" great , bland and okay", True, 0.0),        # no full stop
    (" great , bland , okay .", True, 0.0),
    (" great , coffee and okay .", True, 0.0),     # a noun is no adjective
    (" very great , bland and okay .", True, 0.0),
    (" great and bland .", True, 0.0),
    ("", True, 0.0),
])
def test_three_adjectives(response, finished, want):
    assert grpo.three_adjectives("the coffee was", response, finished) == want


@pytest.mark.parametrize("prompt, response, finished, want", [
    ("the coffee was", " good and the coffee was hot .", True, 1.0),
    ("i found the menu", " okay but the menu was bland .", True, 1.0),
    ("the coffee was", " good .", True, 0.0),
    ("the coffee was", " good and the coffee was", True, 0.0),
    ("the coffee was", " good and the coffee was hot .", False, 0.0),
    ("the coffee was", " good and the tea was hot .", True, 0.0),
    ("the coffee was", " good and the coffees were hot .", True, 0.0),   # whole words only
])
def test_noun_and_full_stop(prompt, response, finished, want):
    assert grpo.noun_and_full_stop(prompt, response, finished) == want


def test_verifiable_rewards_batch_and_prompt_nouns():
    assert {grpo.prompt_noun(p) for p in data.all_prompts()} == set(data.NOUNS)
    r = grpo.verifiable_rewards(["the food was"] * 3, [" good , bad and fine .", " good .", " a , b and c ."],
                                torch.tensor([True, True, True]))
    torch.testing.assert_close(r, torch.tensor([1.0, 0.0, 0.0]))
    r = grpo.verifiable_rewards(["the food was"] * 2, [" good and the food was hot ."] * 2, [True, False],
                                rule="noun_and_full_stop")
    torch.testing.assert_close(r, torch.tensor([1.0, 0.0]))


# --------------------------------------------------------------------------- the loop on a micro GPT-2
@pytest.fixture(scope="module")
def tok():
    return small_tokenizer()


def test_one_grpo_step_raises_the_rewarded_responses(tok):
    # A fixed batch, a reward for responses whose first token id is even: one update must raise
    # the batch's importance-weighted mean reward sum w r / sum w, w = pi_new(y) / pi_old(y).
    policy = micro_policy(tok, seed=1)
    ref = micro_policy(tok, seed=1)
    for p in ref.parameters():
        p.requires_grad_(False)
    cfg = grpo.GRPOConfig(prompts_per_step=8, group_size=8, max_new_tokens=6, lr=3e-3, updates_per_batch=2)
    g = torch.Generator().manual_seed(2)
    prompts = [p for p in data.all_prompts()[:8] for _ in range(8)]
    ro = ppo.sample_responses(policy, tok, prompts, 6, 1.0, g)
    rewards = (ro.response_ids[:, 0] % 2 == 0).float()          # first token id even
    assert 0 < rewards.mean() < 1
    seq_lp = lambda model: (ppo.response_logits(model, ro).log_softmax(-1)
                            .gather(-1, ro.response_ids[..., None]).squeeze(-1) * ro.response_mask).sum(1)
    with torch.no_grad():
        before = seq_lp(policy)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    stats, diag = grpo.grpo_step(policy, ref, ro, rewards, 0.04, cfg, opt)
    with torch.no_grad():
        after = seq_lp(policy)
    w = torch.exp(after - before)
    assert (w * rewards).sum() / w.sum() > rewards.mean() + 0.01
    assert stats["kl_exact_seq"] == pytest.approx(0.0, abs=1e-9)     # policy == ref before the update
    assert diag["clipfrac"] >= 0 and math.isfinite(diag["loss"])


def test_train_grpo_history_and_determinism(tok):
    def run(seed):
        policy = micro_policy(tok, seed=3)
        ref = micro_policy(tok, seed=3)
        cfg = grpo.GRPOConfig(prompts_per_step=2, group_size=4, max_new_tokens=5, lr=1e-3)
        return grpo.train_grpo(policy, ref, tok, data.all_prompts(), iterations=3, beta=0.04, config=cfg,
                               seed=seed, progress=False,
                               reward_fn=lambda p, r, f: torch.tensor([float(len(x.split()) > 2) for x in r]))
    h1, h2, h3 = run(0), run(0), run(1)
    assert len(h1) == 3
    for key in ("reward", "zero_std_fraction", "kl_exact_seq", "entropy_token", "ref_nll_token", "true_reward",
                "distinct_fraction", "loss", "pg", "k3", "clipfrac", "beta", "seconds"):
        assert key in h1[0], key
    assert h1[0]["kl_exact_seq"] == pytest.approx(0.0, abs=1e-9)
    drop = lambda h: [{k: v for k, v in row.items() if k != "seconds"} for row in h]
    assert drop(h1) == drop(h2) and drop(h1) != drop(h3)


def test_train_grpo_bad_arguments(tok):
    policy, ref = micro_policy(tok), micro_policy(tok)
    with pytest.raises(ValueError, match="iterations"):
        grpo.train_grpo(policy, ref, tok, ["the food was"], iterations=0, progress=False)
    with pytest.raises(ValueError, match="beta"):
        grpo.train_grpo(policy, ref, tok, ["the food was"], iterations=1, beta=-1, progress=False)
    with pytest.raises(ValueError, match="prompts"):
        grpo.train_grpo(policy, ref, tok, [], iterations=1, progress=False)
    with pytest.raises(ValueError, match="reward_fn"):
        grpo.train_grpo(policy, ref, tok, ["the food was"], iterations=1, progress=False,
                        config=grpo.GRPOConfig(prompts_per_step=1, group_size=2, max_new_tokens=3),
                        reward_fn=lambda p, r, f: torch.zeros(5))
