"""Many DPO seeds in one process (klbook_lib.dpo.train_dpo_seeds) against each seed alone, and the
tuned policies that klbook_lib.rlhf.seeds.train_seed_results returns against train_seeds' histories."""
from __future__ import annotations

import copy

import pytest
import torch

from klbook_lib import dpo
from klbook_lib.rlhf import data, models, ppo, seeds
from klbook_lib.rlhf.pipeline import RLHFPipeline
from rlhf_helpers import micro_policy, small_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pipe():
    tok = small_tokenizer()
    policy = micro_policy(tok)
    rm = models.ScalarHeadModel.from_policy(policy)
    for p in rm.parameters():
        p.requires_grad_(False)
    pairs = data.make_preference_pairs(48, seed=0)
    return RLHFPipeline(preset="tiny", seed=0, device="cpu", tokenizer=tok, corpus=[],
                        prompts=data.all_prompts(), train_pairs=pairs[:32], heldout_pairs=pairs[32:],
                        sft_model=models.frozen_copy(policy), reward_model=rm)


CFG = dpo.DPOConfig(batch_size=8, lr=3e-3, eval_every=2, n_eval_samples=8, max_new_tokens=5)


def _same_run(a: dpo.DPOResult, b: dpo.DPOResult):
    assert [h["loss"] for h in a.history] == [h["loss"] for h in b.history]
    assert [h["margin"] for h in a.history] == [h["margin"] for h in b.history]
    assert len(a.evals) == len(b.evals)
    for ea, eb in zip(a.evals, b.evals):
        assert {k: v for k, v in ea.items() if k != "elapsed"} == {k: v for k, v in eb.items() if k != "elapsed"}
    for pa, pb in zip(a.policy.parameters(), b.policy.parameters()):
        assert torch.equal(pa, pb)


def test_each_dpo_seed_of_a_batch_is_that_seed_alone(pipe):
    ref_before = [p.clone() for p in pipe.ref_model.parameters()]
    together = dpo.train_dpo_seeds(pipe, [5, 2, 9], beta=0.3, steps=4, config=CFG)
    assert [r.seed for r in together] == [5, 2, 9]
    for r in together:
        alone = dpo.train_dpo(pipe, beta=0.3, steps=4, seed=r.seed, config=CFG, progress=False)
        _same_run(r, alone)
    # different seeds are different runs, and the reference was not touched
    assert together[0].history[-1]["loss"] != together[1].history[-1]["loss"]
    assert all(torch.equal(a, b) for a, b in zip(ref_before, pipe.ref_model.parameters()))


def test_heldout_only_at_the_end(pipe):
    cfg = dpo.DPOConfig(**{**CFG.__dict__, "heldout_every_eval": False})
    res = dpo.train_dpo_seeds(pipe, [1], beta=0.3, steps=4, config=cfg)[0]
    full = dpo.train_dpo(pipe, beta=0.3, steps=4, seed=1, config=CFG, progress=False)
    assert [e["step"] for e in res.evals] == [0, 2, 4]
    assert all("heldout_accuracy" not in e for e in res.evals[:-1])
    assert res.evals[-1]["heldout_accuracy"] == full.evals[-1]["heldout_accuracy"]
    assert res.evals[1]["kl_exact_seq"] == full.evals[1]["kl_exact_seq"]   # the same policy either way
    # and the accuracy is that of the implicit rewards recomputed from scratch
    c, r = dpo.pair_logps(res.policy, dpo.encode_pairs(pipe.tokenizer, pipe.heldout_pairs))
    rc, rr = dpo.pair_logps(pipe.ref_model, dpo.encode_pairs(pipe.tokenizer, pipe.heldout_pairs))
    want = float(((c - rc) > (r - rr)).float().mean() + 0.5 * ((c - rc) == (r - rr)).float().mean())
    assert res.evals[-1]["heldout_accuracy"] == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(seeds=[]), "seeds: need at least one"),
    (dict(seeds=[1, 1]), "seeds: must be distinct"),
    (dict(seeds=[0.5]), "seeds: must be a sequence of integers"),
    (dict(seeds=[-1]), "seed: must be a non-negative"),
    (dict(seeds=[0], steps=0), "steps"),
    (dict(seeds=[0], beta=0.0), "beta"),
])
def test_dpo_seeds_bad_arguments(pipe, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dpo.train_dpo_seeds(pipe, **{"config": CFG, **kwargs})


def test_train_seed_results_returns_the_policies_of_train_seeds(pipe):
    cfg = ppo.PPOConfig(batch_size=8, minibatch_size=4, max_new_tokens=5, lr=3e-3)
    res = seeds.train_seed_results(pipe, [3, 4], steps=2, config=cfg)
    hist = seeds.train_seeds(pipe, [3, 4], steps=2, config=cfg)
    assert [r.seed for r in res] == [3, 4] and all(r.beta == 0.1 for r in res)
    drop = lambda row: {k: v for k, v in row.items() if k != "seconds"}
    for r, h in zip(res, hist):     # the same runs as train_seeds (timings aside)
        assert [drop(a) for a in r.history] == [drop(b) for b in h]
    # the returned policies moved away from pi_ref and differ between seeds
    p0, p1 = (list(r.policy.parameters()) for r in res)
    ref = list(pipe.ref_model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(p0, ref))
    assert any(not torch.equal(a, b) for a, b in zip(p0, p1))
    # the policy equals the one a plain train_ppo with the same settings ends with
    policy = pipe.new_policy()
    seeds.use_fused_gelu(policy)
    value = models.ScalarHeadModel.from_policy(pipe.sft_model)
    value.load_state_dict(pipe.reward_model.state_dict())
    seeds.use_fused_gelu(value)
    ref_m = seeds.use_fused_gelu(copy.deepcopy(pipe.ref_model))
    rm_m = seeds.use_fused_gelu(copy.deepcopy(pipe.reward_model))
    ppo.train_ppo(policy, ref_m, rm_m, value, pipe.tokenizer, pipe.prompts, iterations=2, beta=0.1,
                  config=cfg, seed=3, progress=False, sampler_cache=True, reuse_sample_logits=True)
    assert all(torch.equal(a, b) for a, b in zip(policy.parameters(), res[0].policy.parameters()))
