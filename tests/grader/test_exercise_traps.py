"""The classic wrong answers lose their points, fake outcomes earn nothing, and the
reference solutions of the outcome tasks pass on more seeds than the grader uses.

1. **Classic wrong answers** (issue 14, item 4): each is written as a variant of a master
   notebook's function and graded by the real grader, in its sandbox. The test checks that
   the question loses points, that the failing hidden case names what it probes, and that
   the other questions keep theirs. The outcome drivers are stubbed in these notebooks (they
   are graded in the other tests), so each grading takes a few seconds.
2. **Fake outcomes** (one per task type): a notebook whose driver returns fabricated data (an
   untrained policy with a history that claims success, a run that never moves, NaNs)
   scores 0 on the outcome cases: the judges run the returned policy themselves.
3. **Seeds** (slow): the reference solutions, taken from the masters, are trained on more seeds
   than the grader uses; every run must earn its credit (the grader also gives full marks at
   3 of 4 seeds). The broken trainer's single bugs are shown to fail the checks they should.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from klbook_grader import student
from klbook_grader.grader import grade

from grading_helpers import replace_function

REPO = Path(__file__).resolve().parents[2]
MASTERS = REPO / "exercises" / "masters"
STUBS = {"train_cartpole": "seed", "train_rlhf": "seed", "train_dpo": "seed", "run_probe": "part, *args"}


def master_cells(exercise: str) -> list[str]:
    nb = nbformat.read(MASTERS / f"{exercise}.ipynb", as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def quick(cells: list[str]) -> list[str]:
    """Without check() cells, the dashboard, and with the outcome drivers stubbed."""
    out = []
    for src in cells:
        if src.startswith("check(") or "tt.dashboard" in src:
            continue
        for name, args in STUBS.items():
            if f"def {name}(" in src:
                head = src[: src.index(f"def {name}(")]
                src = head + f"def {name}({args}):\n    raise NotImplementedError\n"
        out.append(src)
    return out


def grade_cells(tmp_path: Path, exercise: str, cells: list[str]) -> dict:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{exercise}.ipynb"
    nbformat.write(nb, path)
    return grade(path)


def question(result: dict, qid: str) -> dict:
    return next(q for q in result["questions"] if q["id"] == qid)


def assert_trap(result: dict, qid: str, probe: str) -> None:
    q = question(result, qid)
    assert q["points"] < q["max_points"], q
    failing = [m for m in q["messages"][1:] if f"probes: {probe}" in m]
    assert failing, (probe, q["messages"])


# ---------------------------------------------------------------- 1. classic wrong answers
EX03_TRAPS = {
    "ppo_clip_objective": '''def ppo_clip_objective(ratio, advantages, eps):
    return np.asarray(ratio, float) * np.asarray(advantages, float)      # forgot the clip
''',
    "kl_penalty_loss": '''def kl_penalty_loss(logits_new, logits_old, actions, advantages, beta, eps):
    logp_new, logp_old = torch.log_softmax(logits_new, -1), torch.log_softmax(logits_old, -1)
    a = actions.long().unsqueeze(-1)
    ratio = torch.exp(logp_new.gather(-1, a).squeeze(-1) - logp_old.gather(-1, a).squeeze(-1))
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages)
    kl = (logp_new.exp() * (logp_new - logp_old)).sum(-1)        # KL(pi_theta || pi_old): wrong way round
    return -surrogate.mean() + beta * kl.mean()
''',
    "kl_hessian": '''def kl_hessian(logits):
    p = np.exp(np.asarray(logits, float))                        # overflows for large logits
    p = p / p.sum()
    return np.diag(p) - np.outer(p, p)
''',
}


def test_ex03_classic_mistakes_lose_their_points(tmp_path):
    cells = quick(master_cells("ex03_trpo_ppo"))
    for name, body in EX03_TRAPS.items():
        cells = replace_function(cells, name, body)
    r = grade_cells(tmp_path, "ex03_trpo_ppo", cells)
    assert_trap(r, "q3", "ratios outside the clip range, both signs of the advantage (the clip and the min)")
    assert_trap(r, "q7", "zero advantages: only the KL term, whose direction matters")
    assert_trap(r, "q6", "logits of size 1000: exp overflows")
    for qid in ("q1", "q2", "q4", "q5"):
        assert question(r, qid)["points"] == question(r, qid)["max_points"]


def test_ex03_forgetting_the_clip_in_the_loss(tmp_path):
    body = '''def kl_penalty_loss(logits_new, logits_old, actions, advantages, beta, eps):
    logp_new, logp_old = torch.log_softmax(logits_new, -1), torch.log_softmax(logits_old, -1)
    a = actions.long().unsqueeze(-1)
    ratio = torch.exp(logp_new.gather(-1, a).squeeze(-1) - logp_old.gather(-1, a).squeeze(-1))
    kl = (logp_old.exp() * (logp_old - logp_new)).sum(-1)
    return -(ratio * advantages).mean() + beta * kl.mean()          # no clip
'''
    cells = replace_function(quick(master_cells("ex03_trpo_ppo")), "kl_penalty_loss", body)
    r = grade_cells(tmp_path, "ex03_trpo_ppo", cells)
    assert_trap(r, "q7", "a policy that moved beyond the clip range (the clip and the min)")


def test_ex04_naive_k3_weight_overflows(tmp_path):
    body = '''def kl_gradients(logits, ref_logits):
    z, z_ref = np.asarray(logits, float), np.asarray(ref_logits, float)
    log_p = z - z.max() - np.log(np.sum(np.exp(z - z.max())))
    log_q = z_ref - z_ref.max() - np.log(np.sum(np.exp(z_ref - z_ref.max())))
    p, q = np.exp(log_p), np.exp(log_q)
    l = log_p - log_q
    k3 = np.exp(-l) - 1 + l                       # rho overflows where p is tiny
    costs = [l, l**2 / 2, k3]
    rows = [p * c - p * np.sum(p * c) for c in costs]
    return np.array(rows + [np.zeros_like(p), p * l - p * np.sum(p * l), p - q])
'''
    r = grade_cells(tmp_path, "ex04_estimating_kl", replace_function(quick(master_cells("ex04_estimating_kl")),
                                                                     "kl_gradients", body))
    assert_trap(r, "q6", "logits of size 1000: exp overflows")
    assert question(r, "q6")["points"] > 0          # the ordinary cases still pass: partial credit


def test_ex05_clip_fraction_by_log_ratio(tmp_path):
    body = '''def kl_diagnostics(logp_new, logp_old, clip_eps):
    log_ratio = np.asarray(logp_new, float) - np.asarray(logp_old, float)
    ratio = np.exp(log_ratio)
    return np.array([np.mean(-log_ratio), np.mean((ratio - 1) - log_ratio),
                     np.mean(np.abs(log_ratio) > clip_eps)])          # |log r| instead of |r - 1|
'''
    r = grade_cells(tmp_path, "ex05_kl_in_practice",
                    replace_function(quick(master_cells("ex05_kl_in_practice")), "kl_diagnostics", body))
    assert_trap(r, "q1", "ratios between 1 + eps and exp(eps), and between exp(-eps) and 1 - eps")
    assert question(r, "q2")["points"] == question(r, "q2")["max_points"]


EX07_TRAPS = {
    "per_token_rewards": '''def per_token_rewards(logprobs, ref_logprobs, scores, mask, beta):
    mask = np.asarray(mask, float)
    rewards = -beta * (np.asarray(logprobs, float) - np.asarray(ref_logprobs, float)) * mask
    lengths = mask.sum(axis=1).astype(int)
    for i, n in enumerate(lengths):
        rewards[i, n - 1] += scores[i]            # assumes right padding and a real token
    return rewards
''',
    "gae": '''def gae(rewards, values, gamma, lam):
    rewards, values = np.asarray(rewards, float), np.asarray(values, float)
    deltas = rewards + gamma * np.append(values[1:], 0.0) - values
    adv, running = np.zeros_like(deltas), 0.0
    for t in reversed(range(len(deltas))):
        running = deltas[t] + lam * running       # forgot gamma in the recursion
        adv[t] = running
    return adv
''',
    "masked_gae": '''def masked_gae(rewards, values, mask, gamma, lam):
    rewards, values = np.asarray(rewards, float), np.asarray(values, float)
    mask = np.asarray(mask, float)
    out = np.zeros(rewards.shape)
    for i in range(rewards.shape[0]):
        deltas = rewards[i] + gamma * np.append(values[i, 1:], 0.0) - values[i]   # reads the pads
        running = 0.0
        for t in reversed(range(rewards.shape[1])):
            running = deltas[t] + gamma * lam * running
            out[i, t] = running
    return out * mask
''',
}


def test_ex07_classic_mistakes_lose_their_points(tmp_path):
    cells = quick(master_cells("ex07_token_level_kl"))
    for name, body in EX07_TRAPS.items():
        cells = replace_function(cells, name, body)
    r = grade_cells(tmp_path, "ex07_token_level_kl", cells)
    for probe in ("-inf log-probabilities on padded positions",
                  "left-padded rows: the last real token comes from the mask",
                  "a fully padded row (no response token)"):
        assert_trap(r, "q1", probe)
    assert_trap(r, "q2", "gamma < 1 on a long sequence")
    assert_trap(r, "q5", "junk rewards and values on padded positions")
    # masked_gae uses the wrong gae only through its own loop: q5's long sequences still pass here
    assert question(r, "q3")["points"] == question(r, "q3")["max_points"]


def test_ex08_naive_log_sigmoid_and_softmax(tmp_path):
    cells = quick(master_cells("ex08_vi_elbo_dpo"))
    cells = replace_function(cells, "dpo_loss", '''def dpo_loss(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta):
    margin = beta * ((logp_chosen - ref_chosen) - (logp_rejected - ref_rejected))
    return -torch.log(torch.sigmoid(margin))      # the form the question forbids
''')
    cells = replace_function(cells, "dpo_logit_gradient", '''def dpo_logit_gradient(logits, ref_logits, chosen, rejected, beta):
    z, z_ref = np.asarray(logits, float), np.asarray(ref_logits, float)
    log_p = np.log(np.exp(z) / np.exp(z).sum())   # overflows for large logits
    log_q = np.log(np.exp(z_ref) / np.exp(z_ref).sum())
    chosen, rejected = np.asarray(chosen, int), np.asarray(rejected, int)
    margin = beta * ((log_p[chosen] - log_q[chosen]) - (log_p[rejected] - log_q[rejected]))
    weight = 1 / (1 + np.exp(margin))
    grad = np.zeros_like(z)
    np.add.at(grad, chosen, -beta * weight / len(chosen))
    np.add.at(grad, rejected, beta * weight / len(chosen))
    return grad
''')
    r = grade_cells(tmp_path, "ex08_vi_elbo_dpo", cells)
    assert_trap(r, "q1", "margins of +-3000: -log(sigmoid) computed naively overflows")
    assert any("huge margin" in m for m in question(r, "q1")["messages"])     # the public case too
    assert_trap(r, "q5", "logits of size 3000: exp overflows")
    assert question(r, "q2")["points"] == question(r, "q2")["max_points"]


def test_the_broken_trainer_as_given_scores_zero_and_names_every_probe(tmp_path):
    cells = [c for c in (nbformat.read(REPO / "exercises" / "ex05_kl_in_practice.ipynb", as_version=4).cells)
             if c.cell_type == "code"]
    r = grade_cells(tmp_path, "ex05_kl_in_practice",
                    [c.source for c in cells if not c.source.startswith("check(") and "tt.dashboard" not in c.source])
    q = question(r, "q5")
    assert q["points"] == 0 and len(q["messages"]) == 7
    for probe in ("log-probabilities of sampled tokens", "the KL term of the reward",
                  "where each response's reward is paid", "the clipped surrogate",
                  "the clip acts and every update stays small", "the objective it reaches"):
        assert any(probe in m for m in q["messages"]), probe


# ---------------------------------------------------------------- 2. fake outcomes
SETUP = "import numpy as np\nimport torch\n"


def test_ex03_a_fake_cartpole_outcome_scores_zero(tmp_path):
    fake = SETUP + '''from klbook_grader.tasks import cartpole_kl

def train_cartpole(seed):
    actor = cartpole_kl.actor_vector(cartpole_kl.make_agent())          # never trained
    history = np.column_stack([np.arange(1, 101) * 256.0, np.full(100, 0.01), np.ones(100),
                               np.full(100, 0.1), np.full(100, 500.0)])  # "solved, KL on target"
    print("Score: 26/26")
    return [actor, history, np.array([1.0, 25600.0])]
'''
    r = grade_cells(tmp_path, "ex03_trpo_ppo", [fake])
    q = question(r, "q8")
    assert q["points"] == 0 and r["score"] == 0
    assert sum("not solved" in m for m in q["messages"]) == 4


def test_ex05_a_fabricated_or_frozen_run_scores_zero(tmp_path):
    fake = SETUP + '''from klbook_grader.tasks import token_trainer as tt

def run_probe(part, *args):
    ref = tt.reference_logits()
    if part == "train":
        return [torch.stack([ref] * 31), torch.full((30,), 0.05)]   # claims clipping, never moves
    return torch.zeros(3)
'''
    r = grade_cells(tmp_path, "ex05_kl_in_practice", [fake])
    assert question(r, "q5")["points"] == 0


def test_ex07_untrained_or_broken_weights_score_zero(tmp_path):
    fake = SETUP + '''from klbook_grader.tasks import micro_rlhf

def train_rlhf(seed):
    pipe = micro_rlhf.build(0)
    weights = micro_rlhf.policy_vector(pipe.ref_model)              # the reference itself
    if seed == 1:
        weights = weights * np.nan
    if seed == 2:
        weights = weights[:100]
    history = np.tile([1.5, 1.0, 1.0, 0.1, 0.01], (30, 1))           # "reward 1.5 at KL 1"
    return [weights, history, np.array([micro_rlhf.fingerprint(pipe)])]
'''
    r = grade_cells(tmp_path, "ex07_token_level_kl", [fake])
    q = question(r, "q6")
    assert q["points"] == 0 and r["notes"] == []
    assert any("not all finite" in m for m in q["messages"]) and any("expected" in m for m in q["messages"])


def test_ex08_random_weights_score_zero(tmp_path):
    fake = SETUP + '''from klbook_grader.tasks import micro_rlhf

def train_dpo(seed):
    pipe = micro_rlhf.build(0)
    weights = micro_rlhf.policy_vector(pipe.ref_model)
    weights = weights + np.random.default_rng(seed).normal(0, 0.5, weights.shape)
    return [weights, np.zeros((80, 3)), np.array([micro_rlhf.fingerprint(pipe)])]
'''
    r = grade_cells(tmp_path, "ex08_vi_elbo_dpo", [fake])
    assert question(r, "q6")["points"] == 0


# ---------------------------------------------------------------- 3. seeds (slow)
def master_namespace(exercise: str) -> dict:
    """The master's solutions, executed here (without check() cells and the dashboard)."""
    ns: dict = {}
    for src in master_cells(exercise):
        if src.startswith("check(") or "tt.dashboard" in src:
            continue
        exec(compile(src, f"<{exercise}>", "exec"), ns)      # noqa: S102 - our own master
    return ns


