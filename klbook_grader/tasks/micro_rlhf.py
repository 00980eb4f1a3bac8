"""Exercises 7 and 8's outcome tasks: RLHF and DPO on a micro GPT-2, in seconds on a CPU.

The RLHF chapters' pipeline (:mod:`klbook_lib.rlhf.pipeline`, the ``tiny`` preset) takes
about a minute to build; a graded run must take seconds. This module builds a smaller one
of the same kind, deterministically, in about two seconds:

* a **word-level tokenizer** (:class:`WordTokenizer`): the review corpus of
  :mod:`klbook_lib.rlhf.data` has under a hundred distinct words, so every word is a token;
* a **micro GPT-2** (2 layers, 32 dimensions, about 29 thousand parameters), trained by SFT
  on the generated reviews: the reference policy ``pi_ref``;
* the **true reward** (:func:`klbook_lib.rlhf.data.true_reward`) as the score
  (:class:`TrueRewardScorer`), instead of a learned reward model;
* the book's preference pairs (:func:`klbook_lib.rlhf.data.make_preference_pairs`).

:func:`build` returns it as a :class:`klbook_lib.rlhf.pipeline.RLHFPipeline`, so the book's
own loops run on it unchanged: :func:`klbook_lib.rlhf.ppo.train_ppo` with a student's
per-token reward and masked GAE (``PPOConfig.reward_fn`` / ``advantage_fn``, see
:func:`train_rlhf`) and :func:`klbook_lib.dpo.train_dpo` with a student's DPO loss
(``loss_fn``, see :func:`train_dpo`). Each driver returns the tuned policy's parameters as
one vector; :func:`judge_rlhf` and :func:`judge_dpo` load them into a policy and measure it
themselves: mean true reward and exact ``KL(pi_theta || pi_ref)`` of freshly sampled
responses, win rate against ``pi_ref``, implicit-reward accuracy on held-out pairs.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from klbook_lib.runtime import one_thread
from klbook_lib.rlhf import data as _data

# --- sizes and the settings of the graded runs --------------------------------------------------
MICRO = dict(n_layer=2, n_embd=32, n_head=2, n_positions=32)
SFT = dict(n_corpus=3000, steps=150, batch_size=64, lr=1e-2)
N_PAIRS = 2000
MAX_NEW_TOKENS = 12
RLHF_BETA = 0.3
RLHF_ITERATIONS = 30
DPO_BETA = 0.5
DPO_STEPS = 80
EVAL_SAMPLES = 256
PAD_JUNK, PAD_JUNK_SEED = 100.0, 7070
RLHF_HISTORY = ("true_reward", "kl_exact_seq", "k1_seq", "clipfrac", "approx_kl_k3")
DPO_HISTORY = ("loss", "reward_accuracy", "margin")


class WordTokenizer:
    """One token per word of the generated reviews, plus ``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2).

    The interface the book's RLHF code uses: ``encode(text, add_special_tokens=False)``,
    ``decode(ids)`` (special tokens dropped, a space before every word, as responses are
    written), ``len()``, and ``bos_token_id``, ``eos_token_id``, ``pad_token_id``. An unknown
    word raises ``ValueError``.
    """

    SPECIALS = ("<pad>", "<bos>", "<eos>")

    def __init__(self) -> None:
        words: set[str] = set()
        for opener in _data.OPENERS:
            words |= set(opener.format(n="").split())
        for template in _data.RESPONSE_TEMPLATES:
            words |= {w for w in template.split() if "{" not in w}
        words |= set(_data.NOUNS) | set(_data.WORD_SENTIMENT) | set(_data.ADVERBS)
        self.words = list(self.SPECIALS) + sorted(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 0, 1, 2

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        try:
            ids = [self.index[w] for w in text.split()]
        except KeyError as exc:
            raise ValueError(f"text: unknown word {exc.args[0]!r}") from None
        return ([self.bos_token_id] + ids + [self.eos_token_id]) if add_special_tokens else ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(" " + self.words[int(i)] for i in ids if int(i) >= len(self.SPECIALS))


class TrueRewardScorer(nn.Module):
    """Stands in for a reward model: ``score(input_ids, attention_mask)`` is the true reward
    (:func:`klbook_lib.rlhf.data.true_reward`) of each row's response, the words after its prompt."""

    def __init__(self, tokenizer: WordTokenizer) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.prompts = sorted((p.split() for p in _data.all_prompts()), key=len, reverse=True)

    def response_text(self, ids: Sequence[int], mask: Sequence[int]) -> str:
        words = self.tokenizer.decode([i for i, m in zip(ids, mask) if m]).split()
        for p in self.prompts:
            if words[:len(p)] == p:
                words = words[len(p):]
                break
        return "".join(" " + w for w in words)

    @torch.no_grad()
    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        rows = zip(input_ids.tolist(), attention_mask.tolist())
        return torch.tensor([_data.true_reward(self.response_text(i, m)) for i, m in rows],
                            dtype=torch.float64)


