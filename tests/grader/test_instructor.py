"""Instructor mode: grading a class folder (``klbook grade DIR --csv``) and the student
release (``klbook release``).

The class is built from the repository's own notebooks: the masters (full marks), the
generated student notebooks (zero), and masters with an attack, a crash or a hang added
(each must keep exactly its honest points and cost nothing to the others). The release is
checked from the outside: no file of the masters or of the hidden tests, no line of a
master's solution block, no hidden expected value and no multiple-choice answer anywhere in
it (greps written here, independently of the release's own audit), and it still works:
the library imports from it, a chapter's imports run, the public ``check`` passes a correct
answer, ``klbook grade`` says why it cannot grade there.
"""
from __future__ import annotations

import ast
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import nbformat
import numpy as np
import pytest

from klbook_grader import batch as B
from klbook_grader import release as R
from klbook_grader.grader import grade

REPO = Path(__file__).resolve().parents[2]
MASTERS = REPO / "exercises" / "masters"
KLBOOK = [sys.executable, "-m", "klbook_grader.cli"]
EX = ("ex01_kl_definition", "ex04_estimating_kl", "ex05_kl_in_practice")
INJECTION = "=cmd|' -C calc'!A0"            # a folder name a spreadsheet would run
BAD_NAME = "eve\x1b[31m\u202e"              # an escape sequence and a bidi override
# a cell's limit: short, so that the hang costs little, yet several times what the set-up
# cell (imports of torch and the library) takes when the machine is busy: at 3 s, a loaded CI
# machine stopped alice's set-up and trainer cells and her honest ex05 lost 4-8 points
CELL_TIMEOUT = 20


