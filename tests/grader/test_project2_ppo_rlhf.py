"""Project 2 (project2_ppo_rlhf): a PPO-RLHF loop on the tiny GPT-2.

1. The references of klbook_grader/hidden/project2.py (plain loops) against independent ones:
   vectorised numpy formulas, a backward GAE recursion over each row's real tokens, the closed form
   of GAE at gamma = lambda = 1, torch for the loss, hand-computed cases.
2. Wrong pieces, scored by the grader's own scoring on every case of their question (in this
   process): each loses its question's points.
3. The tooling: the file name tells the exercise, ``klbook start project2``, the CSV's report row,
   the release's student notebook and task module name no trap.
4. (slow) The outcome: the master's loop earns full credit on a grader run; the same loop without
   the KL penalty loses the KL-budget credit; the same loop reusing its first sampled batch for
   every iteration earns nothing; a per-token reward with the sign flipped earns nothing.
   (Advantages and returns left attached to the value model's graph are NOT caught by the outcome:
   the policy's gradient is the same, and such a loop earns full credit on the grader's seeds.)
Master full marks and stub zero are in tests/grader/test_exercises.py (they cover every exercise).
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from klbook_grader import batch as B
from klbook_grader import compare, start
from klbook_grader.grader import _score_question, find_exercise
from klbook_grader.hidden import bank
from klbook_grader.hidden import project2 as P

EX = "project2_ppo_rlhf"
REPO = Path(__file__).resolve().parents[2]
MASTER = REPO / "exercises" / "masters" / f"{EX}.ipynb"
STUDENT = REPO / "exercises" / f"{EX}.ipynb"


def _question(qid: str):
    return next(q for q in bank.questions(EX) if q.id == qid)


# ---------------------------------------------------------------- 1. references
def _last(mask):
    """Index of each row's last 1 (-1 for none), by flipping."""
    m = np.asarray(mask) > 0
    idx = m.shape[1] - 1 - np.argmax(m[:, ::-1], axis=1)
    return np.where(m.any(1), idx, -1)


def test_mask_and_score_references_against_vectorised_formulas():
    for case in _question("q1").cases:
        ids, eos = case.call_args()
        is_eos = (ids == eos).astype(int)
        want = ((np.cumsum(is_eos, 1) - is_eos) == 0).astype(float)
        np.testing.assert_array_equal(P.mask_reference(ids, eos), want)
    np.testing.assert_array_equal(P.mask_reference(np.array([[5, 2, 2, 7]]), 2), [[1, 1, 0, 0]])
    for case in _question("q2").cases:
        v, m = case.call_args()
        last = _last(m)
        want = np.where(last >= 0, v[np.arange(len(v)), np.maximum(last, 0)], 0.0)
        np.testing.assert_allclose(P.score_reference(v, m), want, rtol=0, atol=0)


def test_rewards_reference_against_a_vectorised_formula_and_by_hand():
    for case in _question("q3").cases:
        lp, ref, s, m, beta = case.call_args()
        with np.errstate(invalid="ignore"):
            want = np.where(m > 0, -beta * (lp - ref), 0.0)
        last = _last(m)
        rows = np.nonzero(last >= 0)[0]
        want[rows, last[rows]] += s[rows]
        np.testing.assert_allclose(P.rewards_reference(*case.call_args()), want, rtol=1e-12, atol=1e-12)
    # by hand: the public padded case, beta 0.2; row 2's last real token is column 1
    got = P.rewards_reference([[-1.0, -1, -1], [-0.5, -2, -9]], [[-2.0, -1, -1.5], [-1.0, -1, -1]],
                              [2.0, -1.0], [[1.0, 1, 1], [1.0, 1, 0]], 0.2)
    np.testing.assert_allclose(got, [[-0.2, 0.0, -0.1 + 2.0], [-0.1, 0.2 - 1.0, 0.0]], rtol=1e-12)


def _gae_backward(r, v, m, gamma, lam):
    out = np.zeros_like(r)
    for b in range(r.shape[0]):
        idx = np.nonzero(m[b] > 0)[0]
        running, nxt = 0.0, 0.0
        for t in idx[::-1]:
            running = r[b, t] + gamma * nxt - v[b, t] + gamma * lam * running
            nxt = v[b, t]
            out[b, t] = running
    return out