def micro_policy(tokenizer: WordTokenizer, seed: int = 0):
    """A freshly initialised micro ``GPT2LMHeadModel`` (no dropout: deterministic log-probs)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **MICRO)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config).eval()


@functools.lru_cache(maxsize=2)
def build(seed: int = 0):
    """The micro pipeline (an :class:`~klbook_lib.rlhf.pipeline.RLHFPipeline`), built in about two
    seconds and cached in memory; the same ``seed`` gives the same weights on the same machine."""
    from transformers.utils import logging as hf_logging

    from klbook_lib.rlhf.models import frozen_copy, train_sft
    from klbook_lib.rlhf.pipeline import RLHFPipeline

    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    hf_logging.disable_progress_bar()
    tok = WordTokenizer()
    corpus = _data.make_corpus(SFT["n_corpus"], seed=seed)
    with one_thread():
        policy = micro_policy(tok, seed)
        hist = train_sft(policy, tok, [r.text for r in corpus], steps=SFT["steps"],
                         batch_size=SFT["batch_size"], lr=SFT["lr"], seed=seed, progress=False)
    train_pairs, held_pairs = _data.split_pairs(_data.make_preference_pairs(N_PAIRS, seed=seed), seed=seed)
    return RLHFPipeline(preset="micro", seed=seed, device="cpu", tokenizer=tok, corpus=corpus,
                        prompts=_data.all_prompts(), train_pairs=train_pairs, heldout_pairs=held_pairs,
                        sft_model=frozen_copy(policy), reward_model=TrueRewardScorer(tok),
                        history={"sft": hist}, metrics={"n_params": sum(p.numel() for p in policy.parameters())})


def policy_vector(model) -> np.ndarray:
    """All parameters of a policy as one float64 vector."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().double().numpy()


def policy_from_vector(pipeline, vector):
    """A copy of ``pipeline``'s reference policy holding the parameters ``vector``."""
    policy = pipeline.new_policy()
    vec = torch.as_tensor(np.asarray(vector, dtype=np.float64)).reshape(-1)
    n = sum(p.numel() for p in policy.parameters())
    if vec.numel() != n:
        raise ValueError(f"vector: expected {n} parameters, got {vec.numel()}")
    if not bool(torch.isfinite(vec).all()):
        raise ValueError("vector: the parameters are not all finite")
    torch.nn.utils.vector_to_parameters(vec.float(), policy.parameters())
    return policy.eval()


# --------------------------------------------------------------------------- RLHF (exercise 7)
def _to_numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().cpu().numpy()


def _from_student(name: str, value, shape: tuple) -> torch.Tensor:
    arr = np.asarray(value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value,
                     dtype=np.float64)
    if arr.shape != shape:
        raise ValueError(f"{name} returned an array of shape {arr.shape}, expected {shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} returned NaN or infinite values")
    return torch.as_tensor(arr, dtype=torch.float32)


def rlhf_config(reward_fn: Callable | None = None, advantage_fn: Callable | None = None):
    """The PPO-RLHF configuration of the graded run (batch 64, two epochs, lr 3e-3, gamma 1,
    lambda 0.95), with the student's functions plugged in."""
    from klbook_lib.rlhf.ppo import PPOConfig

    return PPOConfig(batch_size=64, max_new_tokens=MAX_NEW_TOKENS, lr=3e-3, value_lr=3e-3,
                     minibatch_size=32, ppo_epochs=2, reward_fn=reward_fn, advantage_fn=advantage_fn)


