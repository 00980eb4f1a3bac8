"""The autograder: broken and cheating submissions, the CLI, and the reference solutions.

Submissions are built from the ex01 master (12 points: q1 kl_categorical 4, q2
kl_from_logits 4, q3 a number 2, q4 a letter 2) with cells replaced or added, and each
test checks that the submission gets exactly the score it deserves. The attacks of
issue 13 on the sandbox itself are in ``tests/grader/test_sandbox.py``.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest
from scipy import integrate, optimize, spatial, stats

from grading_helpers import FULL, WRONG_ANSWERS, master_cells, messages, points, write_nb
from klbook_grader import compare, grader
from klbook_grader.grader import GraderError, grade
from klbook_grader.hidden import bank
from klbook_grader.hidden import reference as R

REPO = Path(__file__).resolve().parents[2]
MASTER = REPO / "exercises" / "masters" / "ex01_kl_definition.ipynb"
KLBOOK = [sys.executable, "-m", "klbook_grader.cli"]


def replace_cell(cells: list[str], marker: str, new: str | None) -> list[str]:
    """Replace (or drop, with ``new=None``) the one cell containing ``marker``."""
    hits = [i for i, c in enumerate(cells) if marker in c]
    assert len(hits) == 1, marker
    out = list(cells)
    if new is None:
        del out[hits[0]]
    else:
        out[hits[0]] = new
    return out


# ---------------------------------------------------------------- broken notebooks
def test_syntax_error_costs_only_its_cell(tmp_path):
    cells = replace_cell(master_cells(), "def kl_categorical", "def kl_categorical(p, q):\n    return (")
    r = grade(write_nb(tmp_path, cells))
    assert points(r) == {**FULL, "q1": 0}
    assert "not defined" in messages(r, "q1")
    assert any("SyntaxError" in n for n in r["notes"])


def test_exception_in_a_cell_is_reported_and_the_rest_still_runs(tmp_path):
    r = grade(write_nb(tmp_path, ["1 / 0"] + master_cells()))
    assert r["score"] == 12
    assert any("ZeroDivisionError" in n for n in r["notes"])


def test_a_function_that_raises_on_some_cases_gets_partial_credit(tmp_path):
    fn = '''
def kl_categorical(p, q):
    p, q = np.asarray(p, float), np.asarray(q, float)
    if np.any(p == 0) or np.any(q == 0):
        raise ValueError("cannot handle zeros")
    return float(np.sum(p * np.log(p / q)))
'''
    r = grade(write_nb(tmp_path, replace_cell(master_cells(), "def kl_categorical", fn)))
    n_cases = len(bank.questions("ex01_kl_definition")[0].cases)
    p = bank.questions("ex01_kl_definition")[0]
    zero_cases = sum(bool(np.any(np.asarray(c.args[0]) == 0) or np.any(np.asarray(c.args[1]) == 0))
                     for c in p.cases)
    assert points(r)["q1"] == pytest.approx(4 * (n_cases - zero_cases) / n_cases)
    assert 0 < points(r)["q1"] < 4
    assert "raised ValueError: cannot handle zeros" in messages(r, "q1")


def test_infinite_loop_in_a_cell_is_stopped_and_grading_goes_on(tmp_path):
    t = time.monotonic()
    r = grade(write_nb(tmp_path, ["while True:\n    pass"] + master_cells()), cell_timeout=1.5)
    assert r["score"] == 12
    assert any("stopped after 1.5 s" in n for n in r["notes"])
    assert time.monotonic() - t < 30


def test_infinite_loop_in_a_function_times_out_that_question(tmp_path):
    fn = "def kl_categorical(p, q):\n    while True:\n        pass"
    # the master's check("q1") cell loops too: the cell time limit stops it
    r = grade(write_nb(tmp_path, replace_cell(master_cells(), "def kl_categorical", fn)),
              call_timeout=0.5, cell_timeout=1.5)
    assert points(r) == {**FULL, "q1": 0}
    assert "did not return within 0.5 s" in messages(r, "q1")
    assert "skipped after an earlier call timed out" in messages(r, "q1")


def test_a_cell_that_disables_the_alarm_is_stopped_from_outside_and_costs_only_itself(tmp_path):
    loop = ("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
            "while True:\n    try:\n        pass\n    except BaseException:\n        pass")
    t = time.monotonic()
    r = grade(write_nb(tmp_path, master_cells()[:3] + [loop] + master_cells()[3:]), timeout=30,
              cell_timeout=1)
    assert time.monotonic() - t < 20
    assert r["score"] == 12
    assert r["runs"] == 2                     # run again without the cell that hung
    assert any(n.startswith("cell 4 failed: stopped from outside") for n in r["notes"]), r["notes"]


def test_the_total_time_limit_stops_a_notebook_and_says_so(tmp_path):
    slow = "import time\nfor _ in range(100):\n    time.sleep(0.5)"
    t = time.monotonic()
    r = grade(write_nb(tmp_path, [slow] + master_cells()), timeout=3, cell_timeout=60)
    assert time.monotonic() - t < 15
    assert r["score"] == 0
    assert any("total time limit of 3 s" in n for n in r["notes"])
    assert all(m.startswith("not graded: the notebook was stopped") for q in r["questions"]
               for m in q["messages"])


def test_nan_and_infinity_are_wrong_answers(tmp_path):
    cells = replace_cell(master_cells(), "def kl_categorical",
                         "def kl_categorical(p, q):\n    return float('nan')")
    cells = replace_cell(cells, "answer_q3 =", "answer_q3 = float('inf')")
    r = grade(write_nb(tmp_path, cells))
    assert points(r) == {**FULL, "q1": 0, "q3": 0}
    assert "returned NaN" in messages(r, "q1")


@pytest.mark.parametrize("body, expect", [
    ("return np.zeros((1, 1, 1))", "wrong shape"),
    ("return 'a string'", "a string"),
    ("return {'kl': 1.0}", "type dict"),
    ("return None", "None"),
    ("return [[1.0], [2.0, 3.0]]", "ragged"),
    ("return object()", "type object"),
])
def test_wrong_shapes_and_types_score_zero_with_a_reason(tmp_path, body, expect):
    fn = f"def kl_from_logits(logits_p, logits_q):\n    {body}"
    r = grade(write_nb(tmp_path, replace_cell(master_cells(), "def kl_from_logits", fn)))
    assert points(r) == {**FULL, "q2": 0}
    assert expect in messages(r, "q2")


def test_wrong_types_for_value_and_choice_answers(tmp_path):
    cells = replace_cell(master_cells(), "answer_q3 =", "answer_q3 = {'value': 0.44}")
    cells = replace_cell(cells, "answer_q4 =", "answer_q4 = 3")
    r = grade(write_nb(tmp_path, cells))
    assert points(r) == {**FULL, "q3": 0, "q4": 0}
    assert "type dict" in messages(r, "q3")
    assert "one of the letters" in messages(r, "q4")


def test_huge_output_is_discarded_not_fatal(tmp_path):
    flood = ("import os, sys\nfor _ in range(300):\n    print('x' * 100_000)\n"
             "os.write(1, b'y' * 30_000_000)\nsys.__stderr__.write('z' * 5_000_000)")
    r = grade(write_nb(tmp_path, [flood] + master_cells()))
    assert r["score"] == 12
    assert any("printed more than" in n for n in r["notes"])


def test_missing_function_scores_zero_for_that_question(tmp_path):
    r = grade(write_nb(tmp_path, replace_cell(master_cells(), "def kl_from_logits", None)))
    assert points(r) == {**FULL, "q2": 0}
    assert "`kl_from_logits` is not defined" in messages(r, "q2")


def test_sys_exit_is_caught_per_cell(tmp_path):
    r = grade(write_nb(tmp_path, ["import sys\nsys.exit(3)"] + master_cells() + ["raise SystemExit"]))
    assert r["score"] == 12
    assert any("called sys.exit(3)" in n for n in r["notes"])


def test_hard_exit_of_the_process_costs_only_its_cell(tmp_path):
    cells = master_cells()
    r = grade(write_nb(tmp_path, cells[:2] + ["import os\nos._exit(0)"] + cells[2:]))
    assert r["score"] == 12
    assert any(n.startswith("cell 3 failed: the notebook's process ended") for n in r["notes"])


def test_a_crash_inside_a_function_costs_only_its_question(tmp_path):
    fn = "def kl_from_logits(logits_p, logits_q):\n    import os\n    os._exit(1)"
    cells = replace_cell(master_cells(), "def kl_from_logits", fn)
    cells = replace_cell(cells, 'check("q2")', "pass")
    r = grade(write_nb(tmp_path, cells))
    assert points(r) == {**FULL, "q2": 0}
    assert "the notebook's process ended during this call" in messages(r, "q2")


def test_deleting_files_only_touches_the_temporary_copy(tmp_path):
    decoy = tmp_path / "precious"
    decoy.mkdir()
    (decoy / "data.txt").write_text("keep me")
    sub = tmp_path / "ex01_kl_definition.ipynb"
    vandal = f'''
import os, shutil
for f in os.listdir("."):
    shutil.rmtree(f) if os.path.isdir(f) else os.remove(f)
for target in ({str(decoy)!r}, {str(REPO / "exercises")!r}):
    try:
        shutil.rmtree(target)
    except OSError as exc:
        print(exc)
os.remove({str(sub)!r})
'''
    path = write_nb(tmp_path, master_cells() + [vandal])
    assert path == sub
    r = grade(path)
    assert (decoy / "data.txt").read_text() == "keep me"
    assert sub.is_file() and (REPO / "exercises" / "ex01_kl_definition.ipynb").is_file()
    assert r["score"] == 12
    assert any(n.startswith("cell 10 failed: FileNotFoundError") for n in r["notes"]), r["notes"]


def test_memory_bombs_fork_bombs_and_other_processes_are_contained(tmp_path):
    # a bounded "fork bomb" (300 sleeping children): the process limit stops it
    forks = ("import os, time\nfor i in range(300):\n    if os.fork() == 0:\n"
             "        time.sleep(60)\n        os._exit(0)")
    cells = ["big = bytearray(6 << 30)",
             f"import os\nstolen = open('/proc/{os.getpid()}/cmdline').read()",
             "import os\nif os.fork() == 0:\n    x = 1   # the child leaves the cell and ends",
             forks] + master_cells()
    t = time.monotonic()
    r = grade(write_nb(tmp_path, cells))
    assert time.monotonic() - t < 30
    assert r["score"] == 12
    notes = " ".join(r["notes"])
    assert "cell 1 failed: MemoryError" in notes
    assert "cell 2 failed: FileNotFoundError" in notes          # the grader is not in its world
    assert " cell 3 failed" not in " " + notes
    assert "cell 4 failed: BlockingIOError" in notes, notes


def test_ipython_magics_are_skipped_not_fatal(tmp_path):
    cells = ["%matplotlib inline\n!ls /\n" + master_cells()[0]] + master_cells()[1:] + ["%%time\nx = 1"]
    r = grade(write_nb(tmp_path, cells))
    assert r["score"] == 12
    assert grader.SANDBOX_NOTE + "skipped the IPython magic %matplotlib" in r["notes"]   # the runner's word


def test_ordinary_file_work_in_the_temporary_directory_is_allowed(tmp_path):
    work = ("import os, pathlib, tempfile\nopen('f.txt', 'w').write('hi')\nos.utime('f.txt', (1, 2))\n"
            "os.chmod('f.txt', 0o600)\nos.rename('f.txt', 'g.txt')\nos.mkdir('d')\n"
            "pathlib.Path('d/x').write_text('1')\ntempfile.NamedTemporaryFile().close()\n"
            "assert open('g.txt').read() == 'hi'")
    r = grade(write_nb(tmp_path, [work] + master_cells()))
    assert r["score"] == 12 and r["notes"] == []


def test_empty_and_malformed_notebooks_score_zero(tmp_path):
    empty = tmp_path / "ex01_kl_definition.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), empty)
    r = grade(empty)
    assert r["score"] == 0 and any("no code" in n for n in r["notes"])
    for i, text in enumerate(["", "{not json", "[1, 2, 3]", '{"cells": 5}',
                              '{"cells": [{"cell_type": "code", "source": 7}]}', "\xff\xfe"]):
        bad = tmp_path / f"ex01_bad{i}.ipynb"
        bad.write_bytes(text.encode("latin-1"))
        r = grade(bad)
        assert r["score"] == 0 and r["max_score"] == 12
        assert any("could not be read" in n for n in r["notes"]), r["notes"]
        assert all("messages" in q for q in r["questions"])


# ---------------------------------------------------------------- cheating
def test_monkeypatching_numpy_comparisons_changes_nothing(tmp_path):
    patch = '''
import builtins, math
np.allclose = lambda *a, **k: True
np.isclose = lambda *a, **k: np.True_
np.array_equal = lambda *a, **k: True
np.testing.assert_allclose = lambda *a, **k: None
math.isclose = lambda *a, **k: True
builtins.abs = lambda x: 0
'''
    cells = master_cells()[:1] + [patch, WRONG_ANSWERS]
    r = grade(write_nb(tmp_path, cells))
    assert r["score"] == 0


def test_monkeypatching_torch_comparisons_changes_nothing(tmp_path):
    master = REPO / "exercises" / "masters" / "ex08_vi_elbo_dpo.ipynb"
    cells = [c.source for c in nbformat.read(master, as_version=4).cells if c.cell_type == "code"]
    wrong = ("torch.allclose = lambda *a, **k: True\ntorch.isclose = lambda *a, **k: torch.tensor(True)\n"
             "torch.equal = lambda *a, **k: True\n"
             "def dpo_loss(a, b, c, d, beta):\n    return torch.zeros_like(a)")
    r = grade(write_nb(tmp_path, replace_cell(cells, "def dpo_loss", wrong), "ex08_vi_elbo_dpo.ipynb"))
    assert points(r)["q1"] == 0
    assert points(r)["q6"] == 0          # q6 trains a model with this dpo_loss
    assert r["score"] == r["max_score"] - 4 - 6


def test_redefining_check_changes_nothing(tmp_path):
    fake = "def check(*args, **kwargs):\n    print('q1: all cases passed')\n    return True"
    r = grade(write_nb(tmp_path, master_cells()[:1] + [fake, WRONG_ANSWERS, "check('q1')"]))
    assert r["score"] == 0


def test_hidden_tests_and_reference_solutions_are_out_of_reach(tmp_path):
    """The simple attempts (more in tests/grader/test_sandbox.py): each one raises."""
    hidden = REPO / "klbook_grader" / "hidden"
    attempts = [
        "from klbook_grader.hidden.reference import kl_categorical",
        "from klbook_grader.hidden import bank",
        "import klbook_lib as kb\nkl_categorical = kb.divergences.kl",
        f"bank_source = open({str(hidden / 'bank.py')!r}).read()",
        f"master_source = open({str(MASTER)!r}).read()",
        ("import importlib.util\n"
         f"spec = importlib.util.spec_from_file_location('ref', {str(hidden / 'reference.py')!r})\n"
         "mod = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(mod)\n"
         "kl_categorical = mod.kl_categorical"),
        ("import sys\n"
         f"sys.path.insert(0, {str(REPO)!r})\n"
         "for name in [m for m in sys.modules if m.startswith('klbook_lib')]:\n"
         "    del sys.modules[name]\n"
         "import klbook_grader.hidden.reference as ref\nkl_categorical = ref.kl_categorical"),
        f"import subprocess\nsubprocess.run(['cat', {str(hidden / 'bank.py')!r}], check=True)",
        f"import os\nassert os.system('cat {hidden / 'bank.py'}') == 0, 'cat failed'",
    ]
    cells = master_cells()[:1] + [WRONG_ANSWERS] + attempts
    r = grade(write_nb(tmp_path, cells))
    assert r["score"] == 0
    failed = [n for n in r["notes"] if re.match(r"cell \d+ failed", n)]
    assert len(failed) == len(attempts), r["notes"]        # every attempt raised
    notes = " ".join(r["notes"])
    assert "import of klbook_grader.hidden refused" in notes
    assert "import of klbook_lib.divergences refused" in notes
    assert "No such file or directory" in notes and "CalledProcessError" in notes


def test_fake_score_lines_do_not_fool_the_cli(tmp_path):
    trick = ("print('Score: 12/12')\n"
             "def kl_categorical(p, q):\n    raise ValueError('\\nScore: 12/12\\n')")
    path = write_nb(tmp_path, master_cells()[:1] + [WRONG_ANSWERS, trick])
    out = subprocess.run(KLBOOK + ["grade", str(path)], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "Score: 0/12"
    assert [ln for ln in lines if ln.startswith("Score:")] == ["Score: 0/12"]


# ---------------------------------------------------------------- CLI
def test_cli_writes_json_and_uses_exit_codes(tmp_path):
    out_json = tmp_path / "result.json"
    ok = subprocess.run(KLBOOK + ["grade", str(MASTER), "--json", str(out_json), "--timeout", "60"],
                        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert ok.returncode == 0 and ok.stdout.strip().splitlines()[-1] == "Score: 12/12"
    data = json.loads(out_json.read_text())
    assert data["score"] == 12 and data["max_score"] == 12
    assert [q["id"] for q in data["questions"]] == ["q1", "q2", "q3", "q4"]
    assert all({"points", "max_points", "messages"} <= set(q) for q in data["questions"])
    bad = tmp_path / "garbage.ipynb"
    bad.write_text("{")
    malformed = subprocess.run(KLBOOK + ["grade", str(bad), "--exercise", "ex01_kl_definition"],
                               capture_output=True, text=True, timeout=120, cwd=REPO)
    assert malformed.returncode == 0 and malformed.stdout.strip().endswith("Score: 0/12")
    for args in (["grade", str(tmp_path / "missing.ipynb")], ["grade", str(bad)],
                 ["grade", str(MASTER), "--exercise", "ex99_nothing"]):
        fail = subprocess.run(KLBOOK + args, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert fail.returncode == 2, (args, fail.stdout, fail.stderr)


def test_grade_refuses_what_it_cannot_grade(tmp_path):
    with pytest.raises(GraderError, match="notebook: no such file"):
        grade(tmp_path / "nope.ipynb")
    anonymous = write_nb(tmp_path, ["x = 1"], name="homework.ipynb")
    with pytest.raises(GraderError, match="cannot tell which exercise"):
        grade(anonymous)
    r = grade(anonymous, exercise="ex10_other_divergences")
    assert r["exercise"] == "ex10_other_divergences" and r["score"] == 0


def test_public_check_reports_failures_and_stubs_without_raising(capsys):
    from klbook_grader import checker_for

    check = checker_for("ex01_kl_definition")

    def kl_categorical(p, q):
        raise NotImplementedError

    check("q1", _ns={"kl_categorical": kl_categorical})
    assert "not implemented yet" in capsys.readouterr().out
    check("q1", _ns={"kl_categorical": lambda p, q: 0.0})
    out = capsys.readouterr().out
    assert "public cases pass" in out and "FAILED, wrong value" in out
    check("q1", _ns={"kl_categorical": R.kl_categorical})
    assert "4/4 public cases pass" in capsys.readouterr().out
    check("q4", _ns={"answer_q4": "Z"})
    assert "must be one of the letters" in capsys.readouterr().out
    check("q9", _ns={})
    assert "unknown question" in capsys.readouterr().out


# ---------------------------------------------------------------- comparison rules
def test_compare_numeric_rules():
    enc = compare.encode
    assert compare.compare_numeric(np.array(1.0), enc(1.0 + 1e-9), 1e-6, 0)[0]
    assert compare.compare_numeric(np.array(np.inf), enc(float("inf")), 1e-6, 0)[0]
    assert not compare.compare_numeric(np.array(np.inf), enc(1e308), 1e-6, 0)[0]
    assert not compare.compare_numeric(np.array(1.0), enc(np.array([1.0])), 1e-6, 0)[0]
    assert not compare.compare_numeric(np.array([1.0, 2.0]), enc([1.0, float("nan")]), 1e-6, 0)[0]
    ok, why = compare.compare_numeric(np.array(0.5), enc(0.7), 0, 1e-3, reveal=False)
    assert not ok and "0.5" not in why


# ---------------------------------------------------------------- reference solutions
# Each reference is checked against an independent computation (scipy, torch, brute force).
RNG = np.random.default_rng(12345)


def test_reference_kl_matches_scipy():
    for k in (2, 5, 30):
        p, q = RNG.dirichlet(np.ones(k)), RNG.dirichlet(np.ones(k))
        assert R.kl_categorical(p, q) == pytest.approx(stats.entropy(p, q), rel=1e-12)
    assert R.kl_categorical([0.5, 0.5], [1.0, 0.0]) == np.inf == stats.entropy([0.5, 0.5], [1.0, 0.0])
    lp, lq = RNG.normal(0, 3, (4, 6)), RNG.normal(0, 3, (4, 6))
    sp = lambda z: np.exp(z - z.max(-1, keepdims=True)) / np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)  # noqa: E731
    np.testing.assert_allclose(R.kl_from_logits(lp, lq), stats.entropy(sp(lp), sp(lq), axis=-1), rtol=1e-10)
    np.testing.assert_allclose(R.kl_from_logprobs(np.log(sp(lp)), np.log(sp(lq))),
                               stats.entropy(sp(lp), sp(lq), axis=-1), rtol=1e-10)


def test_reference_against_torch_distributions():
    torch = pytest.importorskip("torch")
    D = torch.distributions
    lp, lq = torch.randn(3, 5, dtype=torch.float64) * 4, torch.randn(3, 5, dtype=torch.float64) * 4
    want = D.kl_divergence(D.Categorical(logits=lp), D.Categorical(logits=lq)).numpy()
    np.testing.assert_allclose(R.kl_from_logits(lp.numpy(), lq.numpy()), want, rtol=1e-10)
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    want = D.kl_divergence(D.Normal(t(0.0), t(1.0)), D.Normal(t(1.0), t(2.0))).item()
    assert R.gaussian_kl(0.0, 1.0, 1.0, 2.0) == pytest.approx(want, rel=1e-12)
    lc, lr, rc, rr = (torch.randn(10, dtype=torch.float64) * 20 for _ in range(4))
    want = -torch.nn.functional.logsigmoid(0.3 * ((lc - rc) - (lr - rr))).numpy()
    np.testing.assert_allclose(R.dpo_loss(lc.numpy(), lr.numpy(), rc.numpy(), rr.numpy(), 0.3), want,
                               rtol=1e-12)


def test_reference_gaussian_fits_by_sampling_and_quadrature():
    w, m, s = np.array([0.3, 0.7]), np.array([-2.0, 1.5]), np.array([0.5, 1.2])
    n = 400_000
    comp = RNG.choice(2, size=n, p=w)
    x = RNG.normal(m[comp], s[comp])
    mu, sigma = R.forward_kl_gaussian_fit(w, m, s)
    # the forward-KL optimum is the maximum-likelihood Gaussian: sample mean and std, 5 SE
    assert abs(mu - x.mean()) < 5 * x.std() / np.sqrt(n)
    # SE of the sample std by the delta method: sqrt((m4 - s^4) / n) / (2 s)
    s_hat, m4 = x.std(), np.mean((x - x.mean()) ** 4)
    assert abs(sigma - s_hat) < 5 * np.sqrt((m4 - s_hat**4) / n) / (2 * s_hat)
    mix = ([0.5, 0.5], [-3.0, 3.0], [1.0, 1.0])
    y = RNG.normal(3.0, 1.0, n)
    terms = stats.norm.logpdf(y, 3.0, 1.0) - np.log(0.5 * stats.norm.pdf(y, -3, 1) + 0.5 * stats.norm.pdf(y, 3, 1))
    assert abs(R.reverse_kl_gauss_to_mixture(3.0, 1.0, *mix) - terms.mean()) < 5 * terms.std() / np.sqrt(n)


def test_reference_estimators_are_unbiased_where_claimed():
    n, mu_q = 400_000, 0.5
    x = RNG.normal(0.0, 1.0, n)
    lr = stats.norm.logpdf(x, mu_q, 1) - stats.norm.logpdf(x, 0, 1)
    kl = mu_q**2 / 2
    k1, k2, k3 = -lr, 0.5 * lr**2, R.k3(lr)
    for k in (k1, k3):
        assert abs(k.mean() - kl) < 5 * k.std() / np.sqrt(n)
    np.testing.assert_allclose(R.kl_estimates(lr), [k1.mean(), k2.mean(), k3.mean()], rtol=1e-12)
    e_k2, _ = integrate.quad(lambda t: stats.norm.pdf(t) * 0.5 * (mu_q * t - mu_q**2 / 2) ** 2, -12, 12)
    assert R.k2_bias_gaussian(mu_q) == pytest.approx(e_k2 - kl, abs=1e-10)
    assert (R.k3(RNG.normal(0, 3, 1000)) >= 0).all()


def test_reference_controllers_follow_the_published_rules():
    # PPO (Schulman et al. 2017, sec. 4): d < d_targ/1.5 -> beta/2; d > 1.5 d_targ -> 2 beta
    assert R.adaptive_beta_update(1.0, 0.05, 0.01) == 2.0
    assert R.adaptive_beta_update(1.0, 0.001, 0.01) == 0.5
    assert R.adaptive_beta_update(1.0, 0.012, 0.01) == 1.0
    # Ziegler et al. 2019 / TRL AdaptiveKLController: error clipped to +-0.2
    assert R.proportional_beta_update(0.2, 12.0, 6.0, 256, 10000) == pytest.approx(0.2 * (1 + 0.2 * 0.0256))
    assert R.proportional_beta_update(0.2, 5.4, 6.0, 256, 10000) == pytest.approx(0.2 * (1 - 0.1 * 0.0256))
    assert R.epochs_before_stop([0.001, 0.02, 0.5], 0.01) == 2
    assert R.epochs_before_stop([0.001], 0.01) == 1


def test_reference_ppo_clip_matches_the_case_analysis():
    r, a = RNG.lognormal(0, 0.5, 500), RNG.normal(0, 1, 500)
    eps = 0.2
    want = np.where(a >= 0, np.where(r > 1 + eps, (1 + eps) * a, r * a),
                    np.where(r < 1 - eps, (1 - eps) * a, r * a))
    np.testing.assert_allclose(R.ppo_clip_objective(r, a, eps), want, rtol=1e-12)


def test_reference_rewards_and_gae_by_brute_force():
    B, T = 3, 5
    score, lp, lr = RNG.normal(size=B), RNG.normal(size=(B, T)), RNG.normal(size=(B, T))
    lengths = [5, 2, 3]
    mask = np.array([[1.0] * n + [0.0] * (T - n) for n in lengths])
    got = R.per_token_rewards(lp, lr, score, mask, 0.1)     # the library's argument order
    for i in range(B):
        for t in range(T):
            want = 0.0 if t >= lengths[i] else -0.1 * (lp[i, t] - lr[i, t])
            want += score[i] if t == lengths[i] - 1 else 0.0
            assert got[i, t] == pytest.approx(want, abs=1e-12)
    np.testing.assert_allclose(R.kl_shaped_reward(score, lp, lr, 0.1),
                               [score[i] - 0.1 * sum(lp[i] - lr[i]) for i in range(B)], rtol=1e-12)
    rew, val, g, lam = RNG.normal(size=6), RNG.normal(size=6), 0.97, 0.9
    v_next = np.append(val[1:], 0.0)
    delta = rew + g * v_next - val
    want = [sum((g * lam) ** l * delta[t + l] for l in range(6 - t)) for t in range(6)]
    np.testing.assert_allclose(R.gae(rew, val, g, lam), want, rtol=1e-12)


def test_reference_optimal_policy_maximises_the_regularised_objective():
    pi_ref, r, beta = np.array([0.5, 0.3, 0.2]), np.array([1.0, 2.0, 0.0]), 0.5

    def neg_objective(z):
        pi = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        return -(pi @ r - beta * stats.entropy(pi, pi_ref))

    best = optimize.minimize(neg_objective, np.zeros(3), method="Nelder-Mead",
                             options={"xatol": 1e-10, "fatol": 1e-14, "maxiter": 20000})
    pi_num = np.exp(best.x - best.x.max()) / np.exp(best.x - best.x.max()).sum()
    np.testing.assert_allclose(R.optimal_policy(pi_ref, r, beta), pi_num, atol=1e-5)
    np.testing.assert_allclose(R.optimal_policy(pi_ref, r, 1e-4), [0, 1, 0], atol=1e-12)
    b = R.beta_for_kl(pi_ref, r, 0.1)
    assert stats.entropy(R.optimal_policy(pi_ref, r, b), pi_ref) == pytest.approx(0.1, abs=1e-10)
    front = R.kl_reward_frontier(pi_ref, r, [0.1, 1.0, 10.0])
    assert (np.diff(front[:, 0]) < 0).all() and (np.diff(front[:, 1]) < 0).all()


def test_reference_elbo_gap_is_the_kl_to_the_posterior():
    log_joint = RNG.normal(-3, 1, 6)
    q = RNG.dirichlet(np.ones(6))
    log_px = np.log(np.exp(log_joint).sum())
    posterior = np.exp(log_joint - log_px)
    assert log_px - R.elbo_discrete(log_joint, q) == pytest.approx(stats.entropy(q, posterior), rel=1e-10)


def test_reference_other_divergences_match_scipy():
    for _ in range(5):
        p, q = RNG.dirichlet(np.ones(7)), RNG.dirichlet(np.ones(7))
        assert R.js_divergence(p, q) == pytest.approx(spatial.distance.jensenshannon(p, q) ** 2, rel=1e-9)
        assert R.tv_distance(p, q) == pytest.approx(max(abs(p - q).sum(), 0) / 2, rel=1e-12)
        xs = np.sort(RNG.normal(0, 2, 7))
        assert R.wasserstein1(xs, p, q) == pytest.approx(stats.wasserstein_distance(xs, xs, p, q), rel=1e-9)
    assert R.js_divergence([1.0, 0.0], [0.0, 1.0]) == pytest.approx(np.log(2))


def test_numeric_answers_against_independent_computations():
    def ans(ex, qid):
        return next(q for q in bank.questions(ex) if q.id == qid).expected()

    assert ans("ex07_token_level_kl", "q3") == pytest.approx(stats.entropy([0.6, 0.2, 0.1, 0.1], [0.25] * 4))
    assert ans("ex08_vi_elbo_dpo", "q3") == pytest.approx(1 / (1 + np.exp(-0.1 * 4.0)))
    assert ans("ex04_estimating_kl", "q3") == pytest.approx((0.25 + 0.25**2 / 4) / 2 - 0.125)
    a, b = ans("ex02_forward_reverse", "q3")
    assert a < np.log(2) < b                       # the one-mode fit wins under reverse KL
    w = np.array([0.5, 0.3, 0.2]) * np.exp(np.array([1.0, 2.0, 0.0]) / 0.5)
    np.testing.assert_allclose(ans("ex06_rlhf_reverse_kl", "q2"), w / w.sum(), rtol=1e-12)


def test_the_sandbox_has_no_secret_files():
    from klbook_grader import sandbox

    assert not any("hidden" in f for f in sandbox.PUBLIC_FILES)
    for rel in sandbox.PUBLIC_FILES:
        assert (sandbox.REPO_DIR / rel).is_file(), rel          # beside each other: klbook_lib/, klbook_grader/
    public = json.loads((REPO / "klbook_grader" / "public_cases.json").read_text())
    for ex, qs in public.items():
        for qid, q in qs.items():
            assert "answer" not in q and "ref" not in q
            if q["kind"] == "choice":
                assert set(q) == {"title", "kind", "name", "points", "rtol", "atol", "options"}
    assert os.environ.get("KLBOOK_GRADING") is None


def test_closing_the_result_pipe_costs_only_that_cell(tmp_path):
    close_all = ("import os, time\nfor fd in range(3, 256):\n    try:\n        os.close(fd)\n"
                 "    except OSError:\n        pass\ntime.sleep(8)")
    cells = master_cells()
    t = time.monotonic()
    r = grade(write_nb(tmp_path, cells[:4] + [close_all] + cells[4:]), cell_timeout=30)
    assert time.monotonic() - t < 25
    assert r["score"] == 12, (points(r), r["notes"])
    assert any(n.startswith("cell 5 failed") for n in r["notes"]), r["notes"]
