"""Project 3 (project3_grpo_kl): GRPO with a choice of KL placement on the enumerable sequence model.

1. The references of klbook_grader/hidden/project3.py (plain loops, gradients in closed form)
   against independent ones: the library's GRPO (klbook_lib.rlhf.grpo), the library's estimators and
   exact expected gradients (klbook_lib.seqkl), finite differences, hand-computed cases; the answer
   of the choice question checked with seqkl; the task's probe and problem against plain sums.
2. Wrong pieces, scored by the grader's own scoring on every case of their question (in this
   process): each loses its question's points.
3. The outcome, judged as the grader judges it: the master's loop earns full credit for both
   placements; a loop without the KL term loses the budget credit; a fabricated history, one batch
   reused forever and a loss with the wrong KL term earn nothing.
4. The tooling: the file name tells the exercise, ``klbook start project3``, the CSV's report row,
   the shipped student notebook and task module name no trap; wrapping the library's exact gradient
   in the notebook is refused by the sandbox and scores zero (a grader run, about 5 s).
Master full marks and stub zero are in tests/grader/test_exercises.py (they cover every exercise).
"""
from __future__ import annotations

import itertools
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from klbook_lib import seqkl
from klbook_grader import batch as B
from klbook_grader import compare, start
from klbook_grader.grader import _score_question, find_exercise
from klbook_grader.hidden import bank
from klbook_grader.hidden import project3 as P
from klbook_grader.hidden.questions import plain
from klbook_lib.rlhf import grpo as lib_grpo
from klbook_grader.tasks import grpo_project as task

EX = "project3_grpo_kl"
REPO = Path(__file__).resolve().parents[2]
MASTER = REPO / "exercises" / "masters" / f"{EX}.ipynb"
STUDENT = REPO / "exercises" / f"{EX}.ipynb"


def _question(qid: str):
    return next(q for q in bank.questions(EX) if q.id == qid)


def _t(x):
    return torch.as_tensor(np.asarray(x, dtype=float), dtype=torch.float64)


# ---------------------------------------------------------------- 1. references
def test_advantages_reference_against_the_librarys_grpo_and_by_hand():
    for case in _question("q1").cases:
        r, G = case.call_args()
        got = P.advantages_reference(r, G)
        want = np.zeros(len(r)) if G < 2 else lib_grpo.group_advantages(_t(r), G).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    # by hand: one success in a group of four, mean 1/4, sample std 1/2
    np.testing.assert_allclose(P.advantages_reference([1.0, 0.0, 0.0, 0.0], 4),
                               np.array([0.75, -0.25, -0.25, -0.25]) / (0.5 + 1e-4), rtol=1e-12)


def test_kl_reference_against_the_librarys_estimators():
    for case in _question("q2").cases:
        lp, lq, m, est = case.call_args()
        got = P.kl_reference(lp, lq, m, est)
        real = m > 0
        want = seqkl.kl_per_token(_t(np.where(real, lp, 0.0)), _t(np.where(real, lq, 0.0)), est).numpy()
        np.testing.assert_allclose(got, np.where(real, want, 0.0), rtol=1e-9, atol=1e-12)
        assert np.all(got[~real] == 0.0)


def test_loss_reference_against_the_librarys_grpo_loss():
    for case in _question("q3").cases:
        lp, lo, lq, adv, m, beta, eps, placement = case.call_args()
        b = beta if placement == "loss" else 0.0
        want, _ = lib_grpo.grpo_loss(_t(lp), _t(lo), _t(lq), _t(adv), _t(m) > 0, b, eps, "sequence_mean")
        assert P.loss_reference(*case.call_args()) == pytest.approx(float(want), rel=1e-9, abs=1e-12)


SPACES = ((2, 2, None), (3, 2, None), (3, 3, 0), (4, 4, 0), (2, 4, 1))


