"""Project 2's outcome task: a student's own PPO-RLHF loop on the book's tiny GPT-2.

The student writes the whole loop (sampling with its masks, the reward model's score, the
per-token KL reward, masked GAE, the clipped PPO update with a value loss, the outer loop);
this module only hands out the pipeline's pieces and fixes what the grader reads back:

``load()``                   the RLHF chapters' pipeline (:func:`klbook_lib.rlhf.pipeline.build_pipeline`,
                             preset ``tiny``, seed 0, cached on disk): tokenizer, prompts, the SFT
                             policy ``pi_ref`` and the reward model;
``new_policy(pipe)``         a copy of ``pi_ref`` whose :data:`TRAINABLE` parameters (the last
                             block's MLP) require gradients, every other one frozen;
``new_value_model(pipe)``    a trainable copy of the reward model, to serve as the value model;
``encode_prompts``, ``logits``, ``head_values``  padding-aware plumbing of the library's models;
``trainable_arrays(policy)`` the tuned parameters, what a run returns;
:func:`package`              what the notebook's given ``train_project`` returns: the student's run
                             ``[params, history]``, the reference's fingerprint and the probe of the
                             student's per-token reward (:func:`reward_probe`).

Only the last block's MLP is tuned so that the grader can read the tuned policy back within the
size it accepts for one answer (about 132 thousand numbers of the policy's 0.5 million).

:func:`judge` scores one run in the grader's own process: it loads the returned parameters
into its own copy of ``pi_ref``, samples :data:`EVAL_SAMPLES` fresh responses from it and from
``pi_ref`` with its own sampler and measures (:func:`klbook_lib.rlhf.ppo.evaluate_policy`) the
reward model's mean score (a response without EOS scores :data:`MISSING_EOS_SCORE`) and the KL
``KL(pi_theta || pi_ref)`` per response, estimated by summing the exact per-token KL over the
whole vocabulary at every sampled prefix (an unbiased estimate of the sequence-level KL; its
standard error is the spread over responses / sqrt(n)). Credits of one run (they add up to 1):

* nothing unless the run is well formed and the student's ``per_token_rewards`` passes the probe;
* 0.5 *reward gained*: the mean score beats ``pi_ref``'s by at least :data:`REWARD_GAIN`;
* 0.5 *within the KL budget*: the KL is at most :data:`KL_BUDGET` nats per response, counted only
  for a run that gained at least half of :data:`REWARD_GAIN` (``pi_ref`` itself has KL 0).
"""
from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from klbook_lib.runtime import one_thread

PRESET, PIPELINE_SEED = "tiny", 0
#: The parameters PPO tunes (the last block's MLP); the rest of ``pi_ref`` stays frozen.
TRAINABLE = ("transformer.h.1.mlp.c_fc.weight", "transformer.h.1.mlp.c_fc.bias",
             "transformer.h.1.mlp.c_proj.weight", "transformer.h.1.mlp.c_proj.bias")
MAX_NEW_TOKENS = 16
BETA = 0.1                    # the KL coefficient of the graded runs
ITERATIONS = 20               # PPO iterations of a graded run
MISSING_EOS_SCORE = -2.0      # the score of a response that never emits EOS
SCORE_CLIP = 5.0
EVAL_SAMPLES = 512
HISTORY_COLUMNS = ("score", "kl")
#: What a graded run must reach (see the module docstring).
REWARD_GAIN = 0.3             # mean reward-model score above pi_ref's (the reference: 0.5 to 0.6)
KL_BUDGET = 4.0               # nats per response (the reference: 1.7 to 3; without the penalty 7 to 18)
PROBE_SEED = 2502
PROBE_RTOL = 1e-6


@functools.lru_cache(maxsize=1)
def load():
    """The tiny GPT-2 RLHF pipeline of chapters 6-9 (built once, then read from the disk cache).

    ``pipe.tokenizer``, ``pipe.prompts`` (the prompt texts), ``pipe.ref_model`` (``pi_ref``,
    frozen) and ``pipe.reward_model`` (a scalar-head GPT-2: one number per position)."""
    from transformers.utils import logging as hf_logging

    from klbook_lib.rlhf.pipeline import build_pipeline, code_version

    hf_logging.disable_progress_bar()
    # in the grader's sandbox: the grader's own copy of the cached pipeline (cache_entry), read-only
    data = os.environ.get("KLBOOK_TASK_DATA")
    entry = f"rlhf-{PRESET}-seed{PIPELINE_SEED}-{code_version()}"
    cache_dir = data if data and (Path(data) / entry / "meta.json").is_file() else None
    with one_thread():
        return build_pipeline(PRESET, seed=PIPELINE_SEED, device="cpu", progress=False, cache_dir=cache_dir)