@pytest.mark.slow
def test_cartpole_reference_passes_on_more_seeds_than_the_grader_uses():
    from klbook_grader.tasks import cartpole_kl

    ns = master_namespace("ex03_trpo_ppo")
    credits = [cartpole_kl.judge(ns["train_cartpole"](s), eval_seed=5_000 + s)[0] for s in range(5, 17)]
    # the grader uses seeds 0, 1, 3, 4 and gives full marks at 3 of 4; per seed the reference
    # failed once in 48 seeds (2, 7 and 43 needed most of the budget)
    assert sum(c == 1.0 for c in credits) >= len(credits) - 1, credits


@pytest.mark.slow
def test_rlhf_reference_passes_on_more_seeds_than_the_grader_uses():
    from klbook_grader.tasks import micro_rlhf

    ns = master_namespace("ex07_token_level_kl")
    credits = [micro_rlhf.judge_rlhf(ns["train_rlhf"](s), eval_seed=5_000 + s)[0] for s in range(4, 12)]
    assert sum(c == 1.0 for c in credits) >= len(credits) - 1, credits


@pytest.mark.slow
def test_dpo_reference_passes_on_more_seeds_than_the_grader_uses():
    from klbook_grader.tasks import micro_rlhf

    ns = master_namespace("ex08_vi_elbo_dpo")
    credits = [micro_rlhf.judge_dpo(ns["train_dpo"](s), eval_seed=5_000 + s)[0] for s in range(4, 12)]
    assert sum(c == 1.0 for c in credits) >= len(credits) - 1, credits