def train_rlhf(per_token_rewards: Callable, masked_gae: Callable, seed: int = 0,
               iterations: int = RLHF_ITERATIONS, beta: float = RLHF_BETA) -> list:
    """PPO-RLHF of the micro GPT-2 with the student's reward and advantage functions.

    ``per_token_rewards(logprobs, ref_logprobs, scores, mask, beta)`` and
    ``masked_gae(rewards, values, mask, gamma, lam)`` take and return numpy arrays (exercise 7);
    ``masked_gae`` sees junk (normal, standard deviation :data:`PAD_JUNK`) in the rewards and
    values of padded positions, as a value head's outputs there would be, so a GAE that reads
    them does not train; the returns fed to the value loss are ``(advantages + values) * mask``. Returns
    ``[policy vector, history, [ref fingerprint]]``: the history has one row per iteration
    with the columns :data:`RLHF_HISTORY`, measured on that iteration's batch.
    """
    from klbook_lib.rlhf.models import ScalarHeadModel
    from klbook_lib.rlhf.ppo import train_ppo

    # fail fast (before building anything) if a function is a stub or returns the wrong shape
    mask = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    _from_student("per_token_rewards", per_token_rewards(-np.ones((2, 3)), -np.ones((2, 3)),
                                                         np.ones(2), mask, 0.1), (2, 3))
    _from_student("masked_gae", masked_gae(np.ones((2, 3)), np.zeros((2, 3)), mask, 1.0, 0.95), (2, 3))
    pipe = build(0)

    def reward_fn(logprobs, ref_logprobs, scores, mask, b):
        out = per_token_rewards(_to_numpy(logprobs), _to_numpy(ref_logprobs), _to_numpy(scores),
                                _to_numpy(mask), float(b))
        return _from_student("per_token_rewards", out, tuple(logprobs.shape))

    junk = np.random.default_rng(PAD_JUNK_SEED + seed)

    def advantage_fn(rewards, values, mask, gamma, lam):
        m = _to_numpy(mask) > 0
        # padded positions hold junk, as a value head's outputs there are: GAE must not read them
        r = np.where(m, _to_numpy(rewards), junk.normal(0, PAD_JUNK, m.shape))
        v = np.where(m, _to_numpy(values), junk.normal(0, PAD_JUNK, m.shape))
        adv = _from_student("masked_gae", masked_gae(r, v, m.astype(np.float64), float(gamma), float(lam)),
                            tuple(rewards.shape))
        return adv, (adv + values) * mask.float()

    with one_thread():
        policy = pipe.new_policy()
        torch.manual_seed(seed)                    # the value head's initialisation
        value = ScalarHeadModel.from_policy(pipe.ref_model)
        for p in value.parameters():
            p.requires_grad_(True)
        hist = train_ppo(policy, pipe.ref_model, pipe.reward_model, value, pipe.tokenizer, pipe.prompts,
                         iterations=iterations, beta=beta, config=rlhf_config(reward_fn, advantage_fn),
                         seed=seed, progress=False)
    history = np.array([[row[k] for k in RLHF_HISTORY] for row in hist], dtype=np.float64)
    return [policy_vector(policy), history, np.array([fingerprint(pipe)])]


def fingerprint(pipeline) -> float:
    """A number that identifies the reference policy's weights (their sum of squares)."""
    return float(policy_vector(pipeline.ref_model) @ policy_vector(pipeline.ref_model))


def measure_policy(pipeline, policy, n: int = EVAL_SAMPLES, seed: int = 0) -> dict:
    """Mean true reward and exact ``KL(pi || pi_ref)`` per response of ``n`` fresh samples (with
    their standard errors), the fraction that ends with EOS."""
    from klbook_lib.rlhf.ppo import evaluate_policy

    with one_thread():
        stats, _ = evaluate_policy(pipeline, policy, n=n, seed=seed, max_new_tokens=MAX_NEW_TOKENS)
    return {k: stats[k] for k in ("true_reward", "true_reward_se", "kl_exact_seq", "kl_exact_seq_se",
                                  "eos_fraction", "response_length")}


