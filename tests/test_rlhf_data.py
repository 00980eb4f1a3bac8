"""Tests of the generated review corpus, the true reward, preference pairs and the tokenizer."""
import math

import numpy as np
import pytest

from klbook_lib.rlhf import data
from klbook_lib.rlhf.tokenizer import load_tokenizer, train_tokenizer


def test_corpus_is_deterministic_from_seed():
    a = data.make_corpus(200, seed=3)
    b = data.make_corpus(200, seed=3)
    c = data.make_corpus(200, seed=4)
    assert a == b
    assert a != c
    assert all(r.text == r.prompt + r.response for r in a)
    assert all(r.prompt in data.all_prompts() for r in a)
    assert all(r.response.startswith(" ") and r.response.endswith(" .") for r in a)


def test_sentiment_attribute_controls_the_wording():
    # every review is drawn with one sentiment; its mean word score must follow it
    pos = data.make_corpus(300, seed=0, sentiment_probs=(1, 0, 0))
    neg = data.make_corpus(300, seed=0, sentiment_probs=(0, 0, 1))
    assert {r.sentiment for r in pos} == {"positive"}
    assert np.mean([data.sentiment_score(r.response) for r in pos]) > 0.4
    assert np.mean([data.sentiment_score(r.response) for r in neg]) < -0.4


def test_true_reward_by_hand():
    # " very good ." : intensifier 1.5 x 0.6, 3 words, no repeats, finished
    assert data.true_reward(" very good .") == pytest.approx(1.5 * 0.6)
    # mean of the adjectives, not the sum: 0.9 and -1.0 -> -0.05
    assert data.true_reward(" great but the food was terrible .") == pytest.approx((0.9 - 1.0) / 2)
    # 6 words, 4 distinct -> repetition fraction 1/3
    assert data.true_reward(" great , great and great .") == pytest.approx(0.9 - 1 / 3)
    # unfinished: no full stop
    assert data.true_reward(" good") == pytest.approx(0.6 - 1.0)
    # 15 distinct-ish words: 3 over the free length
    long = " nice a b c d e f g h i j k l m ."
    assert data.true_reward(long) == pytest.approx(0.5 - 0.1 * 3)
    assert data.true_reward("") == pytest.approx(-1.0)


def test_preference_labels_follow_bradley_terry():
    # P(label agrees with the higher true reward) = sigmoid(|delta| / T) per pair;
    # the observed agreement must match its expectation within 5 standard errors.
    T = 0.25
    pairs = data.make_preference_pairs(3000, seed=1, temperature=T)
    deltas = np.array([data.true_reward(p.chosen) - data.true_reward(p.rejected) for p in pairs])
    informative = deltas != 0
    p_agree = 1 / (1 + np.exp(-np.abs(deltas[informative]) / T))
    observed = np.mean(deltas[informative] > 0)
    se = math.sqrt(np.sum(p_agree * (1 - p_agree))) / informative.sum()
    assert abs(observed - p_agree.mean()) < 5 * se + 1e-12
    assert all(p.chosen != p.rejected for p in pairs)


def test_split_pairs():
    pairs = data.make_preference_pairs(100, seed=0)
    train, held = data.split_pairs(pairs, 0.2, seed=0)
    assert len(held) == 20 and len(train) == 80
    assert sorted(map(id, train + held)) == sorted(map(id, pairs))


@pytest.mark.parametrize("call, word", [
    (lambda: data.make_corpus(0), "n"),
    (lambda: data.make_corpus(10, seed=-1), "seed"),
    (lambda: data.make_corpus(10, sentiment_probs=(0.5, 0.5, 0.5)), "sentiment_probs"),
    (lambda: data.make_response(np.random.default_rng(0), "angry"), "sentiment"),
    (lambda: data.make_preference_pairs(10, temperature=0), "temperature"),
    (lambda: data.split_pairs([], 0.2), "pairs"),
    (lambda: data.split_pairs(data.make_preference_pairs(5), 1.5), "heldout_fraction"),
    (lambda: data.true_reward(None), "response"),
])
def test_bad_inputs_raise(call, word):
    with pytest.raises(ValueError, match=word):
        call()


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([r.text for r in data.make_corpus(1000, seed=0)])


def test_tokenizer_round_trip_and_specials(tok):
    texts = [r.text for r in data.make_corpus(200, seed=9)]
    for t in texts:
        assert tok.decode(tok.encode(t, add_special_tokens=False)) == t
    ids = {tok.bos_token_id, tok.eos_token_id, tok.pad_token_id}
    assert len(ids) == 3 and None not in ids
    # prompt and response tokenise independently: concatenating the pieces equals the whole
    r = data.make_corpus(1, seed=5)[0]
    assert (tok.encode(r.prompt, add_special_tokens=False) + tok.encode(r.response, add_special_tokens=False)
            == tok.encode(r.text, add_special_tokens=False))
    # byte-level: any text (unseen characters too) survives a round trip
    odd = "the café was ünusual ☕ !"
    assert tok.decode(tok.encode(odd, add_special_tokens=False)) == odd
    assert tok.padding_side == "left"


def test_tokenizer_save_load_offline(tok, tmp_path):
    tok.save_pretrained(tmp_path / "tok")
    tok2 = load_tokenizer(tmp_path / "tok")
    s = "the coffee was very lovely ."
    assert tok2.encode(s) == tok.encode(s)
    assert tok2.pad_token_id == tok.pad_token_id
    with pytest.raises(ValueError, match="name_or_path"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(ValueError, match="never downloads"):
        load_tokenizer("klbook-no-such-org/no-such-model")


def test_train_tokenizer_bad_inputs():
    with pytest.raises(ValueError, match="texts"):
        train_tokenizer([])
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["a b"], vocab_size=10)


def test_load_gpt2_tokenizer_is_offline_only(monkeypatch):
    # "gpt2" is loaded only from files already on this machine; otherwise a clear error, never a download
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    try:
        t = load_tokenizer("gpt2")
    except ValueError as err:
        assert "never downloads" in str(err) and "gpt2" in str(err)
    else:
        assert t.pad_token_id is not None and t.eos_token_id is not None
