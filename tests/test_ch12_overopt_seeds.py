"""Chapter 12's many-seed PPO runs (klbook_lib.rlhf.overopt.rl_seed_histories) and its use of
the pipeline's own reward model as the largest proxy (train_proxy_reward_model)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from klbook_lib.rlhf import data, models, overopt as O, ppo, seeds
from rlhf_helpers import micro_policy, small_tokenizer

torch.set_num_threads(1)

CFG = ppo.PPOConfig(batch_size=16, minibatch_size=8, max_new_tokens=6, lr=3e-3)


def _pipeline(tmp_path):
    from klbook_lib.rlhf.pipeline import RLHFPipeline
    tok = small_tokenizer()
    policy = micro_policy(tok)
    rm = models.ScalarHeadModel.from_policy(policy)
    for p in rm.parameters():
        p.requires_grad_(False)
    entry = tmp_path / "rlhf-micro"
    entry.mkdir()
    return RLHFPipeline(preset="tiny", seed=0, device="cpu", tokenizer=tok, corpus=[],
                        prompts=data.all_prompts(), train_pairs=[], heldout_pairs=[],
                        sft_model=models.frozen_copy(policy), reward_model=rm, cache_path=str(entry))


def test_seed_histories_are_train_seeds_runs_and_are_cached(tmp_path):
    pipe = _pipeline(tmp_path)
    got = O.rl_seed_histories(pipe, "gold", 0.0, 2, [3, 5], config=CFG)
    assert len(got) == 2 and set(got[0]) == set(O.RL_KEYS) and all(len(h["score"]) == 2 for h in got)
    # the same numbers as seeds.train_seeds on the gold scorer, seed by seed
    gold_pipe = dataclasses.replace(pipe, reward_model=O.gold_reward_model(pipe.reward_model, pipe.tokenizer,
                                                                           pipe.prompts))
    for s, h in zip([3, 5], got):
        alone = seeds.train_seeds(gold_pipe, [s], beta=0.0, steps=2, config=CFG)[0]
        for k in O.RL_KEYS:
            assert h[k] == [float(row[k]) for row in alone], (s, k)
    # a second call reads the cache (the folder is not rebuilt), other settings run again
    before = sorted(p.name for p in (tmp_path).iterdir())
    assert O.rl_seed_histories(pipe, "gold", 0.0, 2, [3, 5], config=CFG) == got
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    other = O.rl_seed_histories(pipe, "gold", 0.5, 2, [3, 5], config=CFG)
    assert other != got


def test_seed_histories_input_errors(tmp_path):
    pipe = _pipeline(tmp_path)
    for kwargs, match in ((dict(seeds=[]), "seeds"), (dict(seeds=[1, 1]), "seeds"), (dict(seeds="01"), "seeds"),
                          (dict(seeds=[1.5]), "seeds"), (dict(beta=-0.1), "beta"), (dict(steps=0), "steps"),
                          (dict(proxy=0), "proxy")):
        args = dict(proxy="gold", beta=0.0, steps=1, seeds=[0]) | kwargs
        with pytest.raises(ValueError, match=match):
            O.rl_seed_histories(pipe, args["proxy"], args["beta"], args["steps"], args["seeds"], config=CFG)
    with pytest.raises(ValueError, match="config"):
        O.rl_seed_histories(pipe, "gold", 0.0, 1, [0], config=ppo.PPOConfig(reward_fn=lambda *a: None))


def test_the_largest_proxy_is_the_pipelines_reward_model():
    from klbook_lib.rlhf.pipeline import build_pipeline
    from klbook_lib.rlhf.models import encode_texts
    pipe = build_pipeline("tiny", seed=0)           # the shared, cached pipeline
    rm, info = O.train_proxy_reward_model(pipe, len(pipe.train_pairs))
    assert info["pipeline_reward_model"] and info["heldout_accuracy"] == pipe.metrics["rm_heldout_accuracy"]
    assert rm is not pipe.reward_model and not any(p.requires_grad for p in rm.parameters())
    ids, mask = encode_texts(pipe.tokenizer, ["the food was lovely .", "honestly the movie was bad"])
    torch.testing.assert_close(rm.score(ids, mask), pipe.reward_model.score(ids, mask))
    # other settings are a different proxy: trained, not the pipeline's (one step here, so it differs)
    rm1, info1 = O.train_proxy_reward_model(pipe, len(pipe.train_pairs), steps=1)
    assert "pipeline_reward_model" not in info1
    assert not torch.allclose(rm1.score(ids, mask), pipe.reward_model.score(ids, mask))