#: What a graded RLHF run must reach. The reference runs gain about 0.9 in true reward at a KL
#: of about 2 nats; the same run without the KL penalty reaches KL 5 to 8, and with the score
#: paid on the wrong token it gains nothing (tests/grader/test_tasks.py).
RLHF_REWARD_GAIN = 0.6      # mean true reward above pi_ref's
RLHF_MAX_KL = 3.5           # nats per response


def _vector_and_fingerprint(result, pipe) -> tuple[np.ndarray, str]:
    vec = np.asarray(result[0], dtype=np.float64)
    note = ""
    try:
        fp = float(np.asarray(result[2], dtype=np.float64).reshape(-1)[0])
        if not math.isclose(fp, fingerprint(pipe), rel_tol=1e-9):
            note = ("; note: the run's reference policy differs from the grader's (was the micro "
                    "pipeline built differently?)")
    except (TypeError, ValueError, IndexError):
        note = "; note: the run did not report its reference policy"
    return vec, note


def _returned_policy(result):
    """``(pipe, policy, note)`` for a run's returned ``[policy vector, history, info]``."""
    pipe = build(0)
    vec, note = _vector_and_fingerprint(result, pipe)
    return pipe, policy_from_vector(pipe, vec), note


def judge_rlhf(result, eval_seed: int) -> tuple[float, str]:
    """Score one RLHF run: ``(credit, message)``. The judge loads the returned policy and samples
    ``EVAL_SAMPLES`` responses itself. Half the credit: the mean true reward beats ``pi_ref``'s by
    at least :data:`RLHF_REWARD_GAIN`; the other half: the exact KL to ``pi_ref`` is at most
    :data:`RLHF_MAX_KL` nats per response, counted only with a gain of at least half that (an
    untrained policy has KL 0)."""
    try:
        pipe, policy, note = _returned_policy(result)
    except (TypeError, ValueError, IndexError) as exc:
        return 0.0, f"not a training result [policy, history, info]: {exc}"
    base = measure_policy(pipe, pipe.ref_model, seed=eval_seed)
    got = measure_policy(pipe, policy, seed=eval_seed)
    gain = got["true_reward"] - base["true_reward"]
    rose = gain >= RLHF_REWARD_GAIN
    bounded = gain >= RLHF_REWARD_GAIN / 2 and got["kl_exact_seq"] <= RLHF_MAX_KL
    msg = (f"mean true reward {got['true_reward']:.2f} against pi_ref's {base['true_reward']:.2f} "
           f"(gain {gain:.2f}; needs >= {RLHF_REWARD_GAIN:g}), exact KL to pi_ref "
           f"{got['kl_exact_seq']:.2f} nats per response (needs <= {RLHF_MAX_KL:g}, with a gain of at "
           f"least {RLHF_REWARD_GAIN / 2:g}), {EVAL_SAMPLES} samples{note}")
    return 0.5 * rose + 0.5 * bounded, msg


# --------------------------------------------------------------------------- DPO (exercise 8)
def train_dpo(dpo_loss: Callable, seed: int = 0, steps: int = DPO_STEPS, beta: float = DPO_BETA) -> list:
    """DPO of the micro GPT-2 on the book's preference pairs with the student's loss.

    ``dpo_loss(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta)`` gets torch tensors
    of sequence log-probabilities and returns the per-pair losses (exercise 8). Returns
    ``[policy vector, history, [ref fingerprint]]``, the history with the columns
    :data:`DPO_HISTORY`, one row per step.
    """
    from klbook_lib.dpo import DPOConfig
    from klbook_lib.dpo import train_dpo as _train_dpo

    probe = torch.tensor([-1.0, -2.0], requires_grad=True)           # fail fast on a stub
    out = dpo_loss(probe, probe.detach() - 1.0, torch.tensor([-1.5, -1.5]), torch.tensor([-2.0, -2.0]), beta)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        raise ValueError("dpo_loss must return a torch tensor that depends on the policy's log-probabilities")
    pipe = build(0)
    with one_thread():
        res = _train_dpo(pipe, beta=beta, steps=steps, seed=seed, config=DPOConfig(batch_size=64, lr=1e-3),
                         progress=False, evaluate=False, loss_fn=dpo_loss)
    history = np.array([[row[k] for k in DPO_HISTORY] for row in res.history], dtype=np.float64)
    return [policy_vector(res.policy), history, np.array([fingerprint(pipe)])]


