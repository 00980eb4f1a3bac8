"""Project 1 (project1_ppo_kl): a KL-penalty PPO written from the environment up.

1. The references of klbook_grader/hidden/project1.py (plain loops, numpy) against
   independent ones: a vectorised backward GAE recursion and hand-computed cases, torch
   autograd with ``torch.distributions`` for the loss, scipy's z-score for the normalisation.
2. Classic wrong pieces, graded by the real grader in its sandbox (the training function stubbed,
   so a grading takes seconds): each question loses its points, the others keep theirs.
3. Wrong training loops, judged by the grader's own judge on the grader's own cases (in this
   process: a grading of the whole project takes about a minute here): no KL term, the target
   written in, beta never adapted, one batch reused; and fabricated results score 0.
4. The tooling: the file name tells the exercise, ``klbook start project1``, the CSV's report row.
Master full marks and stub zero are in tests/grader/test_exercises.py (they cover every exercise).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest
import scipy.stats
import torch

from klbook_grader import batch as B
from klbook_grader import compare, start
from klbook_grader.grader import find_exercise, grade
from klbook_grader.hidden import bank
from klbook_grader.hidden import project1 as P
from klbook_grader.hidden.questions import plain
from klbook_grader.tasks import ppo_kl_project as task

EX = "project1_ppo_kl"
REPO = Path(__file__).resolve().parents[2]
MASTER = REPO / "exercises" / "masters" / f"{EX}.ipynb"


def _t(x):
    return torch.tensor(np.asarray(x, float), dtype=torch.float64)


def _question(qid: str):
    return next(q for q in bank.questions(EX) if q.id == qid)


# ---------------------------------------------------------------- 1. references
def _gae_backward(r, v, nv, term, done, gamma, lam):
    """A_t = delta_t + gamma lam (1 - done_t) A_{t+1}, vectorised over copies, written here."""
    delta = r + gamma * (1 - term) * nv - v
    out, running = np.zeros_like(r), np.zeros(r.shape[1])
    for t in reversed(range(r.shape[0])):
        running = delta[t] + gamma * lam * (1 - done[t]) * running
        out[t] = running
    return out


def test_gae_reference_against_a_backward_recursion_and_by_hand():
    for case in _question("q1").cases:
        args = case.call_args()
        np.testing.assert_allclose(P.gae_reference(*args), _gae_backward(*args), rtol=1e-12, atol=1e-12)
    # by hand, the public case where the pole falls at step 1 (gamma 0.9, lambda 0.8):
    # delta = (1 + 0.9 * 0.4 - 0.5, 1 - 0.4, 1 + 0.9 * 0.2 - 0.3); A_1 = delta_1 (the sum stops there)
    d = np.array([0.86, 0.6, 0.88])
    want = np.array([d[0] + 0.72 * d[1], d[1], d[2]])[:, None]
    got = P.gae_reference(np.ones((3, 1)), [[0.5], [0.4], [0.3]], [[0.4], [0.0], [0.2]],
                          [[0.0], [1.0], [0.0]], [[0.0], [1.0], [0.0]], 0.9, 0.8)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # a truncation bootstraps (unlike a termination) but cuts the sum: only A_0 differs
    trunc = P.gae_reference(np.ones((3, 1)), [[0.5], [0.4], [0.3]], [[0.4], [0.7], [0.2]],
                            [[0.0], [0.0], [0.0]], [[0.0], [1.0], [0.0]], 0.9, 0.8)
    np.testing.assert_allclose(trunc[1:], [[1 + 0.9 * 0.7 - 0.4], [0.88]], rtol=1e-12)


def test_loss_and_normalisation_references_against_torch_and_scipy():
    for case in _question("q3").cases:
        new, old, actions, adv, beta, eps = case.call_args()
        ln, lo = _t(new), _t(old)
        pi_new, pi_old = torch.distributions.Categorical(logits=ln), torch.distributions.Categorical(logits=lo)
        a = torch.as_tensor(actions).long()
        ratio = torch.exp(pi_new.log_prob(a) - pi_old.log_prob(a))
        adv_t = _t(adv)
        surr = torch.min(ratio * adv_t, torch.clamp(ratio, 1 - eps, 1 + eps) * adv_t)
        want = -surr.mean() + beta * torch.distributions.kl_divergence(pi_old, pi_new).mean()
        assert P.loss_reference(*case.call_args()) == pytest.approx(float(want), rel=1e-10, abs=1e-12)
    for case in _question("q2").cases:
        a = case.call_args()[0]
        np.testing.assert_allclose(P.normalize_reference(a), scipy.stats.zscore(a, ddof=1),
                                   rtol=1e-4, atol=1e-6 if np.std(a) > 1e-3 else 1.0)


def test_registered_with_core_cases_explained_letters_and_its_own_name():
    qs = bank.questions(EX)
    assert sum(q.points for q in qs) == 21 and {q.kind for q in qs} == {"function", "choice"}
    assert all(any(c.core for c in q.cases) for q in qs if q.kind == "function" and q.id != "q6")
    assert set(_question("q5").explain) == {"A", "B", "D"}
    nb = nbformat.read(MASTER, as_version=4)
    assert find_exercise(Path("alice/project1_ppo_kl.ipynb"), nb, None)[0] == EX
    assert find_exercise(Path("alice/ex01_kl_definition.ipynb"), nb, None)[0] == "ex01_kl_definition"
    assert start.resolve("project1") == EX and start.resolve("ex04") == "ex04_estimating_kl"
    # the targets of the graded runs: a target written into the loop as 0.01 is wrong on three
    assert sorted(c.args[1] for c in _question("q6").cases) == [0.005, 0.005, 0.005, 0.01]


# ---------------------------------------------------------------- 2. wrong pieces, graded
def _master_cells() -> list[str]:
    nb = nbformat.read(MASTER, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def _replace(cells: list[str], name: str, new: str) -> list[str]:
    out = list(cells)
    hits = [i for i, c in enumerate(out) if re.search(rf"^def {name}\(", c, re.M)]
    assert len(hits) == 1, name
    out[hits[0]] = new
    return out


def _grade_cells(tmp_path: Path, cells: list[str]) -> dict:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"{EX}.ipynb"
    nbformat.write(nb, path)
    return grade(path)


NO_TRAINING = "def train_ppo_kl(seed, kl_target=0.01, budget=200_000):\n    raise NotImplementedError\n"
WRONG_PIECES = {
    "dones ignored, no normalisation, no KL term, target written in": {
        "compute_gae": '''
def compute_gae(rewards, values, next_values, terminated, dones, gamma, lam):
    delta = rewards + gamma * next_values - values
    adv, running = torch.zeros_like(rewards), torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = delta[t] + gamma * lam * running
        adv[t] = running
    return adv
''',
        "normalize_advantages": "def normalize_advantages(advantages):\n    return advantages\n",
        "ppo_kl_loss": '''
def ppo_kl_loss(logits_new, logits_old, actions, advantages, beta, eps):
    a = actions.long().unsqueeze(-1)
    ratio = torch.exp(torch.log_softmax(logits_new, -1).gather(-1, a) - torch.log_softmax(logits_old, -1).gather(-1, a)).squeeze(-1)
    return -torch.minimum(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages).mean()
''',
        "adaptive_beta": '''
def adaptive_beta(beta, kl, kl_target):
    if kl < 0.01 / 1.5:
        return beta / 2
    if kl > 1.5 * 0.01:
        return beta * 2
    return beta
''',
    },
    "truncation as termination, the KL reversed, halve and double swapped": {
        "compute_gae": '''
def compute_gae(rewards, values, next_values, terminated, dones, gamma, lam):
    delta = rewards + gamma * (1.0 - dones) * next_values - values
    adv, running = torch.zeros_like(rewards), torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = delta[t] + gamma * lam * (1.0 - dones[t]) * running
        adv[t] = running
    return adv
''',
        "normalize_advantages": "def normalize_advantages(advantages):\n    return (advantages - advantages.mean()) / advantages.abs().max()\n",
        "ppo_kl_loss": '''
def ppo_kl_loss(logits_new, logits_old, actions, advantages, beta, eps):
    lp_new, lp_old = torch.log_softmax(logits_new, -1), torch.log_softmax(logits_old, -1)
    a = actions.long().unsqueeze(-1)
    ratio = torch.exp(lp_new.gather(-1, a) - lp_old.gather(-1, a)).squeeze(-1)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages)
    return -surrogate.mean() + beta * (lp_new.exp() * (lp_new - lp_old)).sum(-1).mean()
''',
        "adaptive_beta": '''
def adaptive_beta(beta, kl, kl_target):
    if kl < kl_target / 1.5:
        return beta * 2
    if kl > 1.5 * kl_target:
        return beta / 2
    return beta
''',
    },
}


@pytest.mark.parametrize("variant", sorted(WRONG_PIECES))
def test_wrong_pieces_score_zero_and_the_rest_keeps_its_points(tmp_path, variant):
    cells = [c for c in _replace(_master_cells(), "train_ppo_kl", NO_TRAINING) if not c.startswith("check(")]
    for name, src in WRONG_PIECES[variant].items():
        cells = _replace(cells, name, src)
    r = _grade_cells(tmp_path, cells)
    pts = {q["id"]: q["points"] for q in r["questions"]}
    assert pts == {"q1": 0, "q2": 0, "q3": 0, "q4": 0, "q5": 1, "q6": 0}, r["questions"]
    q1 = " | ".join(next(q for q in r["questions"] if q["id"] == "q1")["messages"])
    assert "probes:" in q1 and "core cases" in q1


# ---------------------------------------------------------------- 3. wrong training loops, judged
def _namespace(**replace: str) -> dict:
    """The master's code (without the check cells), with some functions replaced, run here."""
    cells = [c for c in _master_cells() if not c.startswith("check(")]
    for name, src in replace.items():
        cells = _replace(cells, name, src)
    ns: dict = {}
    for c in cells:
        exec(compile(c, EX, "exec"), ns)        # noqa: S102 - the book's own master
    return ns