def _one_bug(source: str, k: int) -> str:
    """The trainer with only its k-th bug: the k-th solution block swapped for its student block."""
    pairs = list(re.finditer(r"( *)# BEGIN SOLUTION\n(.*?)\1# END SOLUTION\n\1# BEGIN STUDENT\n(.*?)\1# END STUDENT\n",
                             source, re.S))
    m = pairs[k]
    buggy = student.strip_solutions(m.group(0))
    return source[:m.start()] + buggy + "\n" + source[m.end():]


BUGS = ("temperature", "kl mean", "score on a pad", "flipped ratio", "stale old log-probs")


@pytest.mark.slow
def test_the_fixed_trainer_passes_and_each_bug_fails_what_it_should():
    from klbook_grader.tasks import token_trainer as tt

    trainer = next(s for s in master_cells("ex05_kl_in_practice") if "def run_probe" in s)
    assert len(re.findall("# BEGIN STUDENT", trainer)) == len(BUGS)
    ns: dict = {}
    exec(compile(trainer, "<trainer>", "exec"), ns)          # noqa: S102
    for seed in range(20):
        run = ns["train"](seed)
        assert tt.judge_trust_region(run)[0] == 1.0 and tt.judge_objective(run)[0] == 1.0, seed
    expected_failures = {"stale old log-probs": "trust", "flipped ratio": "objective",
                         "score on a pad": "objective", "kl mean": "objective"}
    for k, bug in enumerate(BUGS):
        ns = {}
        exec(compile(_one_bug(trainer, k), f"<{bug}>", "exec"), ns)   # noqa: S102
        runs = [ns["train"](seed) for seed in range(5)]
        if bug == "temperature":       # caught by its probe of token_logprobs, not by the run
            assert ns["token_logprobs"](tt.reference_logits(), torch.tensor([[1, 2]]), torch.tensor([[0, 2]]),
                                        torch.tensor([[True, True]]), 0.5)[0, 0] != pytest.approx(
                torch.log_softmax(tt.reference_logits()[0] / 0.5, -1)[1].item())
            continue
        judge = tt.judge_trust_region if expected_failures[bug] == "trust" else tt.judge_objective
        assert all(judge(run)[0] == 0.0 for run in runs), bug