def test_gae_reference_against_a_backward_recursion_and_the_closed_form():
    for case in _question("q4").cases:
        args = case.call_args()
        np.testing.assert_allclose(P.gae_reference(*args), _gae_backward(*args), rtol=1e-10, atol=1e-10)
    # gamma = lambda = 1: A_t = (sum of the rewards from t on) - V_t over the real tokens
    rng = np.random.default_rng(0)
    r, v = rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
    m = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 0, 0]], float)
    want = np.where(m > 0, np.cumsum((r * m)[:, ::-1], 1)[:, ::-1] - v, 0.0)
    np.testing.assert_allclose(P.gae_reference(r, v, m, 1.0, 1.0), want, rtol=1e-12, atol=1e-12)


def test_loss_reference_against_torch():
    for case in _question("q5").cases:
        new, old, adv, v, v_old, ret, m, eps, c, vf = case.call_args()
        t = {k: torch.tensor(x, dtype=torch.float64) for k, x in
             dict(new=new, old=old, adv=adv, v=v, v_old=v_old, ret=ret).items()}
        mm = torch.tensor(m > 0)
        ratio = torch.exp(t["new"] - t["old"])[mm]
        a = t["adv"][mm]
        pg = torch.max(-a * ratio, -a * torch.clamp(ratio, 1 - eps, 1 + eps)).mean()
        vv, vo, rr = t["v"][mm], t["v_old"][mm], t["ret"][mm]
        vc = vo + torch.clamp(vv - vo, -c, c)
        want = pg + vf * 0.5 * torch.max((vv - rr) ** 2, (vc - rr) ** 2).mean()
        assert P.loss_reference(*case.call_args()) == pytest.approx(float(want), rel=1e-10, abs=1e-12)


def test_the_tasks_reward_probe_is_the_reference_on_its_inputs():
    from klbook_grader.tasks import rlhf_project as task

    np.testing.assert_allclose(task.expected_reward_probe(), P.rewards_reference(*task.reward_probe_inputs()),
                               rtol=1e-12, atol=1e-12)


def test_registered_with_core_cases_explained_letters_and_its_own_name():
    qs = bank.questions(EX)
    assert sum(q.points for q in qs) == 24 and {q.kind for q in qs} == {"function", "choice"}
    assert all(any(c.core for c in q.cases) for q in qs if q.kind == "function" and q.id != "q7")
    assert set(_question("q6").explain) == {"A", "C", "D"}
    nb = nbformat.read(MASTER, as_version=4)
    assert find_exercise(Path("alice/project2_ppo_rlhf.ipynb"), nb, None)[0] == EX
    assert start.resolve("project2") == EX and start.resolve("project1") == "project1_ppo_kl"
    q7 = _question("q7")
    assert len(q7.cases) == 3 and q7.full_marks_at == 2 and q7.task_data


# ---------------------------------------------------------------- 2. wrong pieces, scored
def _score(qid: str, fn) -> dict:
    """The grader's scoring of ``fn`` on every case of question ``qid`` (run here)."""
    q = _question(qid)
    results = []
    for case in q.cases:
        args = [torch.tensor(a, dtype=torch.float64) if case.torch and isinstance(a, np.ndarray) else a
                for a in case.call_args()]
        try:
            results.append({"value": compare.encode(fn(*args))})
        except Exception as exc:  # noqa: BLE001 - a student's error is a failed case
            results.append({"error": f"{type(exc).__name__}: {exc}"})
    return _score_question(q, q.expected(), {"cases": results}, "no answer")


def _master_ns() -> dict:
    cells = [c.source for c in nbformat.read(MASTER, as_version=4).cells
             if c.cell_type == "code" and not c.source.startswith("check(")]
    ns: dict = {}
    for c in cells:
        exec(compile(c, EX, "exec"), ns)        # noqa: S102 - the book's own master
    return ns


def _last_t(m):
    pos = torch.arange(m.shape[1]).expand_as(m)
    return torch.where(m > 0, pos, torch.full_like(pos, -1)).max(1).values