def _credit(ns: dict, k: int) -> tuple[float, str]:
    """The grader's credit for hidden run ``k`` of question 6, judged by the grader's judge."""
    q = _question("q6")
    case = q.cases[k]
    return q.judge_case(case, None, compare.encode(ns["train_project"](*case.args)))


def _train_source(old: str, new: str) -> str:
    src = next(c for c in _master_cells() if "def train_ppo_kl(" in c)
    src = src.replace("    # BEGIN SOLUTION\n", "").replace("    # END SOLUTION\n", "")
    assert old in src, old
    return src.replace(old, new)


def test_the_master_loop_earns_full_credit_on_a_grader_run():
    credit, why = _credit(_namespace(), 1)
    assert credit == 1.0, why


def test_a_loss_without_kl_term_earns_nothing_from_training():
    ns = _namespace(ppo_kl_loss='''
def ppo_kl_loss(logits_new, logits_old, actions, advantages, beta, eps):
    a = actions.long().unsqueeze(-1)
    ratio = torch.exp(torch.log_softmax(logits_new, -1).gather(-1, a) - torch.log_softmax(logits_old, -1).gather(-1, a)).squeeze(-1)
    return -torch.minimum(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages).mean()
''')
    q = _question("q6")               # a short run: the probe of the loss decides before the return
    result = ns["project"].package(ns["train_ppo_kl"](11, 0.01, budget=20 * 256), ns["ppo_kl_loss"])
    credit, why = q.judge_case(q.cases[0], None, compare.encode(result))
    assert credit == 0.0 and "KL term does not work" in why, why