def code_cells(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def write_nb(path: Path, cells: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path)
    return path


def with_cell(name: str, cell: str, at: int = 1) -> list[str]:
    """The master's code cells with ``cell`` inserted after the set-up cell."""
    cells = code_cells(MASTERS / f"{name}.ipynb")
    return cells[:at] + [cell] + cells[at:]


def cli_env(tmp: Path) -> dict:
    return {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}


# ---------------------------------------------------------------- the class
STEAL = '''
import json
got = 0
for path in [{alice!r}, {master!r}]:
    try:
        nb = json.load(open(path))
    except OSError:
        continue
    for c in nb["cells"]:
        if c["cell_type"] == "code" and "check(" not in "".join(c["source"]):
            exec("".join(c["source"]), globals())
            got += 1
'''

ATTACK = '''
import os, signal
for sig_target in (-1, os.getppid(), 1):
    try:
        os.kill(sig_target, signal.SIGKILL)     # the grader, the batch, everything it can reach
    except OSError:
        pass
'''

SEGFAULT = "import ctypes\nctypes.string_at(0)\n"
HANG = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n"


def build_class(root: Path) -> dict:
    """A class folder with every case the batch must handle; returns what each deserves."""
    alice = root / "alice"
    alice.mkdir(parents=True)
    for ex in EX:
        shutil.copy(MASTERS / f"{ex}.ipynb", alice / f"{ex}.ipynb")
    (root / "bob").mkdir()
    for ex in EX:
        shutil.copy(REPO / "exercises" / f"{ex}.ipynb", root / "bob" / f"{ex}.ipynb")
    (root / INJECTION).mkdir()
    shutil.copy(MASTERS / f"{EX[0]}.ipynb", root / INJECTION / f"{EX[0]}.ipynb")
    (root / BAD_NAME).mkdir()
    shutil.copy(MASTERS / f"{EX[0]}.ipynb", root / BAD_NAME / f"{EX[0]}.ipynb")
    # an attacker: kills what it can (honest answers otherwise), and steals a classmate's work
    write_nb(root / "mallory" / f"{EX[0]}.ipynb", with_cell(EX[0], ATTACK))
    stub = code_cells(REPO / "exercises" / f"{EX[1]}.ipynb")
    steal = STEAL.format(alice=str(alice / f"{EX[1]}.ipynb"), master=str(MASTERS / f"{EX[1]}.ipynb"))
    write_nb(root / "mallory" / f"{EX[1]}.ipynb", stub[:1] + [steal] + stub[1:])
    # a crash (a segmentation fault) and a hang that ignores the alarm, each in its own cell
    write_nb(root / "carol" / f"{EX[0]}.ipynb", with_cell(EX[0], SEGFAULT))
    write_nb(root / "carol" / f"{EX[2]}.ipynb", with_cell(EX[2], HANG))
    (root / "dave").mkdir()                                           # submitted nothing
    frank = root / "frank"                                            # every layout mistake
    (frank / "hw1").mkdir(parents=True)
    shutil.copy(MASTERS / f"{EX[0]}.ipynb", frank / "hw1" / f"{EX[0]}.ipynb")
    shutil.copy(MASTERS / f"{EX[0]}.ipynb", frank / "ex01_first.ipynb")
    shutil.copy(MASTERS / f"{EX[0]}.ipynb", frank / "ex01_second.ipynb")
    shutil.copy(MASTERS / f"{EX[2]}.ipynb", frank / "homework.ipynb")
    os.symlink(MASTERS / f"{EX[1]}.ipynb", frank / f"{EX[1]}.ipynb")
    (frank / "notes.txt").write_text("not a notebook")
    (root / "README.txt").write_text("a stray file at the top")
    return {"full": [("alice", ex) for ex in EX] + [(INJECTION, EX[0]), ("mallory", EX[0]),
                                                    ("carol", EX[0]), ("carol", EX[2])],
            "zero": [("bob", ex) for ex in EX] + [("mallory", EX[1])]}


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    base = tmp_path_factory.mktemp("class")
    root = base / "submissions"
    expect = build_class(root)
    gtmp = base / "grader-tmp"
    gtmp.mkdir()
    out = base / "out"
    t0 = time.monotonic()
    proc = subprocess.run(KLBOOK + ["grade", str(root), "--csv", str(out / "grades.csv"),
                                    "--jobs", "2", "--cell-timeout", str(CELL_TIMEOUT)],
                          capture_output=True, text=True, timeout=300, env=cli_env(gtmp))
    wall = time.monotonic() - t0
    with open(out / "grades.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    return {"root": root, "out": out, "proc": proc, "rows": rows, "expect": expect,
            "gtmp": gtmp, "wall": wall}


def _rows_for(rows, student, notebook):
    return [r for r in rows[1:] if r[0] == B.csv_cell(student) and r[1] == notebook]


def test_class_csv_has_the_points_each_notebook_deserves(graded_class):
    proc, rows = graded_class["proc"], graded_class["rows"]
    assert proc.returncode == 0, proc.stderr
    assert rows[0] == ["student", "notebook", "question", "points", "max", "seconds", "words"]
    for student, ex in graded_class["expect"]["full"]:
        qs = _rows_for(rows, student, f"{ex}.ipynb")
        assert len(qs) >= 4, (student, ex, proc.stdout)
        assert all(float(r[3]) == float(r[4]) > 0 for r in qs), (student, ex, qs, proc.stdout)
    for student, ex in graded_class["expect"]["zero"]:
        qs = _rows_for(rows, student, f"{ex}.ipynb")
        assert len(qs) >= 4 and all(float(r[3]) == 0 for r in qs), (student, ex, qs)
    # every answered question has its evaluation time
    assert all(re.fullmatch(r"\d+(\.\d+)?", r[5]) for r in rows[1:] if r[0] == "alice")


def test_batch_grades_exactly_as_the_single_notebook_mode(graded_class, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for student, ex in [("mallory", EX[0]), ("mallory", EX[1]), ("carol", EX[0])]:
        single = grade(graded_class["root"] / student / f"{ex}.ipynb", cell_timeout=CELL_TIMEOUT)
        got = {r[2]: float(r[3]) for r in _rows_for(graded_class["rows"], student, f"{ex}.ipynb")}
        assert got == {q["id"]: q["points"] for q in single["questions"]}, (student, ex)


def test_attack_crash_and_hang_cost_only_their_own_cell(graded_class):
    with open(graded_class["out"] / "grades-json" / "carol.json", encoding="utf-8") as fh:
        carol = json.load(fh)
    by_nb = {n["notebook"]: n for n in carol["notebooks"]}
    crash = by_nb[f"{EX[0]}.ipynb"]["result"]
    hang = by_nb[f"{EX[2]}.ipynb"]["result"]
    assert crash["score"] == crash["max_score"] and crash["runs"] >= 2
    assert any("SIGSEGV" in n or "process ended" in n for n in crash["notes"]), crash["notes"]
    assert hang["score"] == hang["max_score"] and hang["runs"] >= 2
    assert any("stopped from outside" in n for n in hang["notes"]), hang["notes"]
    # the thief found nothing to steal: neither the classmate's file nor the master exists
    with open(graded_class["out"] / "grades-json" / "mallory.json", encoding="utf-8") as fh:
        thief = {n["notebook"]: n for n in json.load(fh)["notebooks"]}
    assert thief[f"{EX[1]}.ipynb"]["score"] == 0
    # the grader's temporary folders are all gone
    assert not list(graded_class["gtmp"].iterdir())


def test_layout_mistakes_are_listed_not_graded(graded_class):
    proc, rows = graded_class["proc"], graded_class["rows"]
    frank = {r[1]: r for r in rows if r[0] == "frank"}
    assert set(frank) == {"ex01_first.ipynb", "ex01_second.ipynb", "homework.ipynb",
                          f"{EX[1]}.ipynb", "hw1/"}
    assert all(r[2] == B.NOT_GRADED and r[3] == "0" for r in frank.values())
    assert [r[2] for r in rows if r[0] == "dave"] == [B.NO_NOTEBOOK]
    out = proc.stdout
    assert "2 notebooks for ex01_kl_definition" in out
    assert "symbolic link" in out and "subfolder" in out and "names no exercise" in out
    assert "'README.txt': not a student folder" in out
    last = out.strip().splitlines()[-1]
    assert last.startswith("Summary: graded 11 notebook(s) of 8 student(s)"), last
    assert "6 NOT graded" in last, last


def test_csv_cells_are_clean_and_defused(graded_class):
    rows = graded_class["rows"]
    raw = (graded_class["out"] / "grades.csv").read_text(encoding="utf-8")
    assert "\x1b" not in raw and "\u202e" not in raw
    for r in rows:
        for cell in r:
            assert cell.isprintable(), r
            assert not cell.startswith(("=", "+", "-", "@")), r
    assert any(r[0] == "'" + INJECTION for r in rows)
    bad = [r for r in rows if r[0].startswith("eve")]
    assert bad and all(r[2] == B.NOT_GRADED for r in bad)


def test_one_json_per_student_with_safe_names(graded_class):
    jdir = graded_class["out"] / "grades-json"
    files = sorted(p.name for p in jdir.iterdir())
    assert len(files) == 8, files
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+\.json", f) and not f.startswith(".") for f in files)
    records = [json.loads((jdir / f).read_text(encoding="utf-8")) for f in files]
    assert {r["student"] for r in records} >= {"alice", "bob", INJECTION, BAD_NAME}
    alice = next(r for r in records if r["student"] == "alice")
    assert alice["score"] == alice["max_score"] == sum(n["result"]["max_score"] for n in alice["notebooks"])
    assert all(n["result"]["questions"] for n in alice["notebooks"])
    eve = next(r for r in records if r["student"] == BAD_NAME)
    assert "control or invisible" in eve["error"]


def test_names_and_cells_unit():
    assert B.student_name_problem("alice") is None
    assert B.student_name_problem("Zoë Ł. 王") is None
    for bad in ("", " alice", "alice ", "a\nb", "a\x00b", "a\u202eb", ".hidden", "x" * 101):
        assert B.student_name_problem(bad), repr(bad)
    for name in ("../../etc/passwd", "..", "a/b", "=HYPERLINK(1)", "CON", "Zoë", "x" * 300):
        f = B.json_filename(name)
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*\.json", f) and "/" not in f, (name, f)
    assert B.json_filename("alice") == "alice.json"
    assert B.json_filename("Alice!") != B.json_filename("Alice?")     # never the same file
    for text, want in [("=1+2", "'=1+2"), ("+1", "'+1"), ("-1", "'-1"), ("@SUM(A1)", "'@SUM(A1)"),
                       ("a\r\n=b", "a =b"), ("plain", "plain"), ("\x1b[2J=x", "'=x")]:
        assert B.csv_cell(text) == want, text


def test_folder_layouts_that_are_refused(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    shutil.copy(REPO / "exercises" / f"{EX[0]}.ipynb", flat / f"alice__{EX[0]}.ipynb")
    env = cli_env(tmp_path)
    out = tmp_path / "out.csv"
    p = subprocess.run(KLBOOK + ["grade", str(flat), "--csv", str(out)], capture_output=True,
                       text=True, env=env, timeout=60)
    assert p.returncode == 2 and "one folder per student" in p.stderr, p.stderr
    assert not out.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    p = subprocess.run(KLBOOK + ["grade", str(empty), "--csv", str(out)], capture_output=True,
                       text=True, env=env, timeout=60)
    assert p.returncode == 2 and "no student folder" in p.stderr
    klass = tmp_path / "klass"
    (klass / "alice").mkdir(parents=True)
    for args, msg in [([str(klass)], "needs --csv"),
                      ([str(klass), "--csv", str(klass / "g.csv")], "inside the submissions folder"),
                      ([str(klass), "--csv", str(out), "--json-dir", str(klass / "alice")],
                       "inside the submissions folder"),
                      ([str(REPO / "exercises" / f"{EX[0]}.ipynb"), "--csv", str(out)], "for a folder"),
                      ([str(klass), "--csv", str(out), "--jobs", "0"], "--jobs"),
                      ([str(klass), "--csv", str(out), "--exercise", EX[0]], "not --json or --exercise")]:
        p = subprocess.run(KLBOOK + ["grade"] + args, capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 2 and msg in p.stderr, (args, p.stderr)
    with pytest.raises(ValueError, match="jobs"):
        B.grade_class(klass, jobs=0)


# ---------------------------------------------------------------- parallel sandboxes
ISOLATION = '''
import os, subprocess, sys, time
ME = {me!r}
OTHER = {other_a!r} + {other_b!r}
with open(ME + ".txt", "w") as fh:
    fh.write(ME)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", ME])
time.sleep(4)                       # the classmate's sandbox is running now
def search(marker):
    hits = []
    for root, dirs, files in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev", "/usr")]
        hits += [os.path.join(root, f) for f in files + dirs if marker in f]
        if root.startswith(("/tmp", "/klbook")):
            for f in files:
                try:
                    with open(os.path.join(root, f), "rb") as fh:
                        if marker.encode() in fh.read(1 << 22):
                            hits.append(os.path.join(root, f))
                except OSError:
                    pass
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            if marker.encode() in open(f"/proc/{{pid}}/cmdline", "rb").read():
                hits.append("/proc/" + pid)
        except OSError:
            pass
    return hits
raise RuntimeError(f"ISOLATION other={{search(OTHER)}} self={{len(search(ME))}} "
                   f"class={{os.path.exists({klass!r})}}")
'''


def test_parallel_sandboxes_do_not_see_each_other(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    root = tmp_path / "klass"
    marks = {s: f"klbook-iso-{s}-{uuid.uuid4().hex[:10]}" for s in ("ann", "ben")}
    for me, other in (("ann", "ben"), ("ben", "ann")):
        cell = ISOLATION.format(me=marks[me], other_a=marks[other][:12], other_b=marks[other][12:],
                                klass=str(root))
        write_nb(root / me / f"{EX[0]}.ipynb", with_cell(EX[0], cell))
    res = B.grade_class(root, jobs=2, cell_timeout=CELL_TIMEOUT * 6)   # the cell walks the file system
    results = {st.name: st.submissions[0].result for st in res["students"]}
    for name, r in results.items():
        note = next(n for n in r["notes"] if "ISOLATION" in n)
        # it finds its own marker (its file, its notebook, its child process), never the other's
        assert "other=[]" in note and "class=False" in note, note
        assert int(re.search(r"self=(\d+)", note).group(1)) >= 3, note
        assert r["score"] == r["max_score"], r
    # both ran at the same time: the batch took clearly less than the two notebooks in a row
    assert res["seconds"] < sum(r["seconds"] for r in results.values()) - 2.0, res["seconds"]
    left = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if any(m.encode() in cmd for m in marks.values()):
            left.append(pid)
    assert not left, f"processes left behind: {left}"
    assert not list(tmp_path.glob("klbook-grade-*"))


# ---------------------------------------------------------------- the release
@pytest.fixture(scope="module")
def released(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "book"
    p = subprocess.run(KLBOOK + ["release", str(out)], capture_output=True, text=True,
                       timeout=300, env=cli_env(tmp_path_factory.mktemp("tmp")))
    assert p.returncode == 0, p.stderr
    return out, p.stdout


def _texts(folder: Path) -> dict[str, str]:
    """Every text file's content; a notebook's code and prose as they read (not JSON-escaped)."""
    out = {}
    for p in folder.rglob("*"):
        if not p.is_file():
            continue
        data = p.read_bytes()
        if b"\0" in data:
            continue
        text = data.decode("utf-8", "replace")
        if p.suffix == ".ipynb":
            nb = json.loads(text)
            text = text + "\n" + "\n".join("".join(c["source"]) if isinstance(c["source"], list)
                                           else c["source"] for c in nb["cells"])
        out[p.relative_to(folder).as_posix()] = text
    return out


def _solution_lines() -> set[str]:
    """Lines of the masters' solution blocks (20+ characters) that the book's chapters and
    library do not contain themselves (a line the chapter teaches is no secret)."""
    taught = "\n".join(_texts(REPO / "chapters").values())
    taught += "\n".join(p.read_text() for p in (REPO / "klbook_lib").glob("*.py"))
    # the English paragraphs of the public pages as the Chinese edition's catalogues hold them,
    # each joined into one line (a signature the exercise states is no secret)
    from babel.messages.pofile import read_po
    for po in (REPO / "locales").rglob("*.po"):
        with po.open("rb") as f:
            taught += "\n" + "\n".join(m.id for m in read_po(f) if m.id and isinstance(m.id, str))
    lines, given = set(), set()
    for master in MASTERS.glob("*.ipynb"):
        for src in code_cells(master):
            block = None
            for line in src.split("\n"):
                s = line.strip()
                if s in ("# BEGIN SOLUTION", "# BEGIN STUDENT"):
                    block = s
                elif s in ("# END SOLUTION", "# END STUDENT"):
                    block = None
                elif block == "# BEGIN STUDENT" and s.startswith("# "):
                    given.add(s[2:].strip())     # the buggy trainer the student is handed
                elif block == "# BEGIN SOLUTION":
                    if len(s) >= 20 and not s.startswith("#") and s not in taught:
                        lines.add(s)
                elif block is None:
                    given.add(s)                 # code the notebook shows anyway
    return lines - given


def test_release_leaves_out_masters_hidden_tests_and_history(released):
    out, stdout = released
    assert not (out / "exercises" / "masters").exists()
    assert not (out / "klbook_grader" / "hidden").exists()
    assert not (out / ".git").exists() and not (out / ".venv").exists() and not (out / "_build").exists()
    for t in ("test_grading.py", "test_exercises.py", "test_sandbox.py", "test_instructor.py"):
        assert not (out / "tests" / "grader" / t).exists(), t
    assert not list(out.rglob("__pycache__")) and not list(out.rglob("*.pyc"))
    for path in (out / "tests").glob("*.py"):
        assert "grading.hidden import" not in path.read_text() and \
            "from klbook_grader.hidden" not in path.read_text(), path
    # what a student needs is there
    for rel in ["Makefile", "requirements.txt", "pyproject.toml", "_toc.yml", "_config.yml",
                "klbook_grader/public_cases.json", "klbook_grader/checker.py"]:
        assert (out / rel).is_file(), rel
    assert sorted(p.name for p in (out / "chapters").glob("*.ipynb")) == \
        sorted(p.name for p in (REPO / "chapters").glob("*.ipynb"))
    assert sorted(p.name for p in (out / "exercises").glob("*.ipynb")) == \
        sorted(p.name for p in MASTERS.glob("*.ipynb"))
    assert "keep the full repository private" in stdout


def test_release_contains_no_solution_line(released):
    out, _ = released
    lines = _solution_lines()
    assert len(lines) > 50                           # the search is not vacuous...
    full = _texts(REPO / "exercises" / "masters")
    assert all(any(s in t for t in full.values()) for s in lines)   # ...and finds them where they are
    texts = _texts(out)
    leaks = [(rel, s) for rel, t in texts.items() for s in lines if s in t]
    assert not leaks, leaks[:10]
    for rel, t in texts.items():
        if rel.endswith(".ipynb"):
            assert not re.search(r"^\s*# (BEGIN|END) SOLUTION\s*$", t, re.M), rel


def test_release_contains_no_hidden_expected_value_or_choice(released):
    from klbook_grader.hidden import bank

    out, _ = released
    texts = _texts(out)
    numbers = set()
    for t in texts.values():
        numbers |= set(re.findall(r"\d+\.\d+(?:e[-+]?\d+)?", t))
    hidden, public, choices = [], set(), []
    for ex in bank.exercise_names():
        for q in bank.questions(ex):
            if q.kind == "choice":
                choices.append((q.name, q.ref))
            elif q.kind == "value":
                hidden += list(np.ravel(q.expected()))
            else:
                for c, e in zip(q.cases, q.expected()):
                    if c.public:             # shown by check() (any exercise's): not a secret
                        public |= {abs(float(x)) for x in np.ravel(e)}
                    else:
                        hidden += list(np.ravel(e))
    secret = set()
    for x in map(abs, map(float, hidden)):
        if np.isfinite(x) and x != round(x) and x not in public:
            for form in (repr(x), f"{x:.6g}"):
                if len(re.sub(r"e.*|[.]|^0+", "", form).lstrip("0")) >= 5:
                    secret.add(form)
    assert len(secret) > 100
    assert not secret & numbers, sorted(secret & numbers)[:10]
    for rel, t in texts.items():
        if rel.endswith((".py", ".ipynb")):
            for name, letter in choices:
                assert not re.search(rf"\b{name}\s*=\s*[\"']{letter}[\"']", t), (rel, name)


def test_release_audit_catches_a_planted_leak(released, tmp_path):
    out, _ = released
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert R.audit(copy) == []
    shutil.copy(MASTERS / f"{EX[1]}.ipynb", copy / "tests" / "notes.ipynb")
    found = R.audit(copy)
    assert any("solution block" in f for f in found) and any("reference solution" in f for f in found)


# This checkout's editable install (`pip install -e .`) maps the packages' names to the
# repository, and its import finder answers for a module the release lacks (klbook_grader.hidden)
# from there; a student's machine has no such finder. The code run "in the release" drops it first.
WITHOUT_DEV_INSTALL = ("import sys\nsys.meta_path[:] = [f for f in sys.meta_path\n"
                       "    if not str(getattr(f, '__module__', '')).startswith('__editable__')]\n")


def _run_in_release(out: Path, code: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(out), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-c", WITHOUT_DEV_INSTALL + code], cwd=out / "exercises", env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_release_works_for_a_student(released):
    out, _ = released
    # the library is the release's own, and it has no hidden package
    p = _run_in_release(out, "import importlib.util, klbook_lib\nprint(klbook_lib.__file__)\n"
                             "print(importlib.util.find_spec('klbook_grader.hidden'))")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(out / "klbook_lib" / "__init__.py"), "None"]
    # a chapter's imports
    imports = []
    for src in code_cells(out / "chapters" / "07_token_level_kl.ipynb"):
        tree = ast.parse("\n".join(l for l in src.split("\n") if not l.lstrip().startswith(("%", "!"))))
        imports += [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert any("klbook_lib" in i for i in imports)
    p = _run_in_release(out, "\n".join(imports) + "\nimport klbook_lib\nprint(klbook_lib.__file__)")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().endswith(str(out / "klbook_lib" / "__init__.py"))
    # the public check: the master's answers pass every public case, the stubs are "not implemented"
    spec = json.loads((out / "klbook_grader" / "public_cases.json").read_text())[EX[0]]
    runner = "import json, sys\nfor src in json.load(sys.stdin):\n    exec(src, globals())\n"
    for cells, want in [(code_cells(MASTERS / f"{EX[0]}.ipynb"),
                         [f"{len(spec[q]['cases'])}/{len(spec[q]['cases'])} public cases pass"
                          for q in ("q1", "q2")] + ["answer has the right form", "recorded"]),
                        (code_cells(out / "exercises" / f"{EX[0]}.ipynb"),
                         ["not implemented yet", "not answered yet"])]:
        env = {**os.environ, "PYTHONPATH": str(out), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
        p = subprocess.run([sys.executable, "-c", runner], input=json.dumps(cells), cwd=out / "exercises",
                           env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        for w in want:
            assert w in p.stdout, (w, p.stdout)
        assert "FAILED" not in p.stdout
    # the instructor commands say why they cannot run here
    for args in (["grade", f"{EX[0]}.ipynb"], ["release", str(out.parent / "again")]):
        p = _run_in_release(out, f"import sys\nfrom klbook_grader.cli import main\nsys.exit(main({args!r}))")
        assert p.returncode == 2 and "instructor's full repository" in p.stderr, p.stderr


def test_klbook_start_works_in_the_release(released, tmp_path):
    """``klbook start`` (a working copy of an exercise, issue 14) must not need the masters."""
    out, _ = released
    env = {**os.environ, "PYTHONPATH": str(out), "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    code = "import sys\nfrom klbook_grader.cli import main\nsys.exit(main(sys.argv[1:]))"
    p = subprocess.run([sys.executable, "-c", code, "start", "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    before = set(out.rglob("*.ipynb"))
    p = subprocess.run([sys.executable, "-c", code, "start", EX[0]], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert not re.search(r"hidden|masters|ModuleNotFoundError|internal error", p.stdout + p.stderr), \
        p.stdout + p.stderr
    assert p.returncode == 0, p.stdout + p.stderr
    made = [q for q in list(tmp_path.rglob("*.ipynb")) + list(out.rglob("*.ipynb")) if q not in before]
    assert made, p.stdout


def test_released_book_tests_pass(released):
    out, _ = released
    env = {**os.environ, "PYTHONPATH": str(out), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/test_book_structure.py", "tests/test_public_api.py"],
                       cwd=out, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]


def test_every_tracked_top_level_entry_is_released_or_left_out_on_purpose():
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    tops = {t.split("/")[0] for t in tracked}
    files, left_out = R.select_files()
    released_tops = {f.split("/")[0] for f in files}
    unexplained = [t for t in tops if t not in released_tops and not any(
        x.startswith(t) for x in left_out)]
    assert not unexplained, unexplained
    assert not [x for x in left_out if "not one of the book's" in x and x.split()[0].rstrip("/") in tops]


def test_release_refuses_bad_folders(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(R.ReleaseError, match="not an empty folder"):
        R.release(tmp_path / "full")
    with pytest.raises(R.ReleaseError, match="outside the repository"):
        R.release(REPO / "_build" / "release-test")
    assert not (REPO / "_build" / "release-test").exists()


def test_names_that_are_not_utf8_are_refused_with_a_note(tmp_path):
    """Issue 36: a file name's non-UTF-8 bytes were dropped from the CSV (``bad\\xff`` showed as
    ``bad``, which can collide with a real ``bad``). Such a student folder or notebook is not
    graded, and the reason shows its bytes as escapes."""
    root = tmp_path / "class"
    (root / "alice").mkdir(parents=True)
    bad_student = root / os.fsdecode(b"bad\xff")
    bad_student.mkdir()
    (bad_student / "ex01_kl_definition.ipynb").write_text("{}")
    (root / "alice" / os.fsdecode(b"ex01_kl\xfe_definition.ipynb")).write_text("{}")
    assert "not valid UTF-8" in B.student_name_problem(os.fsdecode(b"bad\xff"))
    students, _ = B.find_submissions(root)
    by_name = {s.name: s for s in students}
    bad = by_name[os.fsdecode(b"bad\xff")]
    assert bad.error and "not valid UTF-8" in bad.error and "bad\\xff" in bad.error, bad.error
    (sub,) = by_name["alice"].submissions
    assert sub.path is None and "not valid UTF-8" in sub.error and "\\xfe" in sub.error, sub
    assert sub.notebook.isprintable() and "\\xfe" in sub.notebook