def _which_space(seqs, m):
    for V, T, eos in SPACES:
        sp = seqkl.sequence_space(V, T, eos=eos)
        if sp.sequences.shape == seqs.shape and np.array_equal(sp.sequences.numpy(), seqs) and \
                np.array_equal(sp.mask.numpy(), m > 0):
            return sp
    raise AssertionError("a case on a space the test does not know")


def test_gradient_reference_against_seqkl_and_the_exact_kl_gradient():
    for case in _question("q4").cases:
        theta, ref, seqs, m, pidx, placement, aggregation = case.call_args()
        sp = _which_space(seqs, m)
        assert np.array_equal(sp.prefix_index.numpy(), pidx)
        est, returns = ("k1", "total") if placement == "reward" else ("k3", "to_go")
        want = seqkl.expected_gradient(sp, _t(theta), _t(ref), est, placement, returns=returns,
                                       aggregation=aggregation).numpy()
        np.testing.assert_allclose(P.gradient_reference(*case.call_args()), want, rtol=1e-9, atol=1e-12)
        if placement == "reward" and aggregation == "sum":
            exact = seqkl.exact_kl_gradient(sp, _t(theta), _t(ref)).numpy()
            np.testing.assert_allclose(P.gradient_reference(*case.call_args()), exact, rtol=1e-9, atol=1e-12)


def test_the_reward_placement_gradient_is_the_sequence_kl_gradient_by_finite_differences():
    seqs, m, pidx, n = P._space(3, 3, 0)
    rng = np.random.default_rng(7)
    ref = rng.normal(0, 1, (n, 3))
    theta = ref + rng.normal(0, 1, (n, 3))
    sp = seqkl.sequence_space(3, 3, eos=0)
    fd = np.zeros_like(theta)
    h = 1e-6
    for i, j in itertools.product(range(n), range(3)):
        up, down = theta.copy(), theta.copy()
        up[i, j] += h
        down[i, j] -= h
        fd[i, j] = (float(seqkl.exact_kl(sp, _t(up), _t(ref))) - float(seqkl.exact_kl(sp, _t(down), _t(ref)))) / (2 * h)
    np.testing.assert_allclose(P.gradient_reference(theta, ref, seqs, m, pidx, "reward", "sum"), fd,
                               rtol=1e-5, atol=1e-8)


def test_the_choice_answer_is_true_and_the_others_are_not():
    """q5: on-policy, summed over tokens, only the KL in the reward has grad KL(pi_theta || pi_ref)."""
    assert _question("q5").ref == "B" and set(_question("q5").explain) == {"A", "C", "D"}
    for V, T, eos, seed in ((3, 2, None, 0), (4, 4, 0, 1), (2, 4, 1, 2)):
        sp = seqkl.sequence_space(V, T, eos=eos)
        ref = seqkl.random_logits(sp, seed=seed)
        theta = ref + seqkl.random_logits(sp, seed=seed + 10)
        exact = seqkl.exact_kl_gradient(sp, theta, ref)
        reward = seqkl.expected_gradient(sp, theta, ref, "k1", "reward", returns="total")
        loss = seqkl.expected_gradient(sp, theta, ref, "k3", "loss")
        assert torch.allclose(reward, exact, rtol=1e-9, atol=1e-12)
        assert seqkl.gradient_error(loss, exact)["rel_error"] > 0.05