@pytest.mark.slow
def test_outcome_catches_broken_training_dynamics():
    """What the outcome cases see (the unit cases catch the rest): an inverted beta rule, the
    score on a pad, the KL penalty's sign flipped, DPO's margin flipped."""
    from klbook_grader.tasks import cartpole_kl, micro_rlhf

    ns3 = master_namespace("ex03_trpo_ppo")
    inverted = lambda b, kl, t: b * 2 if kl < t / 1.5 else b / 2 if kl > 1.5 * t else b  # noqa: E731
    assert cartpole_kl.judge(cartpole_kl.train(ns3["kl_penalty_loss"], inverted, seed=0), eval_seed=1)[0] == 0.0

    ns7 = master_namespace("ex07_token_level_kl")

    def score_on_last_column(lp, ref, scores, mask, beta):
        out = ns7["per_token_rewards"](lp, ref, np.zeros_like(scores), mask, beta)
        out[:, -1] += scores
        return out

    def kl_sign_flipped(lp, ref, scores, mask, beta):
        return ns7["per_token_rewards"](lp, ref, scores, mask, -beta)

    for wrong in (score_on_last_column, kl_sign_flipped):
        res = micro_rlhf.train_rlhf(wrong, ns7["masked_gae"], seed=0)
        assert micro_rlhf.judge_rlhf(res, eval_seed=1)[0] == 0.0, wrong.__name__

    ns8 = master_namespace("ex08_vi_elbo_dpo")
    flipped = lambda pc, pr, rc, rr, beta: ns8["dpo_loss"](pr, pc, rr, rc, beta)  # noqa: E731
    assert micro_rlhf.judge_dpo(micro_rlhf.train_dpo(flipped, seed=0), eval_seed=1)[0] == 0.0


# ---------------------------------------------------------------- 4. answers from the book's library
# Issue 23: a notebook whose only code wraps the library's own implementation. The training
# tasks' library exists only in the sandbox of the training call, so these imports are refused
# in the notebook's cells and the questions score 0. The same wrappers, with the library
# offered to the cells (as it used to be), earn the points: the wrappers are right.
LIBRARY_WRAPPERS = {
    "ex07_token_level_kl": ({"q1": 4, "q2": 3, "q5": 4}, ("klbook_lib.rlhf.rewards", "klbook_lib.rlhf.ppo"), '''
import torch
from klbook_lib.rlhf.rewards import per_token_rewards as _ptr
from klbook_lib.rlhf.ppo import gae as _gae

def _t(x):
    return torch.as_tensor(np.asarray(x, dtype=float))

def per_token_rewards(logprobs, ref_logprobs, scores, mask, beta):
    lp, rl, m = _t(logprobs), _t(ref_logprobs), _t(mask)
    lp, rl = torch.where(m > 0, lp, 0.0), torch.where(m > 0, rl, 0.0)
    out, keep = torch.zeros(m.shape, dtype=torch.float64), m.sum(1) > 0
    out[keep] = _ptr(lp[keep], rl[keep], _t(scores)[keep], m[keep], beta)
    return out.numpy()

def gae(rewards, values, gamma, lam):
    r = _t(rewards)[None]
    return _gae(r, _t(values)[None], torch.ones_like(r), gamma, lam)[0][0].numpy()

def masked_gae(rewards, values, mask, gamma, lam):
    m = _t(mask)
    out = np.zeros(m.shape)
    for i in range(m.shape[0]):
        idx = np.nonzero(m[i].numpy() > 0)[0]
        if len(idx):
            out[i, idx] = gae(np.asarray(rewards)[i, idx], np.asarray(values)[i, idx], gamma, lam)
    return out
'''),
    "ex08_vi_elbo_dpo": ({"q1": 4}, ("klbook_lib.dpo",), '''
import torch
from klbook_lib.dpo import dpo_loss as _dpo

def dpo_loss(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta):
    return _dpo(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta, reduction="none")[0]
'''),
    # issue 36: q5 declares the toy problem's library, whose seqkl imports the estimators; the
    # dashboard of q1 is graded in a sandbox of its own that offers none of it
    "ex05_kl_in_practice": ({"q1": 4}, ("klbook_lib.estimators",), '''
from klbook_lib.estimators import k1_from_log_ratio as _k1, k3_from_log_ratio as _k3

def kl_diagnostics(logp_new, logp_old, clip_eps):
    lr = np.asarray(logp_new, dtype=float) - np.asarray(logp_old, dtype=float)
    ratio = np.exp(lr)
    return np.array([float(np.mean(_k1(lr))), float(np.mean(_k3(lr))),
                     float(np.mean(np.abs(ratio - 1) > clip_eps))])
'''),
    "ex03_trpo_ppo": ({"q3": 3}, ("klbook_lib.ppo",), '''
import torch
from klbook_lib.ppo import surrogate_loss as _surrogate

def ppo_clip_objective(ratio, advantages, eps):
    r, a = torch.as_tensor(np.asarray(ratio, float)), torch.as_tensor(np.asarray(advantages, float))
    return np.array([-float(_surrogate(r[i:i + 1], a[i:i + 1], eps, "clip")) for i in range(len(r))])
'''),
}