WRONG = {
    "mask from the pad id (GPT-2's pad is its EOS)": ("q1", lambda ids, eos: (ids != eos).double()),
    "mask without the EOS token": ("q1", lambda ids, eos: (torch.cumsum((ids == eos).long(), 1) == 0).double()),
    "score on the last column (a pad)": ("q2", lambda v, m: v[:, -1]),
    "score at sum(mask) - 1 (wrong with left pads)":
        ("q2", lambda v, m: v.gather(1, (m.sum(1).long() - 1).clamp(min=0)[:, None]).squeeze(1)),
    "KL on the pads too": ("q3", lambda lp, ref, s, m, beta: _score_last(-beta * (lp - ref), s, m)),
    "KL penalty with its sign flipped": ("q3", lambda lp, ref, s, m, beta: _score_last(
        torch.where(m > 0, beta * (lp - ref), torch.zeros_like(lp)), s, m)),
    "score on the last column": ("q3", lambda lp, ref, s, m, beta: torch.where(
        m > 0, -beta * (lp - ref), torch.zeros_like(lp)) + torch.nn.functional.pad(s[:, None], (lp.shape[1] - 1, 0))),
    "GAE that ignores the mask": ("q4", lambda r, v, m, g, l: _gae_unmasked(r, v, g, l) * m),
    "loss without the clip": ("q5", lambda nl, ol, a, v, vo, ret, m, eps, c, vf: _loss(nl, ol, a, v, vo, ret, m,
                                                                                     1e9, c, vf)),
    "loss as a mean over every position, pads included": (
        "q5", lambda nl, ol, a, v, vo, ret, m, eps, c, vf: _loss(nl, ol, a, v, vo, ret, torch.ones_like(m),
                                                                 eps, c, vf)),
    "ratio against the reference, old and new swapped": (
        "q5", lambda nl, ol, a, v, vo, ret, m, eps, c, vf: _loss(ol, nl, a, v, vo, ret, m, eps, c, vf)),
}


def _score_last(rewards, s, m):
    last = _last_t(m)
    rows = torch.nonzero(last >= 0).squeeze(1)
    rewards = torch.nan_to_num(rewards.clone())
    rewards[rows, last[rows]] += s[rows]
    return rewards


def _gae_unmasked(r, v, gamma, lam):
    adv, last = torch.zeros_like(r), torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):
        nxt = v[:, t + 1] if t + 1 < r.shape[1] else torch.zeros_like(last)
        last = r[:, t] + gamma * nxt - v[:, t] + gamma * lam * last
        adv[:, t] = last
    return adv


def _loss(nl, ol, a, v, vo, ret, m, eps, c, vf):
    return _master_ns()["ppo_loss"](nl, ol, a, v, vo, ret, m, eps, c, vf)


def test_the_masters_pieces_score_full_marks_here():
    ns = _master_ns()
    for q in bank.questions(EX):
        if q.kind == "function" and q.id != "q7":
            r = _score(q.id, ns[q.name])
            assert r["points"] == q.points, r["messages"]


@pytest.mark.parametrize("variant", sorted(WRONG))
def test_a_wrong_piece_loses_its_questions_points(variant):
    qid, fn = WRONG[variant]
    r = _score(qid, fn)
    assert r["points"] == 0, (variant, r["messages"])
    assert any("probes:" in m or "public" in m for m in r["messages"])


# ---------------------------------------------------------------- 3. tooling
def test_the_csv_exports_the_report_as_an_ungraded_row(tmp_path):
    nb = nbformat.read(STUDENT, as_version=4)
    report = [c for c in nb.cells if "report" in c.metadata.get("tags", [])]
    assert len(report) == 1 and report[0].cell_type == "markdown"
    blank = tmp_path / "bob" / f"{EX}.ipynb"
    blank.parent.mkdir()
    nbformat.write(nb, blank)
    report[0].source = "At beta 0.1 the score rose by 0.55 [0.49, 0.61] over seeds 0-9."
    written = tmp_path / "alice" / f"{EX}.ipynb"
    written.parent.mkdir()
    nbformat.write(nb, written)
    assert B.report_words(blank, P.REPORT) == 0 and B.report_words(written, P.REPORT) == 13
    result = {"questions": [{"id": q.id, "points": 0.0, "max_points": float(q.points), "seconds": 0.1}
                            for q in bank.questions(EX)], "score": 0.0, "max_score": 24.0}
    students = [B.Student("alice", written.parent, submissions=[B.Submission("alice", written.name, written, EX,
                                                                             result=result)])]
    rows = B.csv_rows({"students": students})
    assert [r for r in rows if r[2] == "report"] == [["alice", written.name, "report", "", "manual", "", "13"]]