def test_the_task_problem_against_plain_sums():
    seqs, mask, pidx = task.space_arrays()
    assert seqs.shape == (121, 4) and task.n_prefixes() == 40
    lengths = mask.sum(1).long()
    rewards = task.reward_table()
    for n in range(121):
        toks = seqs[n, :lengths[n]].tolist()
        want = float(len(toks) >= 3 and toks[-1] == 0 and 1 in toks[:-1])
        assert rewards[n] == want
    ref = task.reference_logits()
    logp = torch.log_softmax(ref, -1)
    probs = torch.tensor([float(sum(logp[pidx[n, t], seqs[n, t]] for t in range(lengths[n])).exp())
                          for n in range(121)], dtype=torch.float64)
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-12)
    base = task.evaluate(ref)
    assert base["expected_reward"] == pytest.approx(float((probs * rewards).sum()), rel=1e-12)
    assert 0.15 <= base["expected_reward"] <= 0.35 and base["kl"] == pytest.approx(0.0, abs=1e-12)
    # the optimum of E[r] - beta KL at the graded beta gains enough within the budget: the milestones are reachable
    opt = seqkl.optimal_logits(task._space(), ref, rewards, task.BETA)
    best = task.evaluate(opt)
    assert best["expected_reward"] - base["expected_reward"] >= task.REWARD_GAIN and best["kl"] <= task.KL_BUDGET
    # sampling and the log-probabilities of a batch agree with the table
    gen = torch.Generator().manual_seed(0)
    tokens, m, index = task.sample(ref, 4000, gen)
    assert torch.equal(tokens, seqs[index]) and torch.equal(m, mask[index])
    np.testing.assert_allclose(task.token_logprobs(ref, tokens, m).sum(1).exp().numpy(), probs[index].numpy(),
                               rtol=1e-12)
    freq = torch.bincount(index, minlength=121).double() / 4000
    se = (probs * (1 - probs) / 4000).sqrt()
    assert bool(((freq - probs).abs() <= 5 * se + 1e-3).all())     # 5 standard errors per response


def test_the_tasks_probe_is_the_reference_on_its_inputs():
    lp, old, ref, adv, mask = task.loss_probe_inputs()
    for placement in ("reward", "loss"):
        want = task.expected_loss_probe(placement)
        beta, eps = task.PROBE_BETA, task.PROBE_CLIP
        assert want[0] == pytest.approx(P.loss_reference(lp, old, ref, adv, mask, beta, eps, placement)
                                        - P.loss_reference(lp, old, ref, adv, mask, 0.0, eps, placement), abs=1e-12)
        # the gradient's entries by finite differences of the reference's difference
        h = 1e-6
        for b, t in ((0, 0), (2, 1), (5, 2)):
            up, down = lp.copy(), lp.copy()
            up[b, t] += h
            down[b, t] -= h
            fd = ((P.loss_reference(up, old, ref, adv, mask, beta, eps, placement)
                   - P.loss_reference(up, old, ref, adv, mask, 0.0, eps, placement))
                  - (P.loss_reference(down, old, ref, adv, mask, beta, eps, placement)
                     - P.loss_reference(down, old, ref, adv, mask, 0.0, eps, placement))) / (2 * h)
            assert want[1 + b * lp.shape[1] + t] == pytest.approx(fd, rel=1e-5, abs=1e-9)


def test_registered_with_core_cases_explained_letters_and_its_own_name():
    qs = bank.questions(EX)
    assert sum(q.points for q in qs) == 22 and {q.kind for q in qs} == {"function", "choice"}
    assert all(any(c.core for c in q.cases) for q in qs if q.kind == "function" and q.id != "q6")
    nb = nbformat.read(MASTER, as_version=4)
    assert find_exercise(Path("alice/project3_grpo_kl.ipynb"), nb, None)[0] == EX
    assert start.resolve("project3") == EX
    q6 = _question("q6")
    assert len(q6.cases) == 6 and q6.full_marks_at == 5 and q6.timeout == P.TIMEOUT
    assert {c.args[1] for c in q6.cases} == {"reward", "loss"}
    assert "klbook_lib.seqkl" not in q6.library and "klbook_lib.seqkl" in q6.task_library