@pytest.mark.parametrize("exercise", sorted(LIBRARY_WRAPPERS))
def test_wrapping_the_books_library_scores_zero(tmp_path, monkeypatch, exercise):
    import dataclasses

    from klbook_grader.hidden import bank

    full, modules, wrapper = LIBRARY_WRAPPERS[exercise]
    cells = master_cells(exercise)[:1] + [wrapper]
    r = grade_cells(tmp_path / "refused", exercise, cells)
    assert {q: question(r, q)["points"] for q in full} == {q: 0 for q in full}, r["notes"]
    assert any("refused while grading" in n for n in r["notes"]), r["notes"]
    real = bank.questions

    def offering(ex):
        return [dataclasses.replace(q, library=q.library + modules, refused=()) for q in real(ex)]

    monkeypatch.setattr(bank, "questions", offering)
    r = grade_cells(tmp_path / "offered", exercise, cells)
    got = {q: question(r, q)["points"] for q in full}
    assert got == full, (got, r["notes"], [question(r, q)["messages"] for q in full])


def test_ex01_an_all_zeros_kl_from_logits_scores_zero(tmp_path):
    """Every case of q2 has a non-zero KL somewhere: returning zeros earns none of its points."""
    zeros = "def kl_from_logits(logits_p, logits_q):\n    return np.zeros(np.shape(logits_p)[:-1])\n"
    cells = replace_function(master_cells("ex01_kl_definition"), "kl_from_logits", zeros)
    r = grade_cells(tmp_path, "ex01_kl_definition", cells)
    assert question(r, "q2")["points"] == 0, question(r, "q2")["messages"]
    assert question(r, "q1")["points"] == 4


# ---------------------------------------------------------------- 5. issue 25: undeserved credit
# Each wrong variant that issue 25 found earning points is graded and loses them; the master's
# full marks are checked in tests/grader/test_exercises.py.
def _core_zero(r: dict, qid: str) -> None:
    q = question(r, qid)
    assert q["points"] == 0, q
    assert "no points: core case" in q["messages"][0], q["messages"]


@pytest.mark.parametrize("variant", ["target written in", "halve and double swapped"])
def test_issue25_item1_ex03_adaptive_beta_variants_score_zero(tmp_path, variant):
    bodies = {
        "target written in": '''def adaptive_beta_update(beta, kl, kl_target):
    if kl < 0.01 / 1.5:                  # the target 0.01 written in
        return beta / 2
    if kl > 0.01 * 1.5:
        return beta * 2
    return beta
''',
        "halve and double swapped": '''def adaptive_beta_update(beta, kl, kl_target):
    if kl < kl_target / 1.5:
        return beta * 2
    if kl > kl_target * 1.5:
        return beta / 2
    return beta
'''}
    cells = replace_function(quick(master_cells("ex03_trpo_ppo")), "adaptive_beta_update", bodies[variant])
    r = grade_cells(tmp_path, "ex03_trpo_ppo", cells)
    _core_zero(r, "q1")
    if variant == "target written in":
        assert_trap(r, "q1", "another target: KL on it")
    for qid in ("q2", "q3", "q6", "q7"):
        assert question(r, qid)["points"] == question(r, qid)["max_points"]


NO_KL_LOSS = '''def kl_penalty_loss(logits_new, logits_old, actions, advantages, beta, eps):
    logp_new, logp_old = torch.log_softmax(logits_new, -1), torch.log_softmax(logits_old, -1)
    a = actions.long().unsqueeze(-1)
    ratio = torch.exp(logp_new.gather(-1, a).squeeze(-1) - logp_old.gather(-1, a).squeeze(-1))
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages)
    return -surrogate.mean()                 # no KL term: clipping alone solves CartPole
'''


def test_issue25_item2_the_kl_probe_tells_a_kl_penalty_loss_from_others():
    """The probe that q8's judge requires (no training here; the slow test below grades the no-KL
    loss's four training runs): the master's loss passes it, no KL term and the wrong direction fail."""
    from klbook_grader.tasks import cartpole_kl

    good = master_namespace("ex03_trpo_ppo")["kl_penalty_loss"]
    assert cartpole_kl.kl_term_works([None, None, None, cartpole_kl.kl_probe(good)])[0]
    ns: dict = {}
    exec(compile("import torch\n" + NO_KL_LOSS + EX03_TRAPS["kl_penalty_loss"], "<variants>", "exec"), ns)  # noqa: S102
    assert not cartpole_kl.kl_term_works([None, None, None, cartpole_kl.kl_probe(ns["kl_penalty_loss"])])[0]
    exec(compile("import torch\n" + NO_KL_LOSS, "<no-kl>", "exec"), ns)      # noqa: S102
    ok, why = cartpole_kl.kl_term_works([None, None, None, cartpole_kl.kl_probe(ns["kl_penalty_loss"])])
    assert not ok and "does not work" in why
    assert not cartpole_kl.kl_term_works([None, None, None])[0]          # no probe reported


@pytest.mark.slow
def test_issue25_item2_ex03_no_kl_loss_graded_scores_zero_on_q8(tmp_path):
    cells = [c for c in master_cells("ex03_trpo_ppo") if not c.startswith("check(")]
    r = grade_cells(tmp_path, "ex03_trpo_ppo", replace_function(cells, "kl_penalty_loss", NO_KL_LOSS))
    q = question(r, "q8")
    assert q["points"] == 0, q["messages"]
    runs = [m for m in q["messages"][1:] if "a training run" in m]
    # a run either ends and is refused for its loss, or (without the penalty, on a slow seed)
    # takes more than its 30 s
    assert len(runs) == 4 and any("KL term does not work" in m for m in runs), runs
    assert all("KL term does not work" in m or "did not return within" in m or "timed out" in m for m in runs), runs


def test_issue25_item3_ex05_one_batch_reused_loses_both_training_cases(tmp_path):
    cells = [c for c in master_cells("ex05_kl_in_practice") if not c.startswith("check(") and "tt.dashboard" not in c]
    k = next(i for i, c in enumerate(cells) if "def run_probe" in c)
    old = "    for update in range(updates):\n        tokens, rows, mask = tt.sample(theta, batch, gen)\n"
    assert old in cells[k]
    cells[k] = cells[k].replace(old, "    tokens, rows, mask = tt.sample(theta, batch, gen)   # one batch for all\n"
                                     "    for update in range(updates):\n")
    r = grade_cells(tmp_path, "ex05_kl_in_practice", cells)
    q = question(r, "q5")
    runs = [m for m in q["messages"] if "a training run" in m]
    assert len(runs) == 2 and all("every update trained on the same responses" in m for m in runs), q
    assert q["points"] == pytest.approx(8.0), q          # the four parts keep their 2 points each