def test_a_target_written_into_the_loop_loses_the_controller_and_kl_credits():
    src = _train_source("adaptive_beta(beta, kl, kl_target)", "adaptive_beta(beta, kl, 0.01)")
    credit, why = _credit(_namespace(train_ppo_kl=src), 1)        # a run at target 0.005
    assert credit <= 0.4 and "follow the adaptive rule" in why, why


def test_a_beta_never_adapted_loses_the_controller_and_kl_credits():
    src = _train_source("beta = min(max(adaptive_beta(beta, kl, kl_target), 1e-3), 1e3)", "pass")
    credit, why = _credit(_namespace(train_ppo_kl=src), 1)
    assert credit <= 0.4 and "beta changed 0 times" in why, why


def test_one_batch_reused_for_every_update_does_not_learn():
    src = _train_source("    while step + num_envs * num_steps <= budget:\n",
                        "    batch = None\n    while step + num_envs * num_steps <= budget:\n")
    src = src.replace("        with torch.no_grad():\n            for t in range(num_steps):",
                      "        with torch.no_grad():\n            for t in range(num_steps if batch is None else 0):")
    src = src.replace("        o, a, r, te, d, fin = (torch.stack(cols[k]) for k in cols)",
                      "        batch = batch or [torch.stack(cols[k]) for k in cols]\n        o, a, r, te, d, fin = batch")
    credit, why = _credit(_namespace(train_ppo_kl=src), 1)
    assert credit == 0.0, why


def test_fabricated_results_score_zero():
    q = _question("q6")
    case = q.cases[0]
    actor = task.actor_vector(task.make_actor())                 # untrained
    rng = np.random.default_rng(0)
    states = rng.normal(0, 0.05, (256, 4))
    beta = 1.0 * 2.0 ** np.cumsum(rng.choice([-1, 0, 1], 300))
    history = np.column_stack([np.arange(1, 301) * 256, np.full(300, 0.01), beta])
    probe = task.expected_kl_probe()
    for result in ([actor, history, actor, states, probe],                       # an untrained actor
                   [actor * np.nan, history, actor, states, probe],              # NaN parameters
                   "a string", [actor, history[:, :2], actor, states, probe]):   # malformed
        credit, why = q.judge_case(case, None, compare.encode(result))
        assert credit == 0.0, why