def cache_entry() -> str:
    """The folder of the cached pipeline (built here if need be): the grader copies it into the
    sandbox of the training runs (``Question.task_data``), so that they need not build it again."""
    return str(load().cache_path)


def _named(model) -> dict:
    return dict(model.named_parameters())


def new_policy(pipe):
    """A copy of ``pi_ref`` to tune: the :data:`TRAINABLE` parameters require gradients, the others not."""
    policy = pipe.new_policy()
    params = _named(policy)
    for name, p in params.items():
        p.requires_grad_(name in TRAINABLE)
    return policy


def new_value_model(pipe):
    """A trainable copy of the reward model (a scalar head on GPT-2), to start the value model from."""
    import copy

    value = copy.deepcopy(pipe.reward_model)
    for p in value.parameters():
        p.requires_grad_(True)
    return value.train()


def encode_prompts(pipe, prompts) -> tuple[torch.Tensor, torch.Tensor]:
    """``bos + prompt`` of each prompt text, LEFT-padded: ``(input_ids [B, P], attention_mask [B, P])``."""
    from klbook_lib.rlhf.ppo import encode_prompts as _encode

    return _encode(pipe.tokenizer, list(prompts))


def logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Next-token logits ``[B, L, V]`` of a GPT-2 policy: ``logits[:, i]`` predicts token ``i + 1``.
    Positions count real tokens only, so padding on either side is fine (gradients flow)."""
    from klbook_lib.rlhf.models import lm_logits

    return lm_logits(model, input_ids, attention_mask).float()


def head_values(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The scalar head's output at every position, ``[B, L]``, of the reward model or the value
    model (gradients flow). Position ``i`` has read the tokens ``0..i``."""
    return model(input_ids, attention_mask).float()


def trainable_arrays(policy) -> list:
    """The :data:`TRAINABLE` parameters of a policy, as float64 arrays (what a run returns)."""
    params = _named(policy)
    return [params[name].detach().double().cpu().numpy() for name in TRAINABLE]


def fingerprint(pipe) -> float:
    """A number that identifies ``pi_ref``'s weights (the sum of their squares)."""
    return float(sum(float((p.detach().double() ** 2).sum()) for p in pipe.ref_model.parameters()))


def policy_from_arrays(pipe, arrays):
    """A copy of ``pi_ref`` with its :data:`TRAINABLE` parameters set to ``arrays``."""
    policy = pipe.new_policy()
    params = _named(policy)
    if not isinstance(arrays, (list, tuple)) or len(arrays) != len(TRAINABLE):
        raise ValueError(f"params: expected a list of {len(TRAINABLE)} arrays ({', '.join(TRAINABLE)})")
    with torch.no_grad():
        for name, value in zip(TRAINABLE, arrays):
            arr = np.asarray(value, dtype=np.float64)
            if arr.shape != tuple(params[name].shape):
                raise ValueError(f"params: {name} has shape {arr.shape}, expected {tuple(params[name].shape)}")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"params: {name} is not all finite")
            params[name].copy_(torch.as_tensor(arr, dtype=params[name].dtype))
    return policy.eval()


# ------------------------------------------------------------------ the probe of the reward
def reward_probe_inputs() -> tuple:
    """Fixed inputs ``(logprobs, ref_logprobs, scores, mask, beta)`` of 5 rows: right and left
    padding, junk on the pads, one row without a real token."""
    rng = np.random.default_rng(PROBE_SEED)
    B, N = 5, 7
    mask = np.zeros((B, N))
    mask[0, :7] = 1
    mask[1, :3] = 1
    mask[2, 2:] = 1
    mask[3, 1:5] = 1
    lp = np.where(mask > 0, rng.normal(-2, 1, (B, N)), rng.normal(0, 30, (B, N)))
    ref = np.where(mask > 0, rng.normal(-2, 1, (B, N)), rng.normal(0, 30, (B, N)))
    return lp, ref, rng.normal(0, 2, B), mask, 0.3


def reward_probe(per_token_rewards: Callable) -> np.ndarray:
    """``per_token_rewards`` on :func:`reward_probe_inputs` (torch tensors in, a [5, 7] array out)."""
    lp, ref, scores, mask, beta = (torch.as_tensor(x, dtype=torch.float64) if isinstance(x, np.ndarray) else x
                                   for x in reward_probe_inputs())
    out = per_token_rewards(lp, ref, scores, mask, beta)
    out = out.detach().cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)
    return np.asarray(out, dtype=np.float64)