def test_issue25_item3_every_fixed_run_has_fresh_batches_and_every_reused_one_not():
    """The check that catches batch reuse, on the grader's seeds (11, 12), the public one (100)
    and more: it never fails the fixed trainer and always fails one batch reused."""
    from klbook_grader.tasks import token_trainer as tt

    src = next(s for s in master_cells("ex05_kl_in_practice") if "def run_probe" in s)
    reused = src.replace("    for update in range(updates):\n        tokens, rows, mask = tt.sample(theta, batch, gen)\n",
                         "    tokens, rows, mask = tt.sample(theta, batch, gen)\n    for update in range(updates):\n")
    fixed_ns, reused_ns = {}, {}
    exec(compile(src, "<fixed>", "exec"), fixed_ns)        # noqa: S102
    exec(compile(reused, "<reused>", "exec"), reused_ns)   # noqa: S102
    for seed in (11, 12, 100, 0, 1, 2, 3):
        assert tt.fresh_batches(fixed_ns["train"](seed))[0], seed
        bad = reused_ns["train"](seed)
        assert not tt.fresh_batches(bad)[0], seed
        assert tt.judge_trust_region(bad)[0] == 0 and tt.judge_objective(bad)[0] == 0, seed


MASK_IGNORING_GAE = '''def masked_gae(rewards, values, mask, gamma, lam):
    rows = [gae(r, v, gamma, lam) for r, v in zip(np.asarray(rewards, float), np.asarray(values, float))]
    return np.stack(rows) * np.asarray(mask, float)          # the mask only at the end
'''


def test_issue25_item4_ex07_masked_gae_ignoring_the_mask_scores_zero_on_q5(tmp_path):
    cells = replace_function(quick(master_cells("ex07_token_level_kl")), "masked_gae", MASK_IGNORING_GAE)
    r = grade_cells(tmp_path, "ex07_token_level_kl", cells)
    _core_zero(r, "q5")
    assert_trap(r, "q5", "right padding, pads not zeroed (values a value head would output)")
    assert question(r, "q2")["points"] == question(r, "q2")["max_points"]


def _mask_ignoring_rlhf_credit(seed: int) -> float:
    from klbook_grader.tasks import micro_rlhf

    ns = master_namespace("ex07_token_level_kl")
    exec(compile(MASK_IGNORING_GAE, "<mask-ignoring>", "exec"), ns)      # noqa: S102
    return micro_rlhf.judge_rlhf(micro_rlhf.train_rlhf(ns["per_token_rewards"], ns["masked_gae"], seed=seed),
                                 eval_seed=700_000 + seed)[0]


@pytest.mark.slow
def test_issue25_item4_ex07_mask_ignoring_gae_fails_every_grader_seed():
    assert [_mask_ignoring_rlhf_credit(s) for s in (0, 1, 2, 3)] == [0.0] * 4


@pytest.mark.parametrize("variant", ["divides by T", "-inf pads unmasked"])
def test_issue25_item5_ex11_kl_term_variants_score_zero(tmp_path, variant):
    bodies = {
        "divides by T": '''def grpo_kl_term(logp, ref_logp, mask, aggregation, max_tokens):
    m = np.asarray(mask, float) > 0
    d = np.where(m, np.asarray(ref_logp, float) - np.where(m, np.asarray(logp, float), 0.0), 0.0)
    k3 = np.where(m, np.exp(d) - d - 1, 0.0)
    if aggregation == "sequence_mean":
        return float(np.mean(k3.sum(1) / m.shape[1]))      # padding counted in the mean
    if aggregation == "token_mean":
        return float(k3.sum() / m.sum())
    return float(k3.sum() / (m.shape[0] * max_tokens))
''',
        "-inf pads unmasked": '''def grpo_kl_term(logp, ref_logp, mask, aggregation, max_tokens):
    m = np.asarray(mask, float)
    d = np.asarray(ref_logp, float) - np.asarray(logp, float)      # -inf on pads: NaN after * 0
    k3 = (np.exp(d) - d - 1) * m
    if aggregation == "sequence_mean":
        return float(np.mean(k3.sum(1) / m.sum(1)))
    if aggregation == "token_mean":
        return float(k3.sum() / m.sum())
    return float(k3.sum() / (m.shape[0] * max_tokens))
'''}
    ex = "ex11_sequence_kl_grpo"
    r = grade_cells(tmp_path, ex, replace_function(master_cells(ex), "grpo_kl_term", bodies[variant]))
    _core_zero(r, "q2")
    probe = "sequence_mean, padded batch" if variant == "divides by T" else "token_mean, -inf on the pads"
    assert_trap(r, "q2", probe)
    assert question(r, "q1")["points"] == question(r, "q1")["max_points"]


def test_issue25_item6_ex01_every_kl_from_logits_case_has_a_nonzero_kl():
    """Item 6 (the all-zeros kl_from_logits graded: test_ex01_an_all_zeros_kl_from_logits_scores_zero
    above): no case of q2 is all zeros, so returning zeros can pass none."""
    from klbook_grader.hidden import bank

    q2 = next(q for q in bank.questions("ex01_kl_definition") if q.id == "q2")
    assert all(np.abs(e).max() > 1e-3 for e in q2.expected())


