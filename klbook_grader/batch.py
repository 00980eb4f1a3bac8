"""Grading a whole class: ``klbook grade DIR --csv FILE``.

The submissions folder has **one folder per student**, holding that student's notebooks::

    DIR/
      alice/
        ex01_kl_definition.ipynb
        ex04_estimating_kl.ipynb
      bob/
        ex01_kl_definition.ipynb

The student is the folder's name; the exercise comes from the notebook's file name
(``exNN`` in it, exactly as for one notebook). Every notebook is graded by
:func:`klbook_grader.grader.grade`, in its own sandbox, exactly as ``klbook grade
FILE`` does; with ``jobs > 1`` several sandboxes run at once (each has its own private
filesystem, PID and network namespaces: none sees the others, nor this folder).

What does not follow the layout is refused with a message, never guessed at: notebooks
lying directly in ``DIR`` stop the whole run before anything is graded (that is another
layout); inside a student's folder, a notebook in a subfolder, a symbolic link, a notebook
whose name names no exercise or two notebooks for the same exercise are listed as
"not graded" with the reason, and the rest of the class is graded. A folder whose name is
not a usable student name (control or invisible characters, blanks at either end, longer
than 100 characters) is not graded either.

Results: one CSV row per question (``student, notebook, question, points, max,
seconds, words``), plus one JSON file per student with every notebook's full result. A
notebook with a report the instructor grades by hand (a project's Markdown cell tagged
``report``) gets one more row, ``question = report``, with ``points`` empty, ``max = manual``
and the report's word count in ``words`` (the only rows with a ``words`` value). Every text
cell of the CSV is cleaned (no control characters) and defused against formula injection
(a cell starting with ``=``, ``+``, ``-`` or ``@`` gets a leading apostrophe).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import queue
import re
import stat
import sys
import tempfile
import threading
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from klbook_grader import cgroups
from klbook_grader.grader import GraderError, find_exercise, grade, isolation
from klbook_grader.protocol import clean

LAYOUT = "DIR/<student>/exNN_<name>.ipynb"
CSV_COLUMNS = ("student", "notebook", "question", "points", "max", "seconds", "words")
REPORT_ROW = "report"            # the question cell of a hand-graded report (a project's)
MANUAL = "manual"                # its "max": graded by hand, not by the grader
MAX_REPORT_BYTES = 50 << 20      # a notebook larger than this is not read for its report
NOT_GRADED = "(not graded)"
NO_NOTEBOOK = "(no notebook)"
MAX_NAME = 100
MAX_JOBS = 64
_FORMULA_START = ("=", "+", "-", "@")


class LayoutError(GraderError):
    """The submissions folder does not follow :data:`LAYOUT` (nothing was graded)."""


@dataclass
class Submission:
    """One notebook of one student, graded or refused."""

    student: str
    notebook: str                  # the file name (or a path below the student's folder)
    path: Path | None = None       # None: not graded (see ``error``)
    exercise: str | None = None
    error: str | None = None       # why it was not graded
    result: dict | None = None

    @property
    def graded(self) -> bool:
        return self.result is not None


@dataclass
class Student:
    name: str
    folder: Path
    error: str | None = None                     # the folder itself was refused
    submissions: list = field(default_factory=list)
    ignored: list = field(default_factory=list)  # other files in the folder, not graded


# ---------------------------------------------------------------- names and CSV cells
def not_utf8(name: str) -> str | None:
    """Why ``name`` (as ``os.scandir`` gives it) is not valid UTF-8, or ``None``: its bytes are
    shown as escapes, never dropped (``bad\\xff`` would otherwise show as ``bad``, issue 36)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(name)
        return f"the name is not valid UTF-8 ({ascii(raw)[2:-1]}): rename it"
    return None


def student_name_problem(name: str) -> str | None:
    """Why a folder name cannot be a student's name, or ``None`` if it can."""
    if not name:
        return "the name is empty"
    if not_utf8(name):
        return not_utf8(name)
    if len(name) > MAX_NAME:
        return f"the name is longer than {MAX_NAME} characters"
    if not name.isprintable():
        return "the name contains control or invisible characters"
    if name != name.strip():
        return "the name begins or ends with a blank"
    if name.startswith("."):
        return "the name begins with a dot"
    return None


