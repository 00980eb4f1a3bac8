"""The student edition of the book's repository: ``klbook release OUTDIR``.

The repository holds the reference solutions (``exercises/masters/``), the grader's hidden
tests and reference implementations (``klbook_grader/hidden/``) and tests that use
them. A student who has them can read every answer, so a course that grades with hidden
tests keeps this repository private and gives students a *release*: a plain folder (no
git history) with everything needed to read the book, run the chapters and do the
exercises, and nothing that reveals a solution.

:func:`release` copies the book's parts (:data:`BOOK_DIRS` and the top-level files
matching :data:`TOP_FILES`) without :data:`SECRET_DIRS`, :data:`INSTRUCTOR_TESTS`, any
other test that imports the hidden package, caches and build outputs; writes the
student notebooks and ``public_cases.json`` afresh from the masters (what ``klbook
make-student`` writes), and then **audits** the copy before it appears at ``OUTDIR``
(:func:`audit`): no secret path, no notebook with a solution block, no line of a
reference solution, no hidden expected value and no multiple-choice answer anywhere in
it, and no Python file whose text names a bug an exercise asks the student to find. If
the audit finds anything, nothing is written and :class:`ReleaseError` says what.
"""
from __future__ import annotations

import ast
import fnmatch
import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BOOK_DIRS = ("chapters", "exercises", "klbook_lib", "klbook_grader", "tests", "tools", "_ext", "_static", ".ci", "locales")
TOP_FILES = ("*.md", "*.yml", "*.yaml", "*.toml", "*.txt", "*.bib", "*.cfg", "*.ini", "Makefile",
             "conftest.py", ".gitignore", "LICENSE*", "COPYING*", "CITATION*")
SECRET_DIRS = {"exercises/masters": "reference solutions (the masters)",
               "klbook_grader/hidden": "the grader's hidden tests and reference solutions"}
INSTRUCTOR_TESTS = {"tests/grader/test_grading.py": "tests of the grader against the hidden tests",
                    "tests/grader/test_exercises.py": "runs the masters",
                    "tests/grader/test_sandbox.py": "attacks the sandbox with the masters",
                    "tests/grader/test_instructor.py": "tests of class grading and of this release",
                    "tests/grader/test_exercise_traps.py": "grades wrong variants of the reference solutions",
                    "tests/grader/grading_helpers.py": "helpers of the grader's tests above"}
JUNK = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".hypothesis", ".mypy_cache",
        ".ruff_cache", ".DS_Store", ".git", ".venv", "_build", ".whl", ".gl"}
JUNK_SUFFIXES = (".pyc", ".pyo", ".egg-info")
MANIFEST = ".klbook-release.json"
README_NOTE = (
    "> **Student edition.** This copy of the book was made with `klbook release`: it holds the\n"
    "> chapters, the exercise notebooks and their public checks (`check(\"q1\")`), but not the\n"
    "> reference solutions nor the grader's hidden tests, so `klbook grade` does not work here;\n"
    "> your instructor grades your notebooks. Everything else below applies.\n\n")
MIN_LINE = 20          # shorter solution lines (`return x`) are not distinctive
MIN_DIGITS = 5         # significant digits for a hidden number to count as distinctive


class ReleaseError(RuntimeError):
    """The release could not be written (bad folder, or the audit found a leak)."""


def has_hidden_tests() -> bool:
    """Does this copy of ``klbook_lib`` have the hidden tests (an instructor's repository)?"""
    try:
        return importlib.util.find_spec("klbook_grader.hidden") is not None
    except ImportError:
        return False


@dataclass
class ReleaseReport:
    outdir: Path
    files: int
    left_out: list = field(default_factory=list)
    regenerated: list = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"Wrote a student release of the book to {self.outdir} ({self.files} files)."]
        lines += ["  left out: " + x for x in self.left_out]
        lines += ["  note: " + x for x in self.regenerated]
        lines.append("Audit: no reference solution, hidden test value or multiple-choice "
                     "answer found in it. Publish this folder; keep the full repository private.")
        return "\n".join(lines)