def test_klbook_start_copies_the_project(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "klbook_grader.cli", "start", "project2", str(tmp_path / "work")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "work" / f"{EX}.ipynb"
    nb = nbformat.read(out, as_version=4)
    assert nb.metadata["klbook"]["exercise"] == EX
    assert "BEGIN SOLUTION" not in "\n".join(c.source for c in nb.cells)


TRAP_WORDS = ("last pad", "sign flipped", "ignores the mask", "not detached", "one batch", "pads too",
              "wrong token", "flipped")


def test_the_shipped_files_name_no_trap():
    """The student notebook and the task module (both in the release) say what to do, not which
    mistakes the hidden cases catch."""
    text = "\n".join(c.source for c in nbformat.read(STUDENT, as_version=4).cells)
    text += (REPO / "klbook_grader" / "tasks" / "rlhf_project.py").read_text(encoding="utf-8")
    for word in TRAP_WORDS:
        assert word not in text.lower(), word
    assert "BEGIN SOLUTION" not in text


# ---------------------------------------------------------------- 4. the outcome (slow)
def _credit(ns: dict, seed_index: int = 0) -> tuple[float, str]:
    q = _question("q7")
    case = q.cases[seed_index]
    return q.judge_case(case, None, compare.encode(ns["train_project"](*case.args)))


@pytest.mark.slow
def test_the_master_loop_earns_full_credit_on_a_grader_run():
    credit, why = _credit(_master_ns(), 0)
    assert credit == 1.0, why


@pytest.mark.slow
def test_a_loop_without_the_kl_penalty_loses_the_kl_budget_credit():
    ns = _master_ns()
    train = ns["train_rlhf"]
    ns["train_project"] = lambda seed: ns["project"].package(train(seed, beta=0.0), ns["per_token_rewards"])
    credit, why = _credit(ns, 1)
    assert credit <= 0.5, why


@pytest.mark.slow
def test_a_loop_that_reuses_its_first_batch_earns_nothing():
    """The master's loop with ``sample_responses`` answering its first batch for every iteration
    (responses sampled once, not from the current policy): the policy drifts far from pi_ref and
    often stops ending its responses (EOS in 3 to 74 % of the grader's responses). Measured on the grader's seeds 31, 32, 33: credit 0 on each, score -0.4 to -1.9 against
    pi_ref (credit needs +0.3, half of it needs +0.15), KL 23 to 52 nats (budget 4); the master:
    credit 1, score +0.46 to +0.56, KL 1.1 to 3.1. Asserted on two seeds."""
    ns = _master_ns()
    sample, train = ns["sample_responses"], ns["train_rlhf"]

    def train_project(seed):
        first: list = []

        def once(*args):
            if not first:
                first.append(sample(*args))
            return first[0]

        ns["sample_responses"] = once
        try:
            return ns["project"].package(train(seed), ns["per_token_rewards"])
        finally:
            ns["sample_responses"] = sample

    ns["train_project"] = train_project
    for seed_index in (1, 2):
        credit, why = _credit(ns, seed_index)
        assert credit == 0.0, (seed_index, why)


def test_a_per_token_reward_with_the_kl_sign_flipped_earns_nothing_from_training():
    from klbook_grader.hidden.questions import plain
    from klbook_grader.tasks import rlhf_project as task

    def flipped(lp, ref, s, m, beta):
        return _score_last(torch.where(m > 0, beta * (lp - ref), torch.zeros_like(lp)), s, m)

    pipe = task.load()                   # an untrained policy: the probe decides before any sampling
    run = [task.trainable_arrays(task.new_policy(pipe)), np.zeros((3, 2))]
    credit, why = task.judge(plain(compare.encode(task.package(run, flipped))), eval_seed=1)
    assert credit == 0.0 and "per_token_rewards" in why, why
    credit, why = task.judge(plain(compare.encode(task.package(run, _master_ns()["per_token_rewards"]))),
                             eval_seed=1)
    assert credit == 0.0 and "score +0.00" in why, why          # pi_ref itself gains nothing


def test_the_staging_copies_task_data_read_only_and_refuses_a_file(tmp_path):
    from klbook_grader import sandbox

    data = tmp_path / "rlhf-entry"
    (data / "sft").mkdir(parents=True)
    (data / "meta.json").write_text("{}", encoding="utf-8")
    (data / "sft" / "w.bin").write_bytes(b"\0" * 16)
    staging = tmp_path / "staging"
    staging.mkdir()
    sandbox.make_staging(staging, (), (str(data),))
    copied = staging / "data" / "rlhf-entry"
    assert (copied / "meta.json").read_text(encoding="utf-8") == "{}" and (copied / "sft" / "w.bin").stat().st_size == 16
    assert oct((copied / "meta.json").stat().st_mode & 0o777) == oct(0o644)
    assert sandbox.sandbox_env()["KLBOOK_TASK_DATA"] == sandbox.INSIDE_DATA == "/klbook/data"
    other = tmp_path / "staging2"
    other.mkdir()
    with pytest.raises(ValueError, match="data_dirs"):
        sandbox.make_staging(other, (), (str(data / "meta.json"),))
