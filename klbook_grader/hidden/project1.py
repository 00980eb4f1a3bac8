"""The graded questions of ``project1_ppo_kl`` (project 1, classic RL: a KL-penalty PPO from scratch).

The student writes the pieces (GAE, advantage normalisation, the clipped and KL-penalised loss,
the adaptive-beta rule) and the training loop on :class:`klbook_lib.envs.CartPole`. Each piece is
probed on hidden cases against the references below, written independently of the master (plain
Python loops and numpy); the training loop is graded on its outcome by
:func:`klbook_grader.tasks.ppo_kl_project.judge`, which re-runs nothing the notebook reports without
checking it (it plays the returned actor itself and recomputes the last update's KL). The report
cell (:data:`REPORT`) is graded by hand: ``klbook grade DIR --csv`` exports it as an ungraded row.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden.questions import Question, hid, outcome, pub, task, task_judge

EXERCISE = "project1_ppo_kl"
A = np.array
# the markdown cell tagged "report": graded by hand, exported by the batch CSV as its own row
REPORT = {"tag": "report", "placeholder": "Write your report here."}

CELLS_LIBRARY = ("klbook_lib.envs", "klbook_grader.tasks.ppo_kl_project")
TASK = "klbook_grader.tasks.ppo_kl_project"


def gae_reference(rewards, values, next_values, terminated, dones, gamma, lam) -> np.ndarray:
    """GAE by a slow double loop: for each (t, n), sum_{k >= 0} (gamma lam)^k delta_{t+k} until an end.

    ``delta_t = r_t + gamma (1 - terminated_t) V(s_{t+1}) - V(s_t)``; the sum stops after the first
    step ``t + k`` that ends an episode (``dones``), and at the rollout's last step.
    """
    r, v, nv = (np.asarray(x, dtype=float) for x in (rewards, values, next_values))
    term, done = np.asarray(terminated, dtype=float), np.asarray(dones, dtype=float)
    T, N = r.shape
    out = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            total, weight = 0.0, 1.0
            for k in range(t, T):
                delta = r[k, n] + gamma * (1.0 - term[k, n]) * nv[k, n] - v[k, n]
                total += weight * delta
                if done[k, n]:
                    break
                weight *= gamma * lam
            out[t, n] = total
    return out


def normalize_reference(advantages) -> np.ndarray:
    a = np.asarray(advantages, dtype=float)
    return (a - a.mean()) / (a.std(ddof=1) + 1e-8)


def loss_reference(logits_new, logits_old, actions, advantages, beta, eps) -> float:
    """The clipped surrogate loss plus beta times the exact mean KL(pi_old || pi_theta), in numpy."""
    def log_softmax(z):
        z = np.asarray(z, dtype=float)
        m = z.max(-1, keepdims=True)
        return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))
    lp_new, lp_old = log_softmax(logits_new), log_softmax(logits_old)
    idx = np.asarray(actions).astype(int)
    rows = np.arange(len(idx))
    r = np.exp(lp_new[rows, idx] - lp_old[rows, idx])
    adv = np.asarray(advantages, dtype=float)
    surrogate = np.minimum(r * adv, np.clip(r, 1 - eps, 1 + eps) * adv)
    kl = (np.exp(lp_old) * (lp_old - lp_new)).sum(-1)
    return float(-surrogate.mean() + beta * kl.mean())


def beta_reference(beta: float, kl: float, kl_target: float) -> float:
    if kl < kl_target / 1.5:
        return beta / 2
    if kl > 1.5 * kl_target:
        return 2 * beta
    return beta


def _rollout(rng, T, N, p_term, p_trunc):
    r = rng.normal(1.0, 0.5, (T, N))
    v = rng.normal(0, 2, (T, N))
    term = (rng.random((T, N)) < p_term).astype(float)
    trunc = ((rng.random((T, N)) < p_trunc) & (term == 0)).astype(float)
    nv = np.concatenate([v[1:], rng.normal(0, 2, (1, N))])
    nv = np.where((term + trunc) > 0, rng.normal(0, 2, (T, N)), nv)   # V(final obs) where it ended
    return r, v, nv, term, term + trunc


def questions() -> list[Question]:
    rng = np.random.default_rng(2501)
    z = np.zeros((3, 1))
    gae = [
        pub(A([[1.0], [1.0], [1.0]]), A([[0.5], [0.4], [0.3]]), A([[0.4], [0.3], [0.2]]), z, z, 0.9, 0.8,
            why="one copy, no episode ends", torch=True),
        pub(A([[1.0], [1.0], [1.0]]), A([[0.5], [0.4], [0.3]]), A([[0.4], [0.0], [0.2]]), A([[0.0], [1.0], [0.0]]),
            A([[0.0], [1.0], [0.0]]), 0.9, 0.8, why="the pole falls at step 1: no bootstrap, the sum stops",
            torch=True, core=True),
        hid(*_rollout(rng, 8, 4, 0.0, 0.0), 0.99, 0.95, torch=True, probe="no episode ends"),
        hid(*_rollout(rng, 12, 6, 0.2, 0.0), 0.99, 0.9, torch=True, core=True,
            probe="terminations in the middle of the rollout (the dones)"),
        hid(*_rollout(rng, 12, 6, 0.0, 0.2), 0.99, 0.9, torch=True, core=True,
            probe="truncations: the value of the final observation bootstraps, but the sum stops"),
        hid(*_rollout(rng, 16, 5, 0.15, 0.15), 0.97, 0.9, torch=True, core=True,
            probe="terminations and truncations, several per copy"),
        hid(*_rollout(rng, 6, 3, 0.3, 0.0), 0.99, 0.0, torch=True, probe="lambda = 0: one-step TD errors"),
        hid(*_rollout(rng, 6, 3, 0.0, 0.0), 1.0, 1.0, torch=True, probe="gamma = lambda = 1"),
    ]
    norm = [
        pub(A([1.0, 2.0, 3.0, 4.0]), why="four advantages", torch=True, core=True),
        hid(rng.normal(5.0, 3.0, 64), torch=True, core=True, probe="a batch with a large mean"),
        hid(rng.normal(0.0, 0.01, 256), torch=True, probe="a batch with a small spread"),
        hid(A([2.0, 2.0, 2.0, 2.0 + 1e-6]), torch=True, probe="nearly equal advantages (the 1e-8)"),
    ]

    def _batch(n, k, s_new):
        old = rng.normal(0, 1, (n, k))
        return old + rng.normal(0, s_new, (n, k)), old, rng.integers(0, k, n).astype(float), rng.normal(0, 1, n)
    loss = [
        pub(A([[0.0, 0.0], [1.0, -1.0]]), A([[0.0, 0.0], [1.0, -1.0]]), A([0.0, 1.0]), A([1.0, -2.0]), 0.5, 0.2,
            why="pi_theta = pi_old: ratio 1, KL 0", torch=True),
        pub(A([[0.3, 0.0], [0.0, 0.2]]), A([[0.0, 0.0], [0.0, 0.0]]), A([0.0, 1.0]), A([1.0, -1.0]), 1.0, 0.2,
            why="a small step", torch=True),
        hid(*_batch(16, 2, 0.05), 1.0, 0.2, torch=True),
        hid(*_batch(32, 2, 0.8), 0.1, 0.2, torch=True, probe="a policy beyond the clip range (the clip and the min)"),
        hid(A([[2.0, -1.0], [0.0, 3.0]]), A([[0.0, 0.0], [0.0, 0.0]]), A([0.0, 1.0]), A([0.0, 0.0]), 2.0, 0.2,
            torch=True, core=True, probe="zero advantages: only the KL term, whose direction matters"),
        hid(*_batch(64, 2, 0.3), 0.7, 0.3, torch=True, core=True, probe="a mean over states, not a sum"),
    ]
    beta = [
        pub(1.0, 0.05, 0.01, why="KL far above target", core=True),
        pub(1.0, 0.001, 0.01, why="KL far below target", core=True),
        pub(0.5, 0.012, 0.01, why="KL near target"),
        hid(0.3, 0.0149, 0.01, probe="just inside the band"), hid(0.3, 0.0151, 0.01, probe="just above the band"),
        hid(0.3, 0.0068, 0.01, probe="just inside the band"), hid(0.3, 0.0066, 0.01, probe="just below the band"),
        hid(0.3, 0.02, 0.02, probe="another target: KL on it", core=True),
        hid(0.3, 0.029, 0.02, probe="another target: just inside its band", core=True),
        hid(0.3, 0.012, 0.02, probe="another target: just below its band", core=True),
        hid(0.3, 0.0014, 0.002, probe="another target: just inside its band", core=True),
    ]
    runs = [(11, 0.01), (12, 0.005), (13, 0.005), (14, 0.005)]   # a target written in fails three
    train = [task(s, t, judge=task_judge(TASK, "judge", eval_seed=910_000 + s, kl_target=t),
                  probe="a training run on a seed and KL target of the grader's") for s, t in runs]
    return [
        Question("q1", "Generalised advantage estimation with episode ends", "function", "compute_gae", 4,
                 gae_reference, tuple(gae), rtol=1e-6, atol=1e-9, library=CELLS_LIBRARY),
        Question("q2", "Normalised advantages", "function", "normalize_advantages", 1,
                 normalize_reference, tuple(norm), rtol=1e-5, atol=1e-8),
        Question("q3", "The clipped and KL-penalised loss", "function", "ppo_kl_loss", 3,
                 loss_reference, tuple(loss), rtol=1e-6, atol=1e-10),
        Question("q4", "The adaptive KL coefficient", "function", "adaptive_beta", 2,
                 beta_reference, tuple(beta)),
        Question("q5", "A truncated episode in the rollout", "choice", "answer_q5", 1, "C"),
        Question("q6", "Train your PPO on the grader's seeds", "function", "train_project", 10,
                 outcome, tuple(train), timeout=90.0, library=CELLS_LIBRARY, full_marks_at=3,
                 refused=("klbook_lib.ppo",),
                 public_checks=(dict(args=[100, 0.01], module=TASK, judge="judge",
                                     kwargs={"eval_seed": 7, "kl_target": 0.01},
                                     why="training seed 100, target 0.01"),)),
    ]
