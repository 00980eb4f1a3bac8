"""Tests of the GPT-2 model construction, offline loading, SFT and the reward model."""
import math

import pytest
import torch

from klbook_lib.rlhf import data, models
from klbook_lib.rlhf.reward_model import bradley_terry_loss, pairwise_accuracy, train_reward_model
from rlhf_helpers import micro_policy, small_tokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok():
    return small_tokenizer()


def test_presets_and_special_ids(tok):
    m = models.make_policy(tok, "tiny")
    c = m.config
    assert (c.n_layer, c.n_embd, c.n_head) == (2, 128, 4)
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert c.vocab_size == len(tok)
    for name, (L, D, H) in {"small": (6, 384, 6), "gpt2": (12, 768, 12)}.items():
        cfg = models.make_config(tok, name)
        assert (cfg.n_layer, cfg.n_embd, cfg.n_head) == (L, D, H)
    with pytest.raises(ValueError, match="preset"):
        models.make_policy(tok, "huge")


def test_make_policy_is_seeded(tok):
    a = models.make_policy(tok, "tiny", seed=1)
    b = models.make_policy(tok, "tiny", seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_load_policy_round_trip_offline(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    m = micro_policy(tok)
    m.save_pretrained(tmp_path / "policy")
    m2 = models.load_policy(tmp_path / "policy")
    ids, mask = models.encode_texts(tok, ["the food was good ."])
    assert torch.allclose(models.lm_logits(m, ids, mask), models.lm_logits(m2, ids, mask))
    with pytest.raises(ValueError, match="does not exist"):
        models.load_policy(tmp_path / "nothing")
    with pytest.raises(ValueError, match="never downloads"):
        models.load_policy("klbook-no-such-org/no-such-model")


def test_left_padding_gives_the_same_logits(tok):
    # position ids come from the mask: a left-padded row must match the same row unpadded
    m = micro_policy(tok)
    short = [tok.bos_token_id] + tok.encode("the food was", add_special_tokens=False)
    ids = torch.tensor([[tok.pad_token_id] * 3 + short])
    mask = torch.tensor([[0] * 3 + [1] * len(short)])
    padded = models.lm_logits(m, ids, mask)[0, 3:]
    plain = models.lm_logits(m, torch.tensor([short]), torch.ones(1, len(short), dtype=torch.long))[0]
    assert torch.allclose(padded, plain, atol=1e-5)


def test_sequence_nll_matches_categorical(tok):
    m = micro_policy(tok)
    texts = ["the food was good .", "i found the staff very rude and slow ."]
    ids, mask = models.encode_texts(tok, texts)
    nll, count = models.sequence_nll(m, ids, mask)
    for i, t in enumerate(texts):
        row = [tok.bos_token_id] + tok.encode(t, add_special_tokens=False) + [tok.eos_token_id]
        logits = m(torch.tensor([row])).logits[0, :-1]
        ref = -torch.distributions.Categorical(logits=logits).log_prob(torch.tensor(row[1:])).sum()
        assert nll[i].item() == pytest.approx(ref.item(), rel=1e-5)
        assert count[i].item() == len(row) - 1


def test_sft_lowers_the_loss(tok):
    texts = [r.text for r in data.make_corpus(500, seed=0)]
    m = micro_policy(tok)
    hist = models.train_sft(m, tok, texts, steps=40, batch_size=32, lr=1e-2, progress=False)
    start = sum(h["loss"] for h in hist[:3]) / 3
    end = sum(h["loss"] for h in hist[-5:]) / 5
    # untrained: about log(vocab) nats per token
    assert start == pytest.approx(math.log(len(tok)), abs=0.5)
    assert end < start - 2.0


def test_bradley_terry_loss_closed_form():
    d = torch.tensor([-2.0, 0.0, 3.0])
    expected = sum(math.log1p(math.exp(-x)) for x in d.tolist()) / 3
    assert bradley_terry_loss(d, torch.zeros(3)).item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="shapes differ"):
        bradley_terry_loss(torch.zeros(3), torch.zeros(2))


def test_reward_model_learns_the_preference(tok):
    pairs = data.make_preference_pairs(1400, seed=0)
    train, held = data.split_pairs(pairs, heldout_fraction=400 / 1400, seed=0)
    m = micro_policy(tok)
    rm, hist = train_reward_model(m, tok, train, held, steps=120, batch_size=32, lr=3e-3, progress=False)
    acc = pairwise_accuracy(rm, tok, held)
    # chance is 0.5; with 400 held-out pairs one standard error is at most 0.025,
    # so 0.65 is six standard errors above chance (the labels' own ceiling is about 0.83)
    assert acc > 0.65, acc
    assert hist[-1]["heldout_accuracy"] == pytest.approx(acc)
    # positive reviews score higher than negative ones on fresh text
    from klbook_lib.rlhf.reward_model import score_texts
    pos = [r.text for r in data.make_corpus(100, seed=11, sentiment_probs=(1, 0, 0))]
    neg = [r.text for r in data.make_corpus(100, seed=11, sentiment_probs=(0, 0, 1))]
    assert score_texts(rm, tok, pos).mean() > score_texts(rm, tok, neg).mean()


def test_scalar_head_save_load(tok, tmp_path):
    rm = models.ScalarHeadModel.from_policy(micro_policy(tok))
    rm.save(tmp_path / "rm")
    rm2 = models.ScalarHeadModel.load(tmp_path / "rm")
    ids, mask = models.encode_texts(tok, ["the bed was cold .", "the view was lovely and nice ."])
    assert torch.allclose(rm.score(ids, mask), rm2.score(ids, mask))
    # the score is read at the last real token (EOS), not at a pad
    assert torch.allclose(rm.score(ids, mask)[0], rm(ids[:1, :int(mask[0].sum())], mask[:1, :int(mask[0].sum())])[0, -1])
    with pytest.raises(ValueError, match="directory"):
        models.ScalarHeadModel.load(tmp_path / "none")


@pytest.mark.parametrize("kwargs, word", [
    (dict(steps=0), "steps"), (dict(lr=0.0), "lr"), (dict(texts=[]), "texts"),
])
def test_train_sft_bad_inputs(tok, kwargs, word):
    args = dict(model=micro_policy(tok), tokenizer=tok, texts=["the food was good ."], steps=1,
                batch_size=2, progress=False)
    args.update(kwargs)
    with pytest.raises(ValueError, match=word):
        models.train_sft(**args)
