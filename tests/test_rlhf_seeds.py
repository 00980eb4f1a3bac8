"""The KV-cached sampler against the uncached one, and many seeds in one process against
each seed alone (klbook_lib.rlhf.ppo.sample_responses, klbook_lib.rlhf.seeds)."""
from __future__ import annotations

import pytest
import torch

from klbook_lib.rlhf import data, models, ppo, seeds
from rlhf_helpers import micro_policy, small_tokenizer

torch.set_num_threads(1)

# prompts of different token lengths, so that the batch is left-padded
PROMPTS = ["the food was", "honestly, the service at this place was", "i", "the pizza",
           "we waited an hour and the soup", "great"]


@pytest.fixture(scope="module")
def tok():
    return small_tokenizer()


def _eos_biased(policy, eos: int, bias: float = 4.0):
    """Add ``bias`` to the EOS logit (a forward hook), so that rows end at different steps."""
    def hook(module, inputs, out):
        out = out.clone()
        out[..., eos] += bias
        return out
    policy.lm_head.register_forward_hook(hook)
    return policy


def _sample(policy, tok, prompts, seed, use_cache, n=12, temperature=1.0):
    return ppo.sample_responses(policy, tok, prompts, n, temperature,
                                torch.Generator().manual_seed(seed), use_cache=use_cache,
                                keep_logits=True)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_cached_sampler_draws_the_same_tokens_and_logits(tok, temperature):
    policy = _eos_biased(micro_policy(tok, seed=1), tok.eos_token_id)
    prompts = PROMPTS * 4
    for seed in range(3):
        a = _sample(policy, tok, prompts, seed, use_cache=False, temperature=temperature)
        b = _sample(policy, tok, prompts, seed, use_cache=True, temperature=temperature)
        # the batch is left-padded and the rows end at different steps (EOS handling tested)
        assert (a.attention_mask[:, :a.prompt_len] == 0).any()
        ends = a.response_mask.sum(1)
        assert bool(a.has_eos.any()) and len(set(ends.tolist())) > 2
        assert torch.equal(a.input_ids, b.input_ids)
        assert torch.equal(a.attention_mask, b.attention_mask)
        assert torch.equal(a.has_eos, b.has_eos) and a.responses == b.responses
        m = a.response_mask.bool()
        assert torch.allclose(a.logits[m], b.logits[m], atol=1e-5, rtol=0)
        # and both are the logits of one full (uncached) forward pass over the rollout, the
        # ones PPO computes for log pi_old; the log-probabilities of the drawn tokens agree
        full = ppo.response_logits(policy, a, temperature)
        assert torch.allclose(b.logits[m], full[m], atol=1e-5, rtol=0)
        lp_b = torch.log_softmax(b.logits, -1).gather(-1, b.response_ids[..., None])[..., 0]
        lp_f = torch.log_softmax(full, -1).gather(-1, a.response_ids[..., None])[..., 0]
        assert torch.allclose(lp_b[m], lp_f[m], atol=1e-5, rtol=0)
        # after EOS: pads with mask 0
        for i in range(len(prompts)):
            k = int(ends[i])
            assert bool((a.response_mask[i, k:] == 0).all())
            if a.has_eos[i]:
                assert int(a.response_ids[i, k - 1]) == tok.eos_token_id
                assert bool((a.response_ids[i, k:] == tok.pad_token_id).all())


def test_the_cache_is_what_makes_the_logits_agree(tok):
    # a cache fed the wrong positions (no left-pad correction) would give other logits:
    # the test above would catch it. Here: the cached sampler is not the uncached one run
    # on unpadded rows by accident (the padded row's logits depend on position ids).
    policy = micro_policy(tok, seed=2)
    ro = _sample(policy, tok, PROMPTS, 0, use_cache=True, n=4)
    ids, mask = ro.input_ids, ro.attention_mask
    wrong = policy(input_ids=ids, attention_mask=mask, use_cache=False).logits   # positions 0..T-1
    P = ro.prompt_len
    padded = (mask[:, :P] == 0).any(1)
    diff = (wrong[:, P - 1:-1] - ro.logits).abs().amax(dim=(1, 2))
    assert bool((diff[padded] > 1e-3).all()) and bool((diff[~padded] < 1e-5).all())


def _pipeline(tok):
    from klbook_lib.rlhf.pipeline import RLHFPipeline
    policy = _eos_biased(micro_policy(tok), tok.eos_token_id)   # responses that end
    rm = models.ScalarHeadModel.from_policy(policy)
    for p in rm.parameters():
        p.requires_grad_(False)
    return RLHFPipeline(preset="tiny", seed=0, device="cpu", tokenizer=tok, corpus=[],
                        prompts=data.all_prompts(), train_pairs=[], heldout_pairs=[],
                        sft_model=models.frozen_copy(policy), reward_model=rm)


CFG = ppo.PPOConfig(batch_size=16, minibatch_size=8, max_new_tokens=6, lr=3e-3)
KEYS = ("score", "true_reward", "kl_exact_seq", "k1_seq", "k3_seq", "entropy_seq",
        "response_length", "pg_loss", "vf_loss", "clipfrac", "approx_kl_k3")


def _train(pipe, seed, steps=3, **kw):
    policy = pipe.new_policy()
    value = models.ScalarHeadModel.from_policy(pipe.sft_model)
    value.load_state_dict(pipe.reward_model.state_dict())
    return ppo.train_ppo(policy, pipe.ref_model, pipe.reward_model, value, pipe.tokenizer,
                         pipe.prompts, iterations=steps, beta=0.1, config=CFG, seed=seed,
                         progress=False, **kw)