# ---------------------------------------------------------------- 2. wrong pieces, scored
def _score(qid: str, fn) -> dict:
    """The grader's scoring of ``fn`` on every case of question ``qid`` (run here)."""
    q = _question(qid)
    results = []
    for case in q.cases:
        args = [torch.tensor(a, dtype=torch.float64) if case.torch and isinstance(a, np.ndarray) else a
                for a in case.call_args()]
        try:
            if case.grad is not None:         # as the runner does: autograd w.r.t. the first argument
                x = args[0].detach().clone().requires_grad_(True)
                out = fn(x, *args[1:])
                if not (isinstance(out, torch.Tensor) and out.requires_grad):
                    raise RuntimeError("no gradient")
                (g,) = torch.autograd.grad(out.sum(), x, allow_unused=True)
                results.append({"value": compare.encode(torch.zeros_like(x) if g is None else g)})
            else:
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


NS = _master_ns()


def _whole_batch(r, G):
    return (r - r.mean()) / (r.std() + 1e-4) if G > 1 else torch.zeros_like(r)


def _kl(lp, lq, m, est, inverted=False, unmasked=False, sign=1.0):
    l = lp - lq
    k = l if est == "k1" else ((torch.expm1(l) - l) if inverted else (torch.expm1(-l) + l))
    return sign * k if unmasked else torch.where(m > 0, sign * k, torch.zeros_like(k))


def _loss(lp, lo, lq, a, m, beta, eps, placement, k="k3", sign=1.0, clip=True, pads=False,
          token_mean=False, kl_always=False):
    mm = torch.ones_like(m) > 0 if pads else m > 0
    zero = torch.zeros_like(lp)
    ratio = torch.exp(torch.where(mm, lp - lo, zero))
    adv = a[:, None]
    clipped = ratio.clamp(1 - eps, 1 + eps) if clip else ratio
    tok = -torch.minimum(ratio * adv, clipped * adv)
    if placement == "loss" or kl_always:
        l = torch.where(mm, lp - lq, zero)
        tok = tok + sign * beta * (l if k == "k1" else torch.expm1(-l) + l)
    tok = torch.where(mm, tok, zero)
    if token_mean:
        return tok.sum() / mm.sum()
    return (tok.sum(1) / mm.sum(1).clamp(min=1)).mean()


def _grad(theta, ref, seqs, m, pidx, placement, aggregation, variant):
    z = theta.detach().clone().requires_grad_(True)
    mm = m > 0
    seq, rows = seqs.long(), pidx.long()
    lp = torch.where(mm, torch.log_softmax(z, -1)[rows, seq], torch.zeros_like(m))
    lq = torch.where(mm, torch.log_softmax(ref, -1)[rows, seq], torch.zeros_like(m))
    prob = lp.sum(1).exp()
    if variant != "weights differentiated":
        prob = prob.detach()
    length = torch.full_like(prob, m.shape[1]) if variant == "divided by T" else mm.sum(1).double()
    c = torch.ones_like(prob) if aggregation == "sum" else 1.0 / length
    l = lp - lq
    if placement == "reward":
        per = (l.sum(1) if variant == "K differentiated" else l.sum(1).detach() * lp.sum(1))
    else:
        per = (l if variant == "k1 differentiated" else torch.expm1(-l) + l).sum(1)
    (g,) = torch.autograd.grad((prob * c * per).sum(), z)
    return g


WRONG = {
    "advantages normalised across the whole batch": ("q1", _whole_batch),
    "k3's ratio inverted": ("q2", lambda lp, lq, m, est: _kl(lp, lq, m, est, inverted=True)),
    "KL estimates read on the pads": ("q2", lambda lp, lq, m, est: torch.nan_to_num(_kl(lp, lq, m, est, unmasked=True))),
    "sign of the KL flipped (estimates)": ("q2", lambda lp, lq, m, est: _kl(lp, lq, m, est, sign=-1.0)),
    "sign of the KL flipped (loss)": ("q3", lambda *a: _loss(*a, sign=-1.0)),
    "k1 in the loss instead of k3": ("q3", lambda *a: _loss(*a, k="k1")),
    "clip ignored": ("q3", lambda *a: _loss(*a, clip=False)),
    "pads counted in the means": ("q3", lambda *a: torch.nan_to_num(_loss(*a, pads=True))),
    "one mean over the batch's tokens": ("q3", lambda *a: _loss(*a, token_mean=True)),
    "the k3 term also with the KL in the reward": ("q3", lambda *a: _loss(*a, kl_always=True)),
    "the reward's KL differentiated as a loss": ("q4", lambda *a: _grad(*a, "K differentiated")),
    "k1 differentiated in the loss": ("q4", lambda *a: _grad(*a, "k1 differentiated")),
    "the probabilities pi(y) differentiated too": ("q4", lambda *a: _grad(*a, "weights differentiated")),
    "divided by the longest length": ("q4", lambda *a: _grad(*a, "divided by T")),
}