# ---------------------------------------------------------------- 4. the CSV's report row
def test_the_csv_exports_the_report_as_an_ungraded_row_with_its_word_count(tmp_path):
    nb = nbformat.read(REPO / "exercises" / f"{EX}.ipynb", as_version=4)
    report = [c for c in nb.cells if "report" in c.metadata.get("tags", [])]
    assert len(report) == 1 and report[0].cell_type == "markdown"
    blank = tmp_path / "bob" / f"{EX}.ipynb"
    blank.parent.mkdir()
    nbformat.write(nb, blank)
    report[0].source = "The median KL was 0.93 x target [0.85, 1.01], seeds 0-9; beta halved 80 times."
    written = tmp_path / "alice" / f"{EX}.ipynb"
    written.parent.mkdir()
    nbformat.write(nb, written)
    assert B.report_words(blank, P.REPORT) == 0
    assert B.report_words(written, P.REPORT) == 15
    (tmp_path / "broken.ipynb").write_text("{not json", encoding="utf-8")
    assert B.report_words(tmp_path / "broken.ipynb", P.REPORT) == 0
    result = {"questions": [{"id": q.id, "points": 0.0, "max_points": float(q.points), "seconds": 0.1}
                            for q in bank.questions(EX)], "score": 0.0, "max_score": 21.0}
    other = {"questions": [{"id": "q1", "points": 4.0, "max_points": 4.0, "seconds": 0.2}],
             "score": 4.0, "max_score": 4.0}
    students = [B.Student("alice", written.parent, submissions=[
                    B.Submission("alice", "ex01_kl_definition.ipynb", tmp_path, "ex01_kl_definition",
                                 result=other),
                    B.Submission("alice", written.name, written, EX, result=result)]),
                B.Student("bob", blank.parent, submissions=[B.Submission("bob", blank.name, blank, EX, result=result)])]
    rows = B.csv_rows({"students": students})
    assert rows[0] == ["student", "notebook", "question", "points", "max", "seconds", "words"]
    assert all(len(r) == len(rows[0]) for r in rows)
    reports = [r for r in rows if r[2] == "report"]
    assert reports == [["alice", written.name, "report", "", "manual", "", "15"],
                       ["bob", blank.name, "report", "", "manual", "", "0"]]
    # every other row keeps its six columns' meaning and an empty "words"
    assert all(r[6] == "" and float(r[3]) <= float(r[4]) for r in rows[1:] if r[2] != "report")
    assert B.student_record(students[0])["notebooks"][1]["report"] == {"graded": "manual", "words": 15}
    assert json.dumps(B.student_record(students[1]))


# ---------------------------------------------------------------- the reference on more seeds
@pytest.mark.slow
def test_the_reference_loop_earns_full_credit_on_more_seeds_than_the_grader_uses():
    ns = _namespace()
    credits = {}
    for seed, target in ((20, 0.01), (21, 0.005), (22, 0.005)):   # the grader's are 11-14
        result = plain(compare.encode(ns["train_project"](seed, target)))
        credits[seed] = task.judge(result, eval_seed=70_000 + seed, kl_target=target)
    # PPO on CartPole is chaotic: another CPU's float rounding gives a seed another run, and a
    # run that learns (return >= 200) may end short of "solved" (475); on one CPU seed 20 ended
    # at 231. So: full credit on most extra seeds, and on every one all but the "solved" part
    assert sum(c == 1.0 for c, _ in credits.values()) >= 2, credits
    assert all(c >= 0.8 for c, _ in credits.values()), credits


# ---------------------------------------------------------------- issue 36: the book's PPO is not offered
LIBRARY_TRAINER = '''
def train_ppo_kl(seed, kl_target=0.01, budget=200_000):
    from klbook_lib import ppo          # hands the training to the book's PPO
    from klbook_grader.tasks import cartpole_kl
    cfg = cartpole_kl.config(seed=seed, kl_target=kl_target, total_timesteps=budget)
    return ppo.train(cfg, progress=False)
'''


def test_a_trainer_that_hands_everything_to_the_books_ppo_scores_zero(tmp_path):
    """Issue 36: ``cartpole_kl._ppo()`` imports ``klbook_lib.ppo`` inside a function, and the
    tasks' sandbox offered everything its modules import inside functions, so a loop calling
    ``klbook_lib.ppo.train`` scored 10/10. Now no sandbox of this project offers the module."""
    from klbook_grader import grader as G

    cells = [c for c in _replace(_master_cells(), "train_ppo_kl", LIBRARY_TRAINER) if not c.startswith("check(")]
    r = _grade_cells(tmp_path, cells)
    pts = {q["id"]: q["points"] for q in r["questions"]}
    assert pts["q6"] == 0, r["questions"]
    assert pts["q1"] == 4 and pts["q3"] == 3, pts            # the pieces keep their points
    assert any("import of klbook_lib.ppo refused" in n for n in r["notes"]), r["notes"]
    from klbook_grader.hidden import bank
    qs = bank.questions(EX)
    for part, _, library in G._sessions(qs, [m for q in qs for m in q.library]):
        assert "klbook_lib.ppo" not in library, (part, library)