#: What a graded DPO run must reach. The reference runs (beta 0.5, ten seeds) reach an accuracy
#: of 0.76 to 0.81, a win rate of 0.65 to 0.83 and a KL of 1.4 to 3 nats; with the margin's sign
#: flipped, 0.2 and 0.05. (With beta 0.3 a third of the runs drifted to a KL of 7 to 12 nats and
#: a win rate near one half: DPO's known drift away from the reference's text.)
DPO_MIN_ACCURACY = 0.7      # implicit-reward accuracy on the held-out pairs
DPO_MIN_WIN_RATE = 0.6      # samples preferred (true reward) to pi_ref's on the same prompts
DPO_MAX_KL = 6.0            # nats per response
WIN_SAMPLES = 512


@torch.no_grad()
def heldout_accuracy(pipeline, policy) -> float:
    """Fraction of held-out pairs whose chosen response has the larger implicit reward
    ``log pi(y|x) - log pi_ref(y|x)`` (ties count one half)."""
    from klbook_lib.dpo import implicit_reward_accuracy, pair_logps, encode_pairs

    batch = encode_pairs(pipeline.tokenizer, pipeline.heldout_pairs)
    with one_thread():
        pc, pr = pair_logps(policy, batch)
        rc, rr = pair_logps(pipeline.ref_model, batch)
    return implicit_reward_accuracy(pc - rc, pr - rr)


@torch.no_grad()
def win_rate(pipeline, policy, n: int = EVAL_SAMPLES, seed: int = 0) -> float:
    """How often a response of ``policy`` has a higher true reward than one of ``pi_ref`` to the
    same prompt (ties count one half), over ``n`` prompts drawn with ``seed``."""
    from klbook_lib.rlhf.ppo import sample_responses

    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(len(pipeline.prompts), (n,), generator=gen).tolist()
    prompts = [pipeline.prompts[i] for i in idx]
    with one_thread():
        a = sample_responses(policy, pipeline.tokenizer, prompts, MAX_NEW_TOKENS, 1.0, gen)
        b = sample_responses(pipeline.ref_model, pipeline.tokenizer, prompts, MAX_NEW_TOKENS, 1.0, gen)
    def reward(ro, i):  # noqa: E306 - unfinished responses score as the trainer scores them
        return _data.true_reward(ro.responses[i]) if bool(ro.has_eos[i]) else -2.0
    wins = [1.0 if reward(a, i) > reward(b, i) else 0.5 if reward(a, i) == reward(b, i) else 0.0
            for i in range(n)]
    return float(np.mean(wins))


def judge_dpo(result, eval_seed: int) -> tuple[float, str]:
    """Score one DPO run: ``(credit, message)``, measured here on the returned policy. One third of
    the credit each: held-out implicit-reward accuracy >= :data:`DPO_MIN_ACCURACY`; win rate
    against ``pi_ref`` >= :data:`DPO_MIN_WIN_RATE`; exact KL to ``pi_ref`` <=
    :data:`DPO_MAX_KL` nats per response (counted only with that win rate: ``pi_ref`` has KL 0)."""
    try:
        pipe, policy, note = _returned_policy(result)
    except (TypeError, ValueError, IndexError) as exc:
        return 0.0, f"not a training result [policy, history, info]: {exc}"
    acc = heldout_accuracy(pipe, policy)
    wr = win_rate(pipe, policy, n=WIN_SAMPLES, seed=eval_seed)
    kl = measure_policy(pipe, policy, seed=eval_seed)["kl_exact_seq"]
    ok = [acc >= DPO_MIN_ACCURACY, wr >= DPO_MIN_WIN_RATE, wr >= DPO_MIN_WIN_RATE and kl <= DPO_MAX_KL]
    msg = (f"held-out accuracy of the implicit reward {acc:.2f} (needs >= {DPO_MIN_ACCURACY:g}), "
           f"win rate against pi_ref {wr:.2f} (needs >= {DPO_MIN_WIN_RATE:g}), exact KL to pi_ref "
           f"{kl:.2f} nats per response (needs <= {DPO_MAX_KL:g}){note}")
    return sum(ok) / 3, msg