def test_training_with_and_without_the_sampler_cache_is_the_same_run(tok):
    pipe = _pipeline(tok)
    a = _train(pipe, seed=4, sampler_cache=False)
    b = _train(pipe, seed=4, sampler_cache=True)
    for ra, rb in zip(a, b):
        for k in KEYS:      # the same tokens, hence the same computation downstream
            assert ra[k] == rb[k], k


def test_reusing_the_sampler_logits_changes_only_rounding(tok):
    pipe = _pipeline(tok)
    a = _train(pipe, seed=5)
    b = _train(pipe, seed=5, reuse_sample_logits=True)
    for ra, rb in zip(a, b):
        for k in KEYS:
            assert rb[k] == pytest.approx(ra[k], rel=1e-4, abs=1e-5), k


def test_fused_gelu_is_gpt2_gelu_new(tok):
    from transformers.activations import GELUTanh, NewGELUActivation
    policy = micro_policy(tok, seed=3)
    fast = seeds.use_fused_gelu(micro_policy(tok, seed=3))
    assert any(isinstance(m, NewGELUActivation) for m in policy.modules())
    assert not any(isinstance(m, NewGELUActivation) for m in fast.modules())
    assert any(isinstance(m, GELUTanh) for m in fast.modules())
    x = torch.linspace(-6, 6, 1001)
    assert torch.allclose(GELUTanh()(x), NewGELUActivation()(x), atol=1e-6)
    ids, mask = ppo.encode_prompts(tok, PROMPTS)
    assert torch.allclose(models.lm_logits(policy, ids, mask), models.lm_logits(fast, ids, mask),
                          atol=1e-5)


def test_each_seed_of_a_multi_seed_run_is_that_seed_alone(tok):
    pipe = _pipeline(tok)
    ref_before = [p.clone() for p in pipe.ref_model.parameters()]
    together = seeds.train_seeds(pipe, [3, 7, 11], steps=3, config=CFG)
    assert len(together) == 3 and all(len(h) == 3 for h in together)
    alone = seeds.train_seeds(pipe, [7], steps=3, config=CFG)[0]
    for ra, rb in zip(together[1], alone):
        for k in KEYS:      # no shared state between seeds: identical numbers
            assert ra[k] == rb[k], k
    # and every seed agrees with the plain library run to float rounding
    for s, hist in zip([3, 7, 11], together):
        plain = ppo.run_rlhf(pipe, beta=0.1, steps=3, seed=s, config=CFG, progress=False).history
        for ra, rb in zip(plain, hist):
            for k in KEYS:
                assert rb[k] == pytest.approx(ra[k], rel=1e-4, abs=1e-5), (s, k)
    # the seeds are different runs, and the pipeline's models were not modified
    assert together[0][-1]["score"] != together[1][-1]["score"]
    assert any(row["eos_fraction"] > 0 for row in together[0])
    assert all(torch.equal(a, b) for a, b in zip(ref_before, pipe.ref_model.parameters()))
    from transformers.activations import NewGELUActivation
    assert any(isinstance(m, NewGELUActivation) for m in pipe.ref_model.modules())


def test_slow_path_is_the_code_as_before(tok):
    pipe = _pipeline(tok)
    slow = seeds.train_seeds(pipe, [2], steps=2, config=CFG, fast=False)[0]
    plain = ppo.run_rlhf(pipe, beta=0.1, steps=2, seed=2, config=CFG, progress=False).history
    for ra, rb in zip(plain, slow):
        for k in KEYS:
            assert ra[k] == rb[k], k


def test_seed_benchmark_reports_both_times_and_their_ratio(tok):
    out = seeds.seed_benchmark(n_seeds=2, iterations=1, pipeline=_pipeline(tok))
    assert out["n_seeds"] == 2 and out["iterations"] == 1 and out["threads"] >= 1
    assert out["seconds_sequential"] > 0 and out["seconds_batched"] > 0
    assert out["ratio"] == pytest.approx(out["seconds_sequential"] / out["seconds_batched"])
    assert out["max_abs_score_diff"] < 1e-4


@pytest.mark.parametrize("kwargs,match", [
    (dict(seeds=[]), "seeds: need at least one"),
    (dict(seeds=[1, 1]), "seeds: must be distinct"),
    (dict(seeds=[0.5]), "seeds: must be a sequence of integers"),
    (dict(seeds=[0], steps=0), "steps"),
    (dict(seeds=[0], prompts="the food"), "prompts"),
])
def test_bad_arguments(tok, kwargs, match):
    with pytest.raises(ValueError, match=match):
        seeds.train_seeds(_pipeline(tok), **kwargs)
    with pytest.raises(ValueError, match="n_seeds"):
        seeds.seed_benchmark(n_seeds=0, pipeline=object())
    with pytest.raises(ValueError, match="iterations"):
        seeds.seed_benchmark(iterations=0, pipeline=object())


def test_check_seeds_is_the_one_seed_list_check():
    import numpy as np
    import pytest

    from klbook_lib.rlhf.checks import check_seeds

    assert check_seeds(range(3)) == [0, 1, 2]
    assert check_seeds([np.int64(4), 5]) == [4, 5] and type(check_seeds([np.int64(4)])[0]) is int
    for bad, match in (([], "at least one"), ([1, 1], "distinct"), ([True, 2], "integers"),
                       ("01", "integers"), ([0.5], "integers"), (3, "integers")):
        with pytest.raises(ValueError, match=match):
            check_seeds(bad)