# ---------------------------------------------------------------- what goes in
def _imports_hidden(path: Path) -> bool:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return True                     # cannot tell: leave it out
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{a.name}" for a in node.names] + [str(node.module)]
        else:
            continue
        if any(n == "klbook_grader.hidden" or n.startswith("klbook_grader.hidden.")
               for n in names):
            return True
    return False


def _junk(name: str) -> bool:
    return name in JUNK or name.endswith(JUNK_SUFFIXES)


def select_files(root: Path = REPO) -> tuple[list[str], list[str]]:
    """The files (relative POSIX paths) a release copies, and what it leaves out, and why."""
    files: list[str] = []
    left_out: list[str] = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        name = entry.name
        if _junk(name):
            continue
        if entry.is_symlink():
            left_out.append(f"{name} (a symbolic link)")
        elif entry.is_dir(follow_symlinks=False):
            if name in BOOK_DIRS:
                _walk(root, name, files, left_out)
            else:
                left_out.append(f"{name}/ (not one of the book's folders)")
        elif entry.is_file(follow_symlinks=False):
            if any(fnmatch.fnmatchcase(name, pat) for pat in TOP_FILES):
                files.append(name)
            elif not name.startswith("."):
                left_out.append(f"{name} (not one of the book's files)")
    return files, left_out


def _walk(root: Path, top: str, files: list, left_out: list) -> None:
    for dirpath, dirnames, filenames in os.walk(root / top, followlinks=False):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        keep = []
        for d in sorted(dirnames):
            rel = f"{rel_dir}/{d}"
            if _junk(d):
                continue
            if rel in SECRET_DIRS:
                left_out.append(f"{rel}/ ({SECRET_DIRS[rel]})")
            elif os.path.islink(os.path.join(dirpath, d)):
                left_out.append(f"{rel} (a symbolic link)")
            else:
                keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            rel = f"{rel_dir}/{f}"
            full = Path(dirpath) / f
            if _junk(f):
                continue
            if full.is_symlink() or not full.is_file():
                left_out.append(f"{rel} (a symbolic link or special file)")
            elif rel in INSTRUCTOR_TESTS:
                left_out.append(f"{rel} ({INSTRUCTOR_TESTS[rel]})")
            elif rel.startswith("tests/") and f.endswith(".py") and _imports_hidden(full):
                left_out.append(f"{rel} (imports the hidden tests)")
            else:
                files.append(rel)


# ---------------------------------------------------------------- the audit
def _notebook_text(raw: str) -> str:
    """A notebook's code, prose and text outputs as plain text (its JSON escapes quotes)."""
    try:
        nb = json.loads(raw)
        parts = []
        for cell in nb.get("cells", []):
            src = cell.get("source", "")
            parts.append("".join(src) if isinstance(src, list) else str(src))
            for out in cell.get("outputs", []) or []:
                for v in [out.get("text", "")] + list((out.get("data") or {}).values()):
                    parts.append("".join(v) if isinstance(v, list) else str(v))
        return "\n".join(parts)
    except (ValueError, AttributeError, TypeError):
        return raw


def _text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None                      # binary (an image)
    text = data.decode("utf-8", "replace")
    return _notebook_text(text) if path.suffix == ".ipynb" else text


_NUMBER = re.compile(r"(?<![\w.])\d+\.\d+(?:[eE][-+]?\d+)?|(?<![\w.])\d+[eE][-+]?\d+")


def _numbers(text: str) -> set:
    return set(_NUMBER.findall(text))


def _significant(form: str) -> int:
    """Significant digits of a number as written: 0.000120034 has 6, 1.5e-05 has 2."""
    return len(re.split(r"[eE]", form)[0].replace(".", "").strip("0"))


def _public_texts(student_files: dict) -> list[str]:
    """The book's public material: chapters, the library outside the grader, the student
    notebooks and public checks. A solution line or a number found here is not a secret."""
    texts = [_text(p) or "" for p in sorted((REPO / "chapters").glob("*.ipynb"))]
    texts += [p.read_text(encoding="utf-8") for p in sorted((REPO / "klbook_lib").rglob("*.py"))]
    texts += [p.read_text(encoding="utf-8") for p in sorted((REPO / "klbook_grader" / "tasks").rglob("*.py"))]
    texts += [_notebook_text(t) if str(p).endswith(".ipynb") else t
              for p, t in student_files.items()]
    texts += _catalogue_english()
    return texts