def csv_cell(text) -> str:
    """A text cell that no spreadsheet runs: one clean line, and a leading apostrophe when
    it would start with ``=``, ``+``, ``-`` or ``@`` (OWASP's advice on CSV injection)."""
    text = clean(text, 300)
    if text.startswith(_FORMULA_START):
        text = "'" + text
    return text


_HASHED = re.compile(r".*-[0-9a-f]{10}")


def json_filename(student: str, hashed: bool = False) -> str:
    """The file name of a student's JSON: the name itself when it is plain (letters, digits,
    ``._-``), else (or with ``hashed``) a plain version of it plus ``-`` and a hash of the
    real name. A plain name that itself ends like a hash (``bob-be1b495986``) is hashed too,
    so that no plain name can be another student's hashed one."""
    ascii_name = unicodedata.normalize("NFKD", student).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", ascii_name).strip("._-")[:80] or "student"
    if hashed or slug != student or _HASHED.fullmatch(slug):
        slug += "-" + hashlib.sha256(student.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return slug + ".json"


def json_filenames(students: list[str]) -> dict[str, str]:
    """Every student's JSON file name, none shared, even on a file system that ignores case
    (``Bob`` and ``bob``: both get the hashed form). Raises :class:`LayoutError` in the
    (astronomically unlikely) case of two hashes alike."""
    names = {s: json_filename(s) for s in students}
    folded: dict[str, list[str]] = {}
    for s, f in names.items():
        folded.setdefault(f.casefold(), []).append(s)
    for group in folded.values():
        if len(group) > 1:
            for s in group:
                names[s] = json_filename(s, hashed=True)
    if len({f.casefold() for f in names.values()}) != len(names):
        raise LayoutError("two students' JSON files would have the same name; rename one folder")
    return names


# ---------------------------------------------------------------- finding the submissions
def _count_notebooks(folder: Path, cap: int = 1000) -> int:
    """Notebooks anywhere below ``folder`` (symbolic links not followed, at most ``cap``
    entries looked at)."""
    n = seen = 0
    for _root, dirs, files in os.walk(folder, followlinks=False):
        n += sum(f.endswith(".ipynb") for f in files)
        seen += len(dirs) + len(files)
        if seen > cap:
            break
    return n


def _scan_student(student: Student) -> None:
    try:
        entries = sorted(os.scandir(student.folder), key=lambda e: e.name)
    except OSError as exc:
        student.error = f"the folder cannot be read ({exc.strerror or exc})"
        return
    by_exercise: dict[str, list[Submission]] = {}
    for e in entries:
        if e.name.startswith("."):           # .ipynb_checkpoints, .DS_Store...
            continue
        shown = clean(e.name, 200)
        try:
            st = e.stat(follow_symlinks=False)
        except OSError as exc:
            student.ignored.append(f"{shown} (cannot be read: {exc.strerror or exc})")
            continue
        if stat.S_ISLNK(st.st_mode):
            if e.name.endswith(".ipynb"):
                student.submissions.append(Submission(
                    student.name, e.name, error="a symbolic link (not followed): submit the "
                                                 "notebook itself"))
            else:
                student.ignored.append(f"{shown} (a symbolic link, not followed)")
            continue
        if stat.S_ISDIR(st.st_mode):
            n = _count_notebooks(Path(e.path))
            if n:
                student.submissions.append(Submission(
                    student.name, e.name + "/", error=f"a subfolder holding {n} notebook(s): "
                    f"notebooks must lie directly in the student's folder ({LAYOUT})"))
            else:
                student.ignored.append(f"{shown}/ (a folder without notebooks)")
            continue
        if not e.name.endswith(".ipynb"):
            student.ignored.append(f"{shown} (not a notebook)")
            continue
        if not_utf8(e.name):
            student.submissions.append(Submission(student.name, ascii(os.fsencode(e.name))[2:-1],
                                                  error=not_utf8(e.name)))
            continue
        if not stat.S_ISREG(st.st_mode):
            student.submissions.append(Submission(student.name, e.name,
                                                  error="not a regular file"))
            continue
        sub = Submission(student.name, e.name, path=Path(e.path))
        try:
            sub.exercise, _ = find_exercise(sub.path, None, None)
        except GraderError:
            sub.path, sub.error = None, ("its file name names no exercise, or several: it must "
                                         "contain exactly one exNN, as in ex01_kl_definition.ipynb")
        else:
            by_exercise.setdefault(sub.exercise, []).append(sub)
        student.submissions.append(sub)
    for ex, subs in by_exercise.items():
        if len(subs) > 1:
            names = ", ".join(clean(s.notebook, 100) for s in subs)
            for s in subs:
                s.path = None
                s.error = (f"{len(subs)} notebooks for {ex} ({names}): none of them was graded; "
                           "keep one and grade again")


def find_submissions(folder: str | os.PathLike) -> tuple[list[Student], list[str]]:
    """The students and notebooks of a submissions folder, and notes on what was ignored.

    Raises :class:`LayoutError` if ``folder`` is not a folder, holds notebooks directly
    or holds no student folder at all.
    """
    root = Path(folder)
    if not root.is_dir():
        raise LayoutError(f"submissions: {clean(str(root), 200)!r} is not a folder")
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise LayoutError(f"submissions: cannot read {clean(str(root), 200)!r}: "
                          f"{exc.strerror or exc}") from None
    loose = [e.name for e in entries if e.name.endswith(".ipynb") and not e.name.startswith(".")]
    if loose:
        example = clean(loose[0], 100)
        raise LayoutError(
            f"submissions: {clean(str(root), 200)!r} holds notebooks directly ({len(loose)}, e.g. "
            f"{example!r}). Grading a class expects one folder per student: {LAYOUT}. Move each "
            "student's notebooks into a folder named after the student, or grade a single "
            "notebook with `klbook grade FILE`")
    students, notes = [], []
    for e in entries:
        if e.name.startswith("."):
            continue
        shown = clean(e.name, 100)
        if e.is_symlink():
            notes.append(f"ignored {shown!r}: a symbolic link (not followed)")
            continue
        if not e.is_dir(follow_symlinks=False):
            notes.append(f"ignored {shown!r}: not a student folder")
            continue
        s = Student(e.name, Path(e.path))
        s.error = student_name_problem(e.name)
        if s.error is None:
            _scan_student(s)
        students.append(s)
    if not students:
        raise LayoutError(f"submissions: no student folder in {clean(str(root), 200)!r} "
                          f"(expected one folder per student: {LAYOUT})")
    return students, notes


# ---------------------------------------------------------------- grading
def _worker(tasks: queue.Queue, done: queue.Queue, kwargs: dict) -> None:
    # One thread grades one notebook at a time from start to end: bwrap's --die-with-parent
    # follows the thread that started it, which lives until the queue is empty.
    while True:
        try:
            sub = tasks.get_nowait()
        except queue.Empty:
            return
        t0 = time.monotonic()
        try:
            sub.result = grade(sub.path, **kwargs)
        except GraderError as exc:
            sub.error = f"the grader could not grade it: {clean(str(exc), 300)}"
        except Exception as exc:  # noqa: BLE001 - one notebook never stops the batch
            sub.error = f"internal error of the grader: {type(exc).__name__}: {clean(str(exc), 300)}"
        done.put((sub, time.monotonic() - t0))


def grade_class(folder: str | os.PathLike, *, jobs: int = 1,
                progress: Callable[[Submission, float, int, int], None] | None = None,
                **grade_kwargs) -> dict:
    """Grade every notebook of a submissions folder (:data:`LAYOUT`).

    ``jobs`` notebooks are graded at once, each in its own sandbox; ``grade_kwargs`` go to
    :func:`~klbook_grader.grader.grade` (time limits, ``unsafe_no_isolation``).
    ``progress(submission, seconds, k, n)`` is called after each notebook. Raises
    :class:`LayoutError` for a folder that does not follow the layout and
    :class:`~klbook_grader.grader.IsolationUnavailable` when no sandbox can be built,
    both before anything runs; a notebook that fails in any way only fails itself.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_JOBS:
        raise ValueError(f"jobs: must be an integer from 1 to {MAX_JOBS}, got {jobs!r}")
    if "exercise" in grade_kwargs:
        raise ValueError("exercise: not available when grading a folder; every notebook's "
                         "file name must name its exercise (exNN_...)")
    start = time.monotonic()
    students, notes = find_submissions(folder)
    backend = isolation(bool(grade_kwargs.get("unsafe_no_isolation", False)))
    groups = cgroups.support()
    if jobs > 1 and not groups.available:
        raise GraderError(
            f"--jobs {jobs}: grading several notebooks at once needs cgroups, which give each "
            f"sandbox its own share of CPU and memory (without them one notebook can starve "
            f"the others); this machine has none ({groups.reason}). Grade with --jobs 1")
    todo = [s for st in students for s in st.submissions if s.path is not None]
    tasks: queue.Queue = queue.Queue()
    done: queue.Queue = queue.Queue()
    for sub in todo:
        tasks.put(sub)
    threads = [threading.Thread(target=_worker, args=(tasks, done, grade_kwargs), daemon=True,
                                name=f"klbook-grade-{i}") for i in range(min(jobs, len(todo)))]
    for t in threads:
        t.start()
    for k in range(1, len(todo) + 1):
        sub, seconds = done.get()
        if progress is not None:
            progress(sub, seconds, k, len(todo))
    for t in threads:
        t.join()
    return {"folder": str(folder), "students": students, "notes": notes, "jobs": jobs,
            "isolation": f"{backend.describe()}; {groups.describe()}",
            "seconds": round(time.monotonic() - start, 2)}


# ---------------------------------------------------------------- results
def _max_points(exercise: str | None) -> float | None:
    if exercise is None:
        return None
    from klbook_grader.hidden import bank

    return float(sum(q.points for q in bank.questions(exercise)))


def _num(x: float) -> str:
    return f"{x:.4f}".rstrip("0").rstrip(".")


def report_spec(exercise: str | None) -> dict | None:
    """The hand-graded report of an exercise (its module's ``REPORT``: the cell tag and the
    placeholder text), or ``None`` when it has none."""
    if exercise is None:
        return None
    from klbook_grader.hidden import bank

    module = bank.REGISTRY.get(exercise)
    return getattr(module, "REPORT", None) if module is not None else None


def report_words(path: Path | None, spec: dict) -> int:
    """Words in the notebook's Markdown cells tagged ``spec["tag"]``, the placeholder left out
    (0 for a missing, unreadable or unanswered report). The notebook is read as JSON data, never run."""
    if path is None:
        return 0
    try:
        if path.stat().st_size > MAX_REPORT_BYTES:
            return 0
        cells = json.loads(path.read_bytes().decode("utf-8")).get("cells", [])
        texts = []
        for c in cells:
            tags = (c.get("metadata") or {}).get("tags") or []
            if c.get("cell_type") == "markdown" and spec["tag"] in tags:
                src = c.get("source", "")
                texts.append("".join(src) if isinstance(src, list) else str(src))
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, TypeError):
        return 0
    text = "\n".join(texts).replace(spec.get("placeholder", ""), " ")
    return sum(1 for word in text.split() if re.search(r"[^\W_]", word))   # blank-separated, with a letter or digit


def csv_rows(batch: dict) -> list[list[str]]:
    """The CSV's rows (header first), students and notebooks in name order."""
    rows = [list(CSV_COLUMNS)]
    for st in batch["students"]:
        name = csv_cell(st.name)
        if st.error is not None:
            rows.append([name, "", NOT_GRADED, "0", "0", "", ""])
            continue
        if not st.submissions:
            rows.append([name, "", NO_NOTEBOOK, "0", "0", "", ""])
            continue
        for sub in st.submissions:
            nb = csv_cell(sub.notebook)
            if not sub.graded:
                mx = _max_points(sub.exercise)
                # max: the exercise's points, or 0 when the file's name tells no exercise
                rows.append([name, nb, NOT_GRADED, "0", _num(mx or 0.0), "", ""])
                continue
            for q in sub.result["questions"]:
                sec = q.get("seconds")
                rows.append([name, nb, csv_cell(q["id"]), _num(q["points"]), _num(q["max_points"]),
                             "" if sec is None else _num(sec), ""])
            spec = report_spec(sub.exercise)
            if spec is not None:        # graded by hand: no points here, its length for the reader
                rows.append([name, nb, REPORT_ROW, "", MANUAL, "", str(report_words(sub.path, spec))])
    return rows


def student_record(st: Student) -> dict:
    """A student's JSON: their notebooks' full results, what was not graded and why."""
    notebooks = []
    for sub in st.submissions:
        entry = {"notebook": sub.notebook, "exercise": sub.exercise,
                 "status": "graded" if sub.graded else "not graded"}
        if sub.graded:
            entry["score"] = sub.result["score"]
            entry["max_score"] = sub.result["max_score"]
            entry["result"] = sub.result
            spec = report_spec(sub.exercise)
            if spec is not None:
                entry["report"] = {"graded": MANUAL, "words": report_words(sub.path, spec)}
        else:
            entry["error"] = sub.error
            mx = _max_points(sub.exercise)
            if mx is not None:
                entry["score"], entry["max_score"] = 0.0, mx
        notebooks.append(entry)
    maxima = {sub.exercise: _max_points(sub.exercise) for sub in st.submissions if sub.exercise}
    rec = {"student": st.name, "score": round(sum(n.get("score", 0.0) for n in notebooks), 4),
           "max_score": sum(maxima.values()), "notebooks": notebooks}
    if st.error is not None:
        rec["error"] = f"this folder was not graded: {st.error}"
    elif not st.submissions:
        rec["error"] = f"no notebook in this folder (expected {LAYOUT})"
    if st.ignored:
        rec["ignored"] = st.ignored
    return rec


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a new file beside ``path``, then rename it over ``path``.

    Whatever is at ``path`` (a FIFO, a symbolic link, a file being read) is replaced, never
    opened or followed.
    """
    fd, tmp = tempfile.mkstemp(prefix=".klbook-", suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def default_json_dir(csv_path: str | os.PathLike) -> Path:
    """Where the per-student JSON files go by default: ``<csv name>-json/`` next to the CSV."""
    p = Path(csv_path)
    return p.with_name(p.stem + "-json")


def check_outputs(folder: str | os.PathLike, csv_path: str | os.PathLike,
                  json_dir: str | os.PathLike) -> None:
    """Refuse outputs inside the submissions folder (a later run would take them for a
    student), a CSV path that is a folder and folders that cannot be written. Before grading."""
    root = Path(folder).resolve()
    for what, p in (("--csv", Path(csv_path)), ("--json-dir", Path(json_dir))):
        full = p.resolve()
        if full == root or root in full.parents:
            raise LayoutError(f"{what}: {clean(str(p), 200)!r} is inside the submissions folder; "
                              "write the results elsewhere")
    if Path(csv_path).is_dir():
        raise LayoutError(f"--csv: {clean(str(csv_path), 200)!r} is a folder, not a file name")
    for what, d in (("--csv", Path(csv_path).resolve().parent), ("--json-dir", Path(json_dir).resolve())):
        existing = next(p for p in (d, *d.parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise LayoutError(f"{what}: cannot write into {clean(str(existing), 200)!r}")


def write_outputs(batch: dict, csv_path: str | os.PathLike, json_dir: str | os.PathLike) -> None:
    """Write the CSV and one JSON per student (each to a new file, then renamed)."""
    jdir = Path(json_dir)
    jdir.mkdir(parents=True, exist_ok=True)
    Path(csv_path).resolve().parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(csv_rows(batch))
    atomic_write_text(Path(csv_path).resolve(), buf.getvalue())
    files = json_filenames([st.name for st in batch["students"]])
    for st in batch["students"]:
        atomic_write_text(jdir / files[st.name], json.dumps(student_record(st), indent=1) + "\n")


def summary(batch: dict) -> str:
    """One line: how many notebooks were graded, of how many students, how long it took."""
    students = batch["students"]
    subs = [s for st in students for s in st.submissions]
    graded = [s for s in subs if s.graded]
    not_graded = len(subs) - len(graded) + sum(st.error is not None for st in students)
    with_notes = sum(bool(s.result["notes"]) for s in graded)
    empty = sum(st.error is None and not st.submissions for st in students)
    parts = [f"graded {len(graded)} notebook(s) of {len(students)} student(s) in "
             f"{batch['seconds']:.1f} s (jobs {batch['jobs']})"]
    if with_notes:
        parts.append(f"{with_notes} with notes")
    if not_graded:
        parts.append(f"{not_graded} NOT graded (see above)")
    if empty:
        parts.append(f"{empty} student folder(s) without a notebook")
    return "Summary: " + "; ".join(parts)


def progress_line(sub: Submission, seconds: float, k: int, n: int) -> str:
    where = f"{clean(sub.student, 60)}/{clean(sub.notebook, 80)}"
    if not sub.graded:
        return f"[{k}/{n}] {where}: NOT graded: {clean(sub.error, 300)}"
    r = sub.result
    extra = f"; {len(r['notes'])} note(s)" if r["notes"] else ""
    return f"[{k}/{n}] {where}: {_num(r['score'])}/{_num(r['max_score'])} ({seconds:.1f} s{extra})"


def refused_lines(batch: dict) -> list[str]:
    """What was not graded before anything ran (names, layout), one line each."""
    out = []
    for st in batch["students"]:
        who = clean(st.name, 60)
        if st.error is not None:       # ascii(): escapes what the terminal would interpret
            out.append(f"{ascii(st.name)[:120]}: folder NOT graded: {st.error}; rename it")
            continue
        if not st.submissions:
            out.append(f"{who}: no notebook (expected {LAYOUT})")
        for sub in st.submissions:
            if sub.path is None and sub.result is None:
                out.append(f"{who}/{clean(sub.notebook, 80)}: NOT graded: {clean(sub.error, 300)}")
    return out


def safe_output(stream) -> None:
    """Make a text stream write what its encoding cannot as escapes (``\\u4e2d``) instead of
    raising UnicodeEncodeError (a student's name on a terminal that is not UTF-8)."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError):
            pass


def run_cli(folder: str, csv_path: str, json_dir: str | None, jobs: int, out=None,
            **grade_kwargs) -> int:
    """``klbook grade DIR --csv FILE``: grade, print progress and a summary, write the files.
    Returns the exit status: 0 when the results were written, 2 when nothing could be graded."""
    out = out or sys.stdout
    err = sys.stderr
    for stream in (out, err):          # a name the terminal cannot encode never stops the batch
        safe_output(stream)
    json_dir = json_dir or str(default_json_dir(csv_path))
    try:
        check_outputs(folder, csv_path, json_dir)
        if grade_kwargs.get("unsafe_no_isolation"):
            print("WARNING: grading WITHOUT isolation (--unsafe-no-isolation): every notebook "
                  "can read the other submissions and your files", file=out, flush=True)
        batch = grade_class(folder, jobs=jobs,
                            progress=lambda *a: print(progress_line(*a), file=out, flush=True),
                            **grade_kwargs)
    except GraderError as exc:
        print(f"klbook grade: {exc}", file=err)
        return 2
    except KeyboardInterrupt:
        print("klbook grade: interrupted; no result was written", file=err)
        return 130
    if "NO cgroups" in batch["isolation"]:
        print("WARNING: " + batch["isolation"].split("; ")[-1], file=out)
    for line in batch["notes"] + refused_lines(batch):
        print(line, file=out)
    try:
        write_outputs(batch, csv_path, json_dir)
    except OSError as exc:
        print(f"klbook grade: cannot write the results: {exc.strerror or exc}", file=err)
        return 2
    print(f"Wrote {clean(csv_path, 200)} and {len(batch['students'])} JSON file(s) in "
          f"{clean(json_dir, 200)}", file=out)
    print(summary(batch), file=out, flush=True)
    return 0
