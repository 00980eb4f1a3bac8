"""A generated review corpus with a controllable sentiment, and preference pairs.

Every text is one short review sentence built from templates, e.g.::

    the coffee was really lovely and the staff was friendly .

A review is a *prompt* (its opening, e.g. ``"the coffee was"``) followed by a
*response* (the rest, starting with a space). The response's wording is drawn with a
chosen sentiment ("positive", "neutral" or "negative"), which is the attribute the
RLHF chapters steer.

:func:`true_reward` is the hidden "true" preference: the sentiment of the words,
plus small penalties for length and repetition and for text that is not a finished
sentence. Preference pairs are labelled by sampling a Bradley-Terry model on the true
reward; the reward model only ever sees the labels, never ``true_reward`` itself, so
the book can compare what the reward model learned with what was meant.

Everything is generated from a seed: ship the generator, not a data dump.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SENTIMENTS = ("positive", "neutral", "negative")

NOUNS = (
    "food", "service", "movie", "hotel", "staff", "room", "pizza", "coffee", "book",
    "show", "music", "price", "view", "plot", "ending", "waiter", "menu", "bed",
    "screen", "phone",
)

# Each adjective's sentiment score in [-1, 1] (the hidden ground truth).
ADJECTIVES: dict[str, dict[str, float]] = {
    "positive": {
        "great": 0.9, "excellent": 1.0, "wonderful": 1.0, "lovely": 0.8, "amazing": 1.0,
        "good": 0.6, "nice": 0.5, "friendly": 0.6, "fresh": 0.5, "perfect": 1.0,
        "delightful": 0.9, "superb": 1.0, "pleasant": 0.5, "charming": 0.7, "tasty": 0.6,
    },
    "neutral": {
        "okay": 0.0, "average": 0.0, "fine": 0.1, "ordinary": -0.1, "plain": -0.1,
        "standard": 0.0, "acceptable": 0.1, "typical": 0.0, "simple": 0.0, "normal": 0.0,
    },
    "negative": {
        "terrible": -1.0, "awful": -1.0, "bad": -0.7, "boring": -0.6, "poor": -0.6,
        "cold": -0.4, "dirty": -0.8, "rude": -0.8, "slow": -0.4, "bland": -0.5,
        "disappointing": -0.8, "horrible": -1.0, "noisy": -0.4, "overpriced": -0.6,
        "stale": -0.6,
    },
}
WORD_SENTIMENT: dict[str, float] = {w: s for d in ADJECTIVES.values() for w, s in d.items()}

# Intensifiers multiply the sentiment of the adjective that follows them.
ADVERBS: dict[str, float] = {"very": 1.5, "really": 1.5, "quite": 1.2, "so": 1.5, "rather": 0.8}

OPENERS = ("the {n} was", "i found the {n}", "overall the {n} was", "honestly the {n} was")

# Response templates: {a} adjectives, {n} nouns, {v} optional adverb slot.
RESPONSE_TEMPLATES = (
    " {v}{a} .",
    " {v}{a} and the {n} was {a2} .",
    " {a} but the {n} was {v}{a2} .",
    " {a} , {a2} and {a3} .",
    " {v}{a} and {a2} .",
)

# Terms of the true reward.
LENGTH_FREE_WORDS = 12      # words beyond this many cost LENGTH_COST each
LENGTH_COST = 0.1
REPEAT_COST = 1.0           # times the fraction of repeated words
UNFINISHED_COST = 1.0       # a response that does not end with " ."


@dataclass(frozen=True)
class Review:
    """One generated review: ``text == prompt + response``."""

    prompt: str
    response: str
    sentiment: str

    @property
    def text(self) -> str:
        return self.prompt + self.response


@dataclass(frozen=True)
class PreferencePair:
    """Two responses to the same prompt; ``chosen`` was preferred by the labeller."""

    prompt: str
    chosen: str
    rejected: str


def _check_seed(seed: int) -> None:
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")


def make_prompt(rng: np.random.Generator) -> str:
    """A random review opening such as ``"the coffee was"``."""
    opener = OPENERS[rng.integers(len(OPENERS))]
    return opener.format(n=NOUNS[rng.integers(len(NOUNS))])


def all_prompts() -> list[str]:
    """Every distinct prompt the corpus can start with (openers x nouns), sorted."""
    return sorted(o.format(n=n) for o in OPENERS for n in NOUNS)


def _adjective(rng: np.random.Generator, sentiment: str) -> str:
    words = list(ADJECTIVES[sentiment])
    return words[rng.integers(len(words))]


def make_response(rng: np.random.Generator, sentiment: str) -> str:
    """A random response with the given sentiment, starting with a space and ending with ``" ."``.

    Most adjectives follow the requested sentiment; with probability 0.2 an adjective
    is drawn from another class so that sentences are mixed, as real reviews are.
    """
    if sentiment not in SENTIMENTS:
        raise ValueError(f"sentiment: must be one of {SENTIMENTS}, got {sentiment!r}")

    def adj() -> str:
        s = sentiment if rng.random() > 0.2 else SENTIMENTS[rng.integers(3)]
        return _adjective(rng, s)

    template = RESPONSE_TEMPLATES[rng.integers(len(RESPONSE_TEMPLATES))]
    adverbs = list(ADVERBS)
    v = adverbs[rng.integers(len(adverbs))] + " " if rng.random() < 0.4 else ""
    return template.format(a=adj(), a2=adj(), a3=adj(), v=v, n=NOUNS[rng.integers(len(NOUNS))])


def make_corpus(n: int = 5000, seed: int = 0,
                sentiment_probs: tuple[float, float, float] = (1 / 3, 1 / 3, 1 / 3)) -> list[Review]:
    """``n`` reviews, deterministic from ``seed``; sentiments drawn with ``sentiment_probs``."""
    _check_seed(seed)
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n: must be a positive integer, got {n!r}")
    p = np.asarray(sentiment_probs, dtype=float)
    if p.shape != (3,) or np.any(p < 0) or not math.isclose(p.sum(), 1.0, abs_tol=1e-9):
        raise ValueError(f"sentiment_probs: must be 3 non-negative numbers summing to 1, got {sentiment_probs!r}")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        s = SENTIMENTS[rng.choice(3, p=p)]
        out.append(Review(make_prompt(rng), make_response(rng, s), s))
    return out


def words(text: str) -> list[str]:
    """The whitespace-separated words of ``text``."""
    return text.split()


def sentiment_score(text: str) -> float:
    """Mean sentiment of the adjectives in ``text``, each scaled by a preceding intensifier.

    A text without any sentiment adjective scores 0. Because it is a mean, piling up
    more praise words does not raise it.
    """
    ws = words(text)
    scores = []
    for i, w in enumerate(ws):
        if w in WORD_SENTIMENT:
            mult = ADVERBS.get(ws[i - 1], 1.0) if i > 0 else 1.0
            scores.append(mult * WORD_SENTIMENT[w])
    return float(np.mean(scores)) if scores else 0.0


def repetition_fraction(text: str) -> float:
    """Fraction of words in ``text`` that repeat an earlier word (0 for an empty text)."""
    ws = words(text)
    if not ws:
        return 0.0
    return 1.0 - len(set(ws)) / len(ws)


def true_reward(response: str) -> float:
    """The hidden "true" reward of a response (the text after the prompt).

    ``sentiment_score`` (what the labeller likes), minus ``LENGTH_COST`` per word beyond
    ``LENGTH_FREE_WORDS``, minus ``REPEAT_COST`` times the fraction of repeated words,
    minus ``UNFINISHED_COST`` when the response does not end with a full stop.
    A response that stacks the same praise word many times therefore scores lower
    than a short sincere one: the gap a reward model can miss.
    """
    if not isinstance(response, str):
        raise ValueError(f"response: must be a string, got {type(response).__name__}")
    ws = words(response)
    r = sentiment_score(response)
    r -= LENGTH_COST * max(0, len(ws) - LENGTH_FREE_WORDS)
    r -= REPEAT_COST * repetition_fraction(response)
    if not ws or ws[-1] != ".":
        r -= UNFINISHED_COST
    return float(r)


def make_preference_pairs(n: int = 4000, seed: int = 0, temperature: float = 0.25) -> list[PreferencePair]:
    """``n`` labelled pairs: two responses to one prompt, the label drawn from a Bradley-Terry model.

    ``P(a preferred to b) = sigmoid((true_reward(a) - true_reward(b)) / temperature)``; a
    lower temperature is a less noisy labeller. Pairs whose responses are identical are
    redrawn. Deterministic from ``seed``.
    """
    _check_seed(seed)
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n: must be a positive integer, got {n!r}")
    if not temperature > 0:
        raise ValueError(f"temperature: must be positive, got {temperature!r}")
    rng = np.random.default_rng(seed + 1_000_003)
    pairs = []
    while len(pairs) < n:
        prompt = make_prompt(rng)
        a = make_response(rng, SENTIMENTS[rng.integers(3)])
        b = make_response(rng, SENTIMENTS[rng.integers(3)])
        if a == b:
            continue
        p_a = 1.0 / (1.0 + math.exp(-(true_reward(a) - true_reward(b)) / temperature))
        if rng.random() < p_a:
            pairs.append(PreferencePair(prompt, a, b))
        else:
            pairs.append(PreferencePair(prompt, b, a))
    return pairs


def split_pairs(pairs: list[PreferencePair], heldout_fraction: float = 0.2,
                seed: int = 0) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """Shuffle ``pairs`` with ``seed`` and split them into (train, held-out)."""
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction: must be in (0, 1), got {heldout_fraction!r}")
    if len(pairs) < 2:
        raise ValueError(f"pairs: need at least 2 pairs to split, got {len(pairs)}")
    idx = np.random.default_rng(seed).permutation(len(pairs))
    n_held = max(1, int(round(heldout_fraction * len(pairs))))
    held = [pairs[i] for i in idx[:n_held]]
    train = [pairs[i] for i in idx[n_held:]]
    return train, held