def _catalogue_english() -> list[str]:
    """The English messages of the Chinese edition's catalogues (``locales/``): the public
    pages' paragraphs, each joined into one line, which is how the catalogues hold them."""
    from babel.messages.pofile import read_po

    out = []
    for po in sorted((REPO / "locales").rglob("*.po")):
        with po.open("rb") as f:
            out += [m.id for m in read_po(f) if m.id and isinstance(m.id, str)]
    return out


def secrets(student_files: dict | None = None) -> dict:
    """What must not appear in a release, taken from the masters and the hidden bank:

    ``lines``    distinctive lines of the masters' solution blocks and of what the
                 reference implementations in ``hidden/`` return (at least
                 :data:`MIN_LINE` characters, not in the book's public material);
    ``numbers``  expected values of hidden cases and numeric answers, written as Python
                 prints them and to 6 significant digits (those with at least
                 :data:`MIN_DIGITS` significant digits, not in the public material);
    ``choices``  regular expressions of the multiple-choice answers (an assignment of the
                 right letter to the answer's variable);
    ``bugs``     regular expressions of phrases that name a bug an exercise asks the student
                 to find (``BUG_NAMES`` of an exercise's hidden module), looked for in the
                 release's Python files (their docstrings and comments).
    """
    import numpy as np

    from klbook_grader import student
    from klbook_grader.hidden import bank

    student_files = student_files if student_files is not None else student.outputs()
    public = _public_texts(student_files)
    public_joined = "\n".join(public)
    public_numbers = _numbers(public_joined)

    lines: set = set()
    for master in sorted((REPO / "exercises" / "masters").glob("*.ipynb")):
        inside = False
        for line in _notebook_text(master.read_text(encoding="utf-8")).split("\n"):
            s = line.strip()
            if s == student.BEGIN:
                inside = True
            elif s == student.END:
                inside = False
            elif inside and s and not s.startswith("#"):
                lines.add(s)
                lines.add(s.split("  #")[0].rstrip())
    for module in sorted((REPO / "klbook_grader" / "hidden").glob("*.py")):
        if module.name in ("__init__.py", "bank.py", "questions.py"):   # the questions, not
            continue                                                     # their answers
        ref = module.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(ref)):    # what the reference functions return: the
            if isinstance(node, ast.Return):     # formulas (set-up lines are too generic)
                seg = ast.get_source_segment(ref, node) or ""
                lines.update(s.strip() for s in seg.split("\n"))
    lines = {s for s in lines if len(s) >= MIN_LINE and not s.startswith("#")
             and s not in public_joined}

    numbers: set = set()
    choices: list = []
    for ex in bank.exercise_names():
        for q in bank.questions(ex):
            if q.kind == "choice":
                choices.append(re.compile(rf"\b{re.escape(q.name)}\s*=\s*[\"']{re.escape(q.ref)}[\"']"))
                continue
            expected = q.expected()
            if q.kind == "function":
                hidden = [e for c, e in zip(q.cases, expected) if not c.public]
                shown = [e for c, e in zip(q.cases, expected) if c.public]
            else:
                hidden, shown = [expected], []
            shown_values = {float(x) for e in shown for x in np.ravel(e)}
            for e in hidden:
                for x in np.ravel(e):
                    x = float(x)
                    if not np.isfinite(x) or x == round(x) or x in shown_values:
                        continue
                    for form in (repr(abs(x)), f"{abs(x):.6g}"):
                        if _significant(form) >= MIN_DIGITS and form not in public_numbers:
                            numbers.add(form)
    bugs = [(m.EXERCISE, re.compile(pat, re.I)) for m in bank.MODULES for pat in getattr(m, "BUG_NAMES", ())]
    return {"lines": sorted(lines), "numbers": numbers, "choices": choices, "bugs": bugs}


def bug_names(text: str, bugs: list) -> list[str]:
    """The phrases of ``text`` that name a bug of an exercise (``bugs`` from :func:`secrets`)."""
    out = []
    for exercise, pat in bugs:
        m = pat.search(text)
        if m:
            out.append(f"{m.group(0)!r} names a bug of {exercise}")
    return out


