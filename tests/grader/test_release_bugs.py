"""Issue 25 item 10: the student release ships no docstring or comment that names a bug an
exercise asks the student to find (exercise 5's broken trainer), and its audit refuses one."""
from __future__ import annotations

import re
from pathlib import Path

from klbook_grader import release
from klbook_grader.hidden import bank

REPO = Path(__file__).resolve().parents[2]


def _bugs() -> list:
    return [(m.EXERCISE, re.compile(p, re.I)) for m in bank.MODULES for p in getattr(m, "BUG_NAMES", ())]


def test_exercise5_declares_the_names_of_its_bugs():
    bugs = _bugs()
    assert {ex for ex, _ in bugs} == {"ex05_kl_in_practice"}
    for phrase in ("with stale old log-probs the clip fraction is 0", "the score on a pad",
                   "the KL averaged over positions", "a flipped ratio", "it forgot the temperature"):
        assert release.bug_names(phrase, bugs), phrase
    for innocent in ("StaleLogProbError", "kl.mean()", "sampling at temperature 0.7", "padded positions"):
        assert not release.bug_names(innocent, bugs), innocent


def test_no_released_python_file_names_an_exercise_bug():
    """What `klbook release` copies of the Python sources (the library without the hidden bank,
    the tools, the tests that are not the instructor's) names no bug; tasks/token_trainer.py did."""
    bugs = _bugs()
    files = [p for top in ("klbook_lib", "klbook_grader", "tools", "tests", "_ext") for p in (REPO / top).rglob("*.py")]
    found = []
    for p in files:
        rel = p.relative_to(REPO).as_posix()
        if (rel.startswith("klbook_grader/hidden/") or rel in release.INSTRUCTOR_TESTS
                or "klbook_grader.hidden" in p.read_text(encoding="utf-8")):   # not released
            continue
        found += [f"{rel}: {why}" for why in release.bug_names(p.read_text(encoding="utf-8"), bugs)]
    assert found == []
    assert (REPO / "klbook_grader" / "tasks" / "token_trainer.py").exists()


def test_the_audit_refuses_a_docstring_that_names_a_bug(tmp_path):
    (tmp_path / "klbook_grader" / "tasks").mkdir(parents=True)
    (tmp_path / "klbook_grader" / "tasks" / "helper.py").write_text(
        '"""Checks a run; with stale old log-probs the clip fraction is exactly 0."""\n', encoding="utf-8")
    (tmp_path / "notes.md").write_text("stale old log-probs are discussed in chapter 5\n", encoding="utf-8")
    found = {"lines": [], "numbers": set(), "choices": [], "bugs": _bugs()}
    problems = release.audit(tmp_path, found)
    assert len(problems) == 1 and problems[0].startswith("klbook_grader/tasks/helper.py: 'stale old log"), problems
    assert "names a bug of ex05_kl_in_practice" in problems[0]