def test_the_masters_pieces_score_full_marks_here():
    for q in bank.questions(EX):
        if q.kind == "function" and q.id != "q6":
            r = _score(q.id, NS[q.name])
            assert r["points"] == q.points, r["messages"]
    # and the written-out variants above are right when nothing is wrong with them
    assert _score("q3", _loss)["points"] == 3 and _score("q4", lambda *a: _grad(*a, ""))["points"] == 4


@pytest.mark.parametrize("variant", sorted(WRONG))
def test_a_wrong_piece_loses_its_questions_points(variant):
    qid, fn = WRONG[variant]
    r = _score(qid, fn)
    assert r["points"] == 0, (variant, r["messages"])


# ---------------------------------------------------------------- 3. the outcome
def _judge(run_or_packaged, placement, package=True, loss=None):
    result = task.package(run_or_packaged, loss or NS["grpo_loss"], placement) if package else run_or_packaged
    return task.judge(plain(compare.encode(result)), placement=placement)


@pytest.mark.parametrize("placement", ["reward", "loss"])
def test_the_master_loop_earns_full_credit_on_a_grader_run(placement):
    q = _question("q6")
    case = next(c for c in q.cases if c.args[1] == placement)
    credit, why = q.judge_case(case, None, compare.encode(NS["train_project"](*case.args)))
    assert credit == 1.0, why


@pytest.mark.parametrize("placement", ["reward", "loss"])
def test_a_loop_without_the_kl_term_loses_the_kl_budget_credit(placement):
    credit, why = _judge(NS["train_grpo"](41, placement, beta=0.0), placement)
    assert credit == 0.5 and "exact KL" in why, why


def test_a_fabricated_history_earns_nothing():
    logits, history, snapshots = NS["train_grpo"](42, "loss")
    fake = history.copy()
    fake[:, 1] = np.linspace(0.01, 0.5, len(fake))       # a tidy KL that was never measured
    credit, why = _judge([logits, fake, snapshots], "loss")
    assert credit == 0.0 and "logged KL" in why, why
    # snapshots that are not the run's own (the final table repeated) fail the same check
    credit, why = _judge([logits, history, np.repeat(logits[None], len(history), 0)], "loss")
    assert credit == 0.0, why


def test_one_batch_reused_forever_earns_nothing():
    import types

    real_sample, first = task.sample, {}

    def sample_once(logits, n, generator):
        if "batch" not in first:
            first["batch"] = real_sample(logits, n, generator)
        return first["batch"]

    ns = dict(NS)
    ns["project"] = types.SimpleNamespace(**{k: getattr(task, k) for k in dir(task) if not k.startswith("__")})
    ns["project"].sample = sample_once
    loop = next(c.source for c in nbformat.read(MASTER, as_version=4).cells if c.source.startswith("def train_grpo"))
    exec(compile(loop, EX, "exec"), ns)              # noqa: S102 - the master's loop, drawing one batch only
    credit, why = _judge(ns["train_grpo"](43, "reward"), "reward")
    assert credit == 0.0 and "fresh batches" in why, why