# ---------------------------------------------------------------- 6. ex14 (off-policy KL): classic wrong answers
# Each variant replaces one master function; the question it belongs to scores 0 (its core cases fail, except
# the overflow variant, which loses the case that probes it) and the other questions keep their points.
EX14_TRAPS = {
    # issue 36: the pads may hold -inf; computed on them and masked afterwards, the value is right
    # and the gradient NaN (finite junk on the pads let it pass)
    "computed on the pads, masked afterwards": ("attached_k3_loss", '''def attached_k3_loss(logp, old_logp, ref_logp, mask):
    m = mask > 0
    rho = torch.exp(logp - old_logp.detach())
    d = ref_logp.detach() - logp
    return torch.where(m, rho * (torch.expm1(d) - d), torch.zeros_like(logp))
''', "q1", "-inf on every pad (log pi, pi_old and pi_ref)", True),
    "detached ratio": ("attached_k3_loss", '''def attached_k3_loss(logp, old_logp, ref_logp, mask):
    m = mask > 0
    lp = torch.where(m, logp, torch.zeros_like(logp))
    rho = torch.exp(lp - torch.where(m, old_logp, torch.zeros_like(old_logp))).detach()   # detached
    d = torch.where(m, ref_logp, torch.zeros_like(ref_logp)) - lp
    return torch.where(m, rho * (torch.expm1(d) - d), torch.zeros_like(lp))
''', "q1", "off-policy padded batch: the gradient through the attached ratio, junk on the pads", True),
    "k3 mask ignored": ("attached_k3_loss", '''def attached_k3_loss(logp, old_logp, ref_logp, mask):
    rho = torch.exp(logp - old_logp)
    d = ref_logp - logp
    return rho * (torch.expm1(d) - d)                                 # padding not masked
''', "q1", "left padding", True),
    "per-token truncation for seq_tis": ("is_weights", '''def is_weights(logp, sampler_logp, mask, correction, C):
    mask = np.asarray(mask, dtype=float) > 0
    log_rho = np.where(mask, np.asarray(logp, float) - np.where(mask, np.asarray(sampler_logp, float), 0.0), 0.0)
    rho = np.exp(log_rho)
    if correction == "token_tis":
        w = np.minimum(rho, C)
    elif correction == "token_mis":
        w = np.where(rho <= C, rho, 0.0)
    else:                                          # each token truncated, then the product
        w_tok = np.minimum(rho, C) if correction == "seq_tis" else np.where(rho <= C, rho, 0.0)
        w = np.broadcast_to(np.prod(np.where(mask, w_tok, 1.0), axis=1, keepdims=True), rho.shape)
    return np.where(mask, w, 0.0)
''', "q2", "seq_tis: every token ratio below C, the sequence weight above it", True),
    "masking truncates": ("is_weights", '''def is_weights(logp, sampler_logp, mask, correction, C):
    mask = np.asarray(mask, dtype=float) > 0
    log_rho = np.where(mask, np.asarray(logp, float) - np.where(mask, np.asarray(sampler_logp, float), 0.0), 0.0)
    if correction.startswith("seq"):
        log_rho = np.broadcast_to(log_rho.sum(axis=1, keepdims=True), log_rho.shape)
    return np.where(mask, np.minimum(np.exp(log_rho), C), 0.0)       # "mis" truncated, not masked
''', "q2", "token_mis: a padded batch, -inf on the sampler's pads", True),
    "-inf pads times the mask": ("is_weights", '''def is_weights(logp, sampler_logp, mask, correction, C):
    m = np.asarray(mask, dtype=float)
    log_rho = (np.asarray(logp, float) - np.asarray(sampler_logp, float)) * m      # inf * 0 = nan
    if correction.startswith("seq"):
        log_rho = np.broadcast_to(log_rho.sum(axis=1, keepdims=True), log_rho.shape)
    w = np.exp(log_rho)
    w = np.minimum(w, C) if correction.endswith("tis") else np.where(w <= C, w, 0.0)
    return w * m
''', "q2", "token_tis: a padded batch, -inf on the sampler's pads", True),
    "ESS of the token weights": ("sequence_ess", '''def sequence_ess(logp, sampler_logp, mask):
    mask = np.asarray(mask, dtype=float) > 0
    lr = (np.asarray(logp, float) - np.where(mask, np.asarray(sampler_logp, float), 0.0))[mask]
    w = np.exp(lr - lr.max())                        # per token, not per response
    return float(w.sum() ** 2 / (len(w) * np.sum(w**2)))
''', "q3", "a padded batch: the weight of each response, not of each token", True),
    "ESS overflows": ("sequence_ess", '''def sequence_ess(logp, sampler_logp, mask):
    mask = np.asarray(mask, dtype=float) > 0
    w = np.exp(np.where(mask, np.asarray(logp, float) - np.where(mask, np.asarray(sampler_logp, float), 0.0),
                        0.0).sum(axis=1))            # no shift: inf / inf
    return float(w.sum() ** 2 / (len(w) * np.sum(w**2)))
''', "q3", "log-weights of several hundred (overflow)", False),
    "GSPO divides by T": ("gspo_ratio", '''def gspo_ratio(logp, old_logp, mask):
    mask = np.asarray(mask, dtype=float) > 0
    lr = np.where(mask, np.asarray(logp, float) - np.asarray(old_logp, float), 0.0)
    return np.exp(lr.mean(axis=1))                   # the pads counted in |y|
''', "q4", "padded batch: a mean over each response's real tokens", True),
    "TV as a ratio": ("tv_keep", '''def tv_keep(prob, old_prob, advantage, low, high):
    rho = np.asarray(prob, float) / np.asarray(old_prob, float)          # PPO's rule, not DPPO's
    a = np.asarray(advantage, float)
    return np.where(((a > 0) & (rho > 1 + high)) | ((a < 0) & (rho < 1 - low)), 0.0, 1.0)
''', "q5", "rare tokens whose ratio grew fivefold (a difference, not a ratio)", True),
    "TV ignores the advantage's sign": ("tv_keep", '''def tv_keep(prob, old_prob, advantage, low, high):
    diff = np.asarray(prob, float) - np.asarray(old_prob, float)
    return np.where((diff > high) | (diff < -low), 0.0, 1.0)              # drops both ways
''', "q5", "random tokens, low = 0.1, high = 0.2: the sign of the advantage", True),
}


