"""The graded questions of ``ex05_kl_in_practice`` (chapter 5: KL in practice, the broken trainer).

Registered in :mod:`klbook_grader.hidden.bank`; the reference solutions are in
:mod:`klbook_grader.hidden.reference`.
"""
from __future__ import annotations

import functools

import numpy as np

from klbook_grader.hidden import reference as R
from klbook_grader.hidden.questions import Question, hid, outcome, pub, task, task_judge

EXERCISE = "ex05_kl_in_practice"
A = np.array


TOKEN_TRAINER_LIBRARY = ("klbook_lib.seqkl", "klbook_grader.tasks.token_trainer")

#: Phrases that name a bug of the broken trainer (question 5), as regular expressions (case
#: ignored). The release's audit refuses a Python file of the student edition whose docstrings
#: or comments contain one (``klbook_grader.release``): finding the bugs is the exercise.
BUG_NAMES = (r"stale\W+old\W+log", r"old\W+log-?probs?\W+(are\W+)?stale", r"score\W+on\W+a\W+pad",
             r"averag\w*\W+over\W+(the\W+)?positions", r"flipped\W+ratio",
             r"ratio\W+(is\W+)?flipped", r"(forgot|forgets|without|missing|drops?)\W+the\W+temperature")


@functools.lru_cache(maxsize=1)
def trainer_probes() -> tuple:
    """Hidden inputs for the parts of exercise 5's trainer, from the toy problem's responses."""
    from klbook_grader.tasks import token_trainer as tt

    rng = np.random.default_rng(5050)
    sp = tt.space()
    # responses of every length, as a batch the trainer would see (right-padded)
    lengths = sp.mask.sum(1).numpy()
    pools = [np.nonzero(lengths == n)[0] for n in (1, 2, 3, 4)]
    idx = np.concatenate([rng.choice(p, 2, replace=len(p) < 2) for p in pools])
    tokens, rows, mask = (sp.sequences[idx].numpy().astype(float), sp.prefix_index[idx].numpy().astype(float),
                          sp.mask[idx].numpy().astype(float))
    logits = rng.normal(0, 1.5, (sp.n_prefixes, sp.vocab_size))
    logp = np.where(mask > 0, -rng.uniform(0.1, 2.0, mask.shape), 0.0)
    ref_logp = np.where(mask > 0, -rng.uniform(0.1, 2.0, mask.shape), 0.0)
    new_logp = np.where(mask > 0, logp + rng.normal(0, 0.3, mask.shape), 0.0)
    adv = np.where(mask > 0, rng.normal(0, 1, mask.shape), 0.0)
    n = len(idx)
    return (
        hid("token_logprobs", logits, tokens, rows, mask, tt.TEMPERATURE, torch=True,
             probe="log-probabilities of sampled tokens"),
        hid("sequence_rewards", rng.normal(0, 1, n), logp, ref_logp, mask, tt.BETA, torch=True,
             probe="the KL term of the reward of responses of different lengths"),
        hid("place_on_last_token", rng.normal(0, 1, n), mask, torch=True,
             probe="where each response's reward is paid"),
        hid("ppo_loss", new_logp, logp, adv, mask, 0.2, torch=True,
             probe="the clipped surrogate of a policy that has moved"),
        task("train", 11, judge=task_judge("klbook_grader.tasks.token_trainer", "judge_trust_region"),
              probe="a training run: the clip acts and every update stays small"),
        task("train", 12, judge=task_judge("klbook_grader.tasks.token_trainer", "judge_objective"),
              probe="a training run: the objective it reaches"),
    )


def _trainer_reference(part, *args):
    if part == "train":
        return outcome()
    return R.trainer_part(part, *args)


def questions() -> list[Question]:
    rng = np.random.default_rng(505)
    diag = [
        pub(A([-1.0, -2.0]), A([-1.0, -2.0]), 0.2, why="no change"),
        pub(A([-0.9, -2.5, -1.0]), A([-1.0, -2.0, -1.3]), 0.2, why="a small update"),
    ]
    for s in (0.05, 0.3):
        old = rng.normal(-2, 0.5, 64)
        diag.append(hid(old + rng.normal(0, s, 64), old, 0.2))
    diag.append(hid(A([-0.1, -5.0, -3.0]), A([-3.0, -0.2, -3.0]), 0.1, probe="large log-ratios"))
    # ratios in the gaps: 1.21 and 1.215 exceed 1 + eps but not exp(eps) = 1.2214; 0.81 is above
    # 1 - eps but below exp(-eps) = 0.8187. Clipped by |r - 1|: 2 of 5; by |log r|: 1 of 5.
    gap = np.log(A([1.21, 1.215, 0.81, 0.95, 1.0]))
    diag.append(hid(gap - 1.0, np.full(5, -1.0), 0.2,
                     probe="ratios between 1 + eps and exp(eps), and between exp(-eps) and 1 - eps"))
    stop = [
        pub([0.001, 0.004, 0.02, 0.03], 0.01, why="stops after the third epoch"),
        pub([0.001, 0.002], 0.01, why="never stops early"),
        hid([0.0149, 0.0151], 0.01, probe="just above 1.5 x target"), hid([0.2, 0.1], 0.01),
        hid([], 0.01, probe="no epoch at all"),
        hid([0.01, 0.014, 0.016, 0.02, 0.05], 0.01),
    ]
    return [
        Question("q1", "A dashboard of KL statistics", "function", "kl_diagnostics", 4,
                 R.kl_diagnostics, tuple(diag), rtol=1e-6, atol=1e-10,
                 refused=("klbook_lib.estimators", "klbook_lib.monitor", "klbook_lib.diagnostics")),
        Question("q2", "Early stopping on KL", "function", "epochs_before_stop", 3,
                 R.epochs_before_stop, tuple(stop), rtol=0.0, atol=0.0),
        Question("q3", "A sudden KL jump", "choice", "answer_q3", 2, "A"),
        Question("q4", "A negative KL estimate", "choice", "answer_q4", 2, "D"),
        Question("q5", "Debug the broken trainer", "function", "run_probe", 12, _trainer_reference,
                 trainer_probes(), rtol=1e-6, atol=1e-9, timeout=20.0, library=TOKEN_TRAINER_LIBRARY,
                 public_checks=(dict(args=['train', 100], module="klbook_grader.tasks.token_trainer", judge="judge_trust_region", kwargs={}, why="a training run (seed 100): trust region"),
                                dict(args=['train', 100], module="klbook_grader.tasks.token_trainer", judge="judge_objective", kwargs={}, why="a training run (seed 100): objective"))),
    ]