def test_a_loss_with_the_wrong_kl_term_earns_nothing_from_training():
    run = NS["train_grpo"](41, "loss", iterations=5)
    for wrong in (lambda *a: _loss(*a, k="k1"), lambda *a: _loss(*a, sign=-1.0)):
        credit, why = _judge(run, "loss", loss=wrong)
        assert credit == 0.0 and "grpo_loss" in why, why
    credit, why = _judge(NS["train_grpo"](41, "reward", iterations=5), "reward", loss=lambda *a: _loss(*a, kl_always=True))
    assert credit == 0.0 and "grpo_loss" in why, why


def test_pi_ref_itself_gains_nothing():
    ref = task.reference_logits().numpy()
    snaps = np.repeat(ref[None], 5, 0)
    snaps[4:, 0, 0] += 1e-3          # a row first moved after the third iteration
    hist = np.array([[0.2, task.evaluate(s)["kl"]] for s in snaps])
    credit, why = _judge([snaps[-1], hist, snaps], "reward")
    assert credit == 0.0 and "0.000 against" in why, why


# ---------------------------------------------------------------- 4. tooling
def test_the_csv_exports_the_report_as_an_ungraded_row(tmp_path):
    nb = nbformat.read(STUDENT, as_version=4)
    report = [c for c in nb.cells if "report" in c.metadata.get("tags", [])]
    assert len(report) == 1 and report[0].cell_type == "markdown"
    report[0].source = "With the KL in the reward the KL was 1.1 [1.07, 1.14] over seeds 0-9."
    written = tmp_path / "alice" / f"{EX}.ipynb"
    written.parent.mkdir()
    nbformat.write(nb, written)
    assert B.report_words(written, P.REPORT) == 15     # counted by hand
    result = {"questions": [{"id": q.id, "points": 0.0, "max_points": float(q.points), "seconds": 0.1}
                            for q in bank.questions(EX)], "score": 0.0, "max_score": 22.0}
    students = [B.Student("alice", written.parent, submissions=[B.Submission("alice", written.name, written, EX,
                                                                             result=result)])]
    rows = B.csv_rows({"students": students})
    assert [r for r in rows if r[2] == "report"] == [["alice", written.name, "report", "", "manual", "", "15"]]