def expected_reward_probe() -> np.ndarray:
    """What :func:`reward_probe` gives for a correct per-token reward (written here as a loop)."""
    lp, ref, scores, mask, beta = reward_probe_inputs()
    out = np.zeros(mask.shape)
    for b in range(mask.shape[0]):
        real = [t for t in range(mask.shape[1]) if mask[b, t] > 0]
        for t in real:
            out[b, t] = -beta * (lp[b, t] - ref[b, t])
        if real:
            out[b, real[-1]] += scores[b]
    return out


def package(run, per_token_rewards: Callable) -> list:
    """``run`` (the student's ``[params, history]``) plus the reference's fingerprint and
    :func:`reward_probe` of ``per_token_rewards``: what the grader receives from one training call."""
    if not isinstance(run, (list, tuple)) or len(run) != 2:
        raise ValueError("train_rlhf must return [params, history]")
    return [list(run[0]), run[1], np.array([fingerprint(load())]), reward_probe(per_token_rewards)]


# ------------------------------------------------------------------ the judge
@functools.lru_cache(maxsize=8)
def _reference_stats(eval_seed: int) -> tuple:
    from klbook_lib.rlhf.ppo import evaluate_policy

    pipe = load()
    with one_thread():
        stats, _ = evaluate_policy(pipe, pipe.ref_model, n=EVAL_SAMPLES, seed=eval_seed,
                                   max_new_tokens=MAX_NEW_TOKENS, missing_eos_score=MISSING_EOS_SCORE)
    return stats["score"], stats["score_se"], stats["true_reward"]


def measure(arrays, eval_seed: int) -> dict:
    """The grader's measurement of a tuned policy against ``pi_ref`` on ``EVAL_SAMPLES`` fresh
    responses each: score gain (with its standard error), exact-per-token KL per response (with
    its standard error), true-reward gain, EOS fraction."""
    from klbook_lib.rlhf.ppo import evaluate_policy

    pipe = load()
    policy = policy_from_arrays(pipe, arrays)
    base, base_se, base_true = _reference_stats(int(eval_seed))
    with one_thread():
        stats, _ = evaluate_policy(pipe, policy, n=EVAL_SAMPLES, seed=int(eval_seed),
                                   max_new_tokens=MAX_NEW_TOKENS, missing_eos_score=MISSING_EOS_SCORE)
    return {"gain": stats["score"] - base, "gain_se": math.hypot(stats["score_se"], base_se),
            "kl": stats["kl_exact_seq"], "kl_se": stats["kl_exact_seq_se"],
            "true_gain": stats["true_reward"] - base_true, "eos_fraction": stats["eos_fraction"]}


def judge(result, eval_seed: int) -> tuple[float, str]:
    """Score one run (the plain data :func:`package` returns): ``(credit in [0, 1], message)``."""
    try:
        params, history, info, probe = result
        history = np.asarray(history, dtype=np.float64)
        if history.ndim != 2 or history.shape[1] != len(HISTORY_COLUMNS) or len(history) < 1:
            raise ValueError(f"the history must have one row per iteration and the columns {HISTORY_COLUMNS}")
        m = measure(params, eval_seed)
    except (TypeError, ValueError, IndexError) as exc:
        return 0.0, f"not a training result [params, history, fingerprint, probe]: {exc}"
    want = expected_reward_probe()
    got = np.asarray(probe, dtype=np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=PROBE_RTOL, atol=1e-9):
        return 0.0, ("per_token_rewards does not give -beta * (log pi_theta - log pi_ref) on the response "
                     "tokens with the score on each row's last real token (the probe of the given "
                     "train_project); a run without a working per-token reward earns nothing")
    note = ""
    try:
        fp = float(np.asarray(info, dtype=np.float64).reshape(-1)[0])
        if not math.isclose(fp, fingerprint(load()), rel_tol=1e-6):
            note = "; note: the run's pi_ref differs from the grader's (was the pipeline built differently?)"
    except (TypeError, ValueError, IndexError):
        note = "; note: the run did not report its pi_ref"
    gained = m["gain"] >= REWARD_GAIN
    bounded = m["gain"] >= REWARD_GAIN / 2 and m["kl"] <= KL_BUDGET
    msg = (f"reward-model score {m['gain']:+.2f} +- {m['gain_se']:.2f} (s.e.) against pi_ref "
           f"(needs >= {REWARD_GAIN:g}), KL to pi_ref {m['kl']:.2f} +- {m['kl_se']:.2f} nats per response "
           f"(exact per-token KL summed over the sampled prefixes; needs <= {KL_BUDGET:g} with a gain of at "
           f"least {REWARD_GAIN / 2:g}), true reward {m['true_gain']:+.2f}, EOS in "
           f"{100 * m['eos_fraction']:.0f} % of {EVAL_SAMPLES} fresh responses{note}")
    return 0.5 * gained + 0.5 * bounded, msg