def audit(folder: str | os.PathLike, found: dict | None = None) -> list[str]:
    """Everything in ``folder`` (a release) that reveals a solution; empty if nothing does."""
    folder = Path(folder)
    found = found if found is not None else secrets()
    problems = []
    for rel in list(SECRET_DIRS) + list(INSTRUCTOR_TESTS) + [".git"]:
        if (folder / rel).exists():
            problems.append(f"{rel} is in the release")
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        text = _text(path)
        if text is None:
            continue
        if path.suffix == ".ipynb" and re.search(r"^\s*# (BEGIN|END) SOLUTION\s*$", text, re.M):
            problems.append(f"{rel}: a notebook with a solution block")
        for line in found["lines"]:
            if line in text:
                problems.append(f"{rel}: a line of a reference solution: {line[:80]!r}")
        for num in sorted(_numbers(text) & found["numbers"]):
            problems.append(f"{rel}: a hidden expected value: {num}")
        if path.suffix == ".py":
            problems.extend(f"{rel}: {why}" for why in bug_names(text, found.get("bugs", [])))
        if path.suffix in (".py", ".ipynb"):
            for pat in found["choices"]:
                m = pat.search(text)
                if m:
                    problems.append(f"{rel}: a multiple-choice answer: {m.group(0)!r}")
    return list(dict.fromkeys(problems))


# ---------------------------------------------------------------- writing it
def release(outdir: str | os.PathLike) -> ReleaseReport:
    """Write the student edition of this repository to ``outdir`` (a new or empty folder).

    Raises :class:`ReleaseError` when ``outdir`` is unsuitable, this copy has no hidden
    tests to leave out (it is already a release), or the audit of the copy finds a leak;
    then nothing is left at ``outdir``.
    """
    from klbook_grader import student

    if not has_hidden_tests() or not (REPO / "exercises" / "masters").is_dir():
        raise ReleaseError("this copy of the book has no masters or hidden tests: it is already "
                           "a student release (run klbook release in the full repository)")
    out = Path(outdir).absolute()
    if out.exists() and (not out.is_dir() or out.is_symlink() or any(out.iterdir())):
        raise ReleaseError(f"outdir: {str(out)!r} exists and is not an empty folder")
    real_out, repo = Path(os.path.realpath(out)), Path(os.path.realpath(REPO))
    if real_out == repo or repo in real_out.parents or real_out in repo.parents:
        raise ReleaseError(f"outdir: {str(out)!r} must lie outside the repository {str(repo)!r} "
                           "(and not contain it)")
    files, left_out = select_files(REPO)
    generated = {Path(p).relative_to(REPO).as_posix(): text
                 for p, text in student.outputs().items()}
    regenerated = []
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".klbook-release-", dir=out.parent))
    try:
        for rel in files:
            dst = staging / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dst)
        for rel, text in generated.items():
            if rel not in files or (REPO / rel).read_text(encoding="utf-8") != text:
                regenerated.append(f"{rel} was out of date in the repository; the release has "
                                   "it as `klbook make-student` writes it")
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            (staging / rel).write_text(text, encoding="utf-8")
        readme = staging / "README.md"
        if readme.is_file():
            readme.write_text(README_NOTE + readme.read_text(encoding="utf-8"), encoding="utf-8")
        n_files = len(set(files) | set(generated)) + 1
        manifest = {"made_by": "klbook release", "files": n_files, "left_out": left_out}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        problems = audit(staging, secrets({REPO / k: v for k, v in generated.items()}))
        if problems:
            shown = "\n  ".join(problems[:30])
            more = f"\n  ... and {len(problems) - 30} more" if len(problems) > 30 else ""
            raise ReleaseError(f"the audit of the release found what reveals solutions; "
                               f"nothing was written:\n  {shown}{more}")
        for d in [staging, *(p for p in staging.rglob("*") if p.is_dir())]:
            os.chmod(d, 0o755)
        if out.exists():
            out.rmdir()
        os.rename(staging, out)
    except BaseException:
        from klbook_grader.sandbox import remove_tree

        remove_tree(staging)
        raise
    return ReleaseReport(out, n_files, left_out, regenerated)