def test_klbook_start_copies_the_project(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "klbook_grader.cli", "start", "project3", str(tmp_path / "work")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    nb = nbformat.read(tmp_path / "work" / f"{EX}.ipynb", as_version=4)
    assert nb.metadata["klbook"]["exercise"] == EX
    assert "BEGIN SOLUTION" not in "\n".join(c.source for c in nb.cells)


TRAP_WORDS = ("flipped", "inverted", "whole batch", "across the batch", "one batch", "reused", "fabricat",
              "k1 in the loss", "ignored", "pads counted", "leak")


def test_the_shipped_files_name_no_trap():
    """The student notebook and the task module (both in the release) say what to do, not which
    mistakes the hidden cases catch."""
    text = "\n".join(c.source for c in nbformat.read(STUDENT, as_version=4).cells)
    text += (REPO / "klbook_grader" / "tasks" / "grpo_project.py").read_text(encoding="utf-8")
    for word in TRAP_WORDS:
        assert word not in text.lower(), word
    assert "BEGIN SOLUTION" not in text


def test_the_cells_cannot_import_the_exact_sums():
    """The task module the cells import reaches seqkl only inside its functions."""
    from klbook_grader import sandbox

    closure = sandbox.library_closure(_question("q1").library)
    assert closure == (P.TASK,), closure


def test_wrapping_the_librarys_exact_gradient_scores_zero(tmp_path):
    from klbook_grader.grader import grade

    wrapper = '''
import torch
from klbook_lib import seqkl

def expected_kl_gradient(logits, ref_logits, sequences, mask, prefix_index, placement, aggregation):
    V, T = logits.shape[1], sequences.shape[1]
    m = mask > 0
    short = m.sum(1) < T
    eos = int(sequences[short][0][int(m.sum(1)[short][0]) - 1]) if bool(short.any()) else None
    sp = seqkl.sequence_space(V, T, eos=eos)
    est, ret = ("k1", "total") if placement == "reward" else ("k3", "to_go")
    return seqkl.expected_gradient(sp, logits, ref_logits, est, placement, returns=ret, aggregation=aggregation)
'''
    cells = [c.source for c in nbformat.read(MASTER, as_version=4).cells if c.cell_type == "code"][:1] + [wrapper]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    path = tmp_path / f"{EX}.ipynb"
    nbformat.write(nb, path)
    r = grade(path)
    q4 = next(q for q in r["questions"] if q["id"] == "q4")
    assert q4["points"] == 0, q4
    assert any("refused while grading" in n for n in r["notes"]), r["notes"]


# ---------------------------------------------------------------- issue 36: the loss's gradient
def test_the_loss_gradient_reference_against_finite_differences_of_the_loss_reference():
    q = _question("q3")
    grads = [c for c in q.cases if c.grad is not None]
    assert len(grads) == 2 and {c.args[-1] for c in grads} == {"loss", "reward"}
    for c in grads:
        args = c.call_args()
        g = c.grad(*args)
        fd = np.zeros_like(args[0])
        for idx in np.ndindex(fd.shape):
            up = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            down = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            up[0][idx] += 1e-6
            down[0][idx] -= 1e-6
            fd[idx] = (P.loss_reference(*up) - P.loss_reference(*down)) / 2e-6
        assert np.abs(fd - g).max() < 1e-7 and np.abs(g).max() > 0.1


def test_a_loss_with_a_detached_ratio_scores_zero():
    """Issue 36: q3 compared the loss's value only, so a ratio computed from detached
    log-probabilities (the right number, and no gradient through the surrogate) earned 3/3."""
    def detached(lp, lo, lq, a, m, beta, eps, placement):
        mm = m > 0
        nil = torch.zeros_like(lp)
        ratio = torch.exp(torch.where(mm, lp.detach() - lo, nil))
        adv = a[:, None]
        per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
        if placement == "loss":
            per_token = per_token + beta * NS["per_token_kl"](lp, lq, m, "k3")
        per_token = torch.where(mm, per_token, nil)
        return (per_token.sum(1) / mm.sum(1).clamp(min=1)).mean()

    r = _score("q3", detached)
    assert r["points"] == 0, r["messages"]
    assert any("probes: the gradient of the loss" in m for m in r["messages"]), r["messages"]


def _q6_results(run_for_case) -> dict:
    q = _question("q6")
    results = [{"value": compare.encode(run_for_case(c))} for c in q.cases]
    return _score_question(q, q.expected(), {"cases": results}, "no answer")


def test_the_same_run_returned_for_every_seed_earns_nothing():
    """Issue 36: a run that computes its table exactly (seqkl's optimum, exact gradient ascent)
    returns the same thing on every seed, and scored 10/10. A run that samples never does: runs
    of one placement that return identical results earn nothing."""
    runs = {p: NS["train_project"](41, p) for p in ("reward", "loss")}
    r = _q6_results(lambda c: runs[c.args[1]])          # the seed ignored
    assert r["points"] == 0, r["messages"]
    assert sum("returned exactly what the run of case" in m for m in r["messages"]) == 6
    honest = _q6_results(lambda c: NS["train_project"](*c.args))
    assert honest["points"] == 10, honest["messages"]


def test_a_placement_whose_runs_all_fail_costs_that_placements_points():
    """Issue 36: five runs' credits out of six, pooled, let a bug confined to one placement cost
    at most 1 of 10 points. Each placement now earns its own half."""
    q = _question("q6")
    assert sorted(map(sorted, q.run_groups)) == [[0, 2, 4], [1, 3, 5]]
    good = {c.args: NS["train_project"](*c.args) for c in q.cases if c.args[1] == "reward"}
    r = _q6_results(lambda c: good.get(c.args, f"no run (seed {c.args[0]})"))   # every "loss" run fails
    assert r["points"] == 5, r["messages"]