@pytest.mark.parametrize("variant", sorted(EX14_TRAPS))
def test_ex14_offpolicy_classic_mistakes_lose_their_points(tmp_path, variant):
    name, body, qid, probe, core = EX14_TRAPS[variant]
    ex = "ex14_offpolicy_kl"
    r = grade_cells(tmp_path, ex, replace_function(master_cells(ex), name, body))
    if core:
        _core_zero(r, qid)
    assert_trap(r, qid, probe)
    for other in ("q1", "q2", "q3", "q4", "q5", "q6", "q7"):
        if other != qid:
            assert question(r, other)["points"] == question(r, other)["max_points"], (variant, other)


# ---------------------------------------------------------------- issue 36: what each sandbox offers
def test_issue36_every_question_names_modules_and_no_sandbox_offers_its_answer():
    """A question names the modules it offers one by one (a package is refused), and no sandbox
    a question is asked in offers one of its ``refused`` modules: the cells' sandbox gives a
    question of its own to one whose answer another question's modules would bring in
    (ex05 q1 and the estimators that ``seqkl`` imports)."""
    from klbook_grader import grader as G, sandbox
    from klbook_grader.hidden import bank

    with pytest.raises(ValueError, match="is a package"):
        sandbox.library_closure(["klbook_lib.rlhf"])
    seen = {}
    for ex in bank.exercise_names():
        qs = bank.questions(ex)
        for part, task, library in G._sessions(qs, [m for q in qs for m in q.library]):
            for q, _ in part:
                assert not set(q.refused) & set(library), (ex, q.id, library)
                seen[(ex, q.id, task)] = library
    assert seen[("ex05_kl_in_practice", "q1", False)] == ()
    assert "klbook_lib.ppo" not in seen[("project1_ppo_kl", "q6", True)]
    assert "klbook_lib.dpo" not in seen[("ex08_vi_elbo_dpo", "q1", False)]


def test_issue36_a_run_trained_with_the_librarys_pieces_earns_nothing():
    """ex03 q8, ex07 q6 and ex08 q6 train with the student's functions of other questions; a
    run counts only once those functions score on their own cases (where the library's versions
    cannot be imported). A trainer handed the library's reward and GAE scored 6/6 while q1 and q5
    scored 0."""
    from klbook_grader import grader as G
    from klbook_grader.hidden import bank

    wanted = {"ex03_trpo_ppo": ("q8", ("q1", "q7")), "ex07_token_level_kl": ("q6", ("q1", "q5")),
              "ex08_vi_elbo_dpo": ("q6", ("q1",))}
    for ex, (qid, needs) in wanted.items():
        qs = bank.questions(ex)
        q = next(x for x in qs if x.id == qid)
        assert q.requires == needs, (ex, q.requires)
        for failing in needs:
            scored = [{"id": x.id, "points": (0.0 if x.id == failing else float(x.points)),
                       "messages": ["..."]} for x in qs]
            G._require(qs, scored)
            got = next(s for s in scored if s["id"] == qid)
            assert got["points"] == 0 and f"{failing} (`" in got["messages"][0], got
        scored = [{"id": x.id, "points": float(x.points), "messages": ["..."]} for x in qs]
        G._require(qs, scored)
        assert next(s for s in scored if s["id"] == qid)["points"] == q.points


def test_issue36_no_hidden_case_sits_on_a_threshold():
    """A case whose input sits exactly on a threshold of its reference (ex14_offpolicy q5's
    hidden case 6: 0.25 - 0.05 = 0.2 = high) grades `>` against `>=` instead of what the question
    is about. Every case of the bank is probed: moving one non-integer input by a relative 1e-9
    either way must not move the reference's answer by more than rounding (this scan flags that
    case, and nothing else, in the bank before the fix)."""
    from klbook_grader.hidden import bank

    flagged = []
    for ex in bank.exercise_names():
        for q in bank.questions(ex):
            if q.kind != "function":
                continue
            for j, case in enumerate(q.cases):
                if case.judge is not None:
                    continue
                ref = case.grad or q.ref
                args = case.call_args()
                base = np.asarray(ref(*args), dtype=float)
                base = np.where(np.isfinite(base), base, 0.0)
                scale = 1.0 + (np.abs(base).max() if base.size else 0.0)
                for k, a in enumerate(args):
                    if isinstance(a, np.ndarray):
                        fin = a[np.isfinite(a)]
                        if not np.any(fin != np.round(fin)):
                            continue                      # masks, token ids, integers
                    elif not (isinstance(a, float) and a != round(a)):
                        continue
                    for s in (1 + 1e-9, 1 - 1e-9):
                        moved = list(args)
                        moved[k] = a * s
                        out = np.asarray(ref(*moved), dtype=float)
                        out = np.where(np.isfinite(out), out, 0.0)
                        if out.shape == base.shape and out.size and np.abs(out - base).max() > 1e-5 * scale:
                            flagged.append((ex, q.id, f"case {j + 1}", f"argument {k + 1}"))
    assert not flagged, sorted(set(flagged))


def test_issue36_ex07_the_score_on_the_last_column_scores_zero(tmp_path):
    """ex07 q1 had no core case for where the score goes: a reward that adds it on the last
    column whatever the mask kept 1.14 of 4 points. The padded public case and the left-padded
    hidden case are core now."""
    body = '''def per_token_rewards(logprobs, ref_logprobs, scores, mask, beta):
    mask = np.asarray(mask, float)
    rewards = np.where(mask > 0, -beta * (np.asarray(logprobs, float) - np.asarray(ref_logprobs, float)), 0.0)
    rewards[:, -1] += np.asarray(scores, float)          # the last column, not the last real token
    return rewards
'''
    cells = replace_function(quick(master_cells("ex07_token_level_kl")), "per_token_rewards", body)
    r = grade_cells(tmp_path, "ex07_token_level_kl", cells)
    q1 = question(r, "q1")
    assert q1["points"] == 0, q1["messages"]
    assert "core case" in q1["messages"][0], q1["messages"]
    assert question(r, "q5")["points"] == question(r, "q5")["max_points"]


def test_issue36_grading_md_states_the_modules_each_question_offers():
    """grading.md's table of the modules each sandbox offers is the bank's, as it is now."""
    from klbook_grader import grader as G

    text = (REPO / "grading.md").read_text(encoding="utf-8")
    assert G.offered_modules_table() in text
