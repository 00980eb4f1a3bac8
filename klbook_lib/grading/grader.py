"""The grader's side: run a submission in a separate process, compare answers here.

:func:`grade` never raises on a bad submission and never hangs: whatever the notebook
does, it returns a result with per-question points and messages. Expected answers are
computed here, in the grader's process, from the reference solutions in
:mod:`klbook_lib.grading.hidden`; the student's process only ever sees test inputs.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


from klbook_lib.grading import compare

PACKAGE_DIR = Path(__file__).resolve().parents[1]          # .../klbook_lib
REPO_DIR = PACKAGE_DIR.parent
GRADING_DIR = Path(__file__).resolve().parent
# What the student's process gets of the library: the public checker and nothing else.
SANDBOX_FILES = ("runtime.py", "grading/__init__.py", "grading/checker.py",
                 "grading/compare.py", "grading/public_cases.json")
# The sandbox's own package __init__: it does not depend on what the real one imports.
SANDBOX_INIT = '''"""klbook_lib as a notebook sees it while being graded: the checker and runtime only."""
import importlib


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return importlib.import_module(f"{__name__}.{name}")
'''
ALLOWED_MODULES = ("klbook_lib", "klbook_lib.runtime", "klbook_lib.grading",
                   "klbook_lib.grading.checker", "klbook_lib.grading.compare")
MAX_RESULT_BYTES = 20_000_000
MAX_OUTPUT_CHARS = 1_000_000


MAX_MEMORY_BYTES = 4 << 30       # address space of the student's process
MAX_FILE_BYTES = 64 << 20        # largest file it may write


def blocked_roots() -> list[str]:
    """Paths the student's process may not open.

    With the usual editable install that is the whole repository (reference solutions,
    hidden tests, masters, git history) except the directories holding the Python
    environment; with a regular install it is the installed package.
    """
    env_dirs = [Path(p).resolve() for p in (sys.prefix, *site.getsitepackages())]
    if any(PACKAGE_DIR.is_relative_to(e) for e in env_dirs):
        return [str(PACKAGE_DIR)]
    roots = []
    for entry in REPO_DIR.iterdir():
        entry = entry.resolve()
        if not any(e.is_relative_to(entry) for e in env_dirs):
            roots.append(str(entry))
    return roots


class GraderError(RuntimeError):
    """The grader itself could not run (unknown exercise, missing file...)."""


def _drain(stream, keep: int, sink: list) -> None:
    """Read a pipe to its end, keeping the first ``keep`` bytes (so a flood cannot block)."""
    kept = 0
    while True:
        chunk = stream.read(65536)
        if not chunk:
            break
        if kept < keep:
            sink.append(chunk[: keep - kept])
            kept += len(sink[-1])
    stream.close()


def find_exercise(path: Path, nb: Any, exercise: str | None) -> str:
    from klbook_lib.grading.hidden import bank

    names = bank.exercise_names()
    if exercise is not None:
        if exercise not in names:
            raise GraderError(f"exercise: unknown exercise {exercise!r}; known: {', '.join(names)}")
        return exercise
    try:
        meta = nb["metadata"]["klbook"]["exercise"]
        if meta in names:
            return meta
    except (TypeError, KeyError):
        pass
    for name in names:
        if path.stem.startswith(name.split("_")[0]):
            return name
    raise GraderError(f"cannot tell which exercise {path.name} is: name the file exNN_... "
                      "or pass --exercise")


def _read_cells(nb: Any) -> list[str]:
    """The code cells' sources, tolerating the shapes a hand-edited notebook can take."""
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("the notebook has no list of cells")
    sources = []
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        if isinstance(src, list):
            src = "".join(s for s in src if isinstance(s, str))
        if not isinstance(src, str):
            raise ValueError("a code cell's source is not text")
        sources.append(src)
    return sources


def _make_sandbox(root: Path) -> tuple[Path, Path]:
    lib = root / "lib"
    for rel in SANDBOX_FILES:
        dst = lib / "klbook_lib" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PACKAGE_DIR / rel, dst)
    (lib / "klbook_lib" / "__init__.py").write_text(SANDBOX_INIT, encoding="utf-8")
    shutil.copyfile(GRADING_DIR / "runner.py", root / "runner.py")
    work = root / "work"
    (work / "tmp").mkdir(parents=True)
    return lib, work


def run_student(cells: list[str], questions: list[dict], notebook: Path, timeout: float,
                cell_timeout: float, call_timeout: float) -> tuple[dict | None, str]:
    """Execute ``cells`` in a fresh interpreter; return (its report or None, a failure reason)."""
    with tempfile.TemporaryDirectory(prefix="klbook-grade-") as tmp:
        root = Path(tmp)
        lib, work = _make_sandbox(root)
        shutil.copyfile(notebook, work / notebook.name)   # the notebook sees a copy, never the original
        read_fd, write_fd = os.pipe()
        plan = {"sandbox": str(lib), "site": site.getsitepackages(), "workdir": str(root),
                "blocked_roots": blocked_roots(), "max_memory": MAX_MEMORY_BYTES,
                "max_file_size": MAX_FILE_BYTES,
                "allowed_modules": list(ALLOWED_MODULES), "cells": cells, "questions": questions,
                "cell_timeout": cell_timeout, "call_timeout": call_timeout,
                "max_output": MAX_OUTPUT_CHARS, "result_fd": write_fd}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work),
               "TMPDIR": str(work / "tmp"), "MPLBACKEND": "Agg", "MPLCONFIGDIR": str(work / "tmp"),
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0",
               "PYTHONDONTWRITEBYTECODE": "1", "KLBOOK_GRADING": "1", "LANG": "C.UTF-8"}
        proc = subprocess.Popen([sys.executable, "-I", "-S", str(root / "runner.py")], cwd=work,
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        result_chunks: list[bytes] = []
        junk: list[bytes] = []
        threads = [threading.Thread(target=_drain, args=(os.fdopen(read_fd, "rb"), MAX_RESULT_BYTES,
                                                         result_chunks), daemon=True),
                   threading.Thread(target=_drain, args=(proc.stdout, 10_000, junk), daemon=True),
                   threading.Thread(target=_drain, args=(proc.stderr, 10_000, junk), daemon=True)]
        for t in threads:
            t.start()
        reason = ""
        try:
            proc.stdin.write(json.dumps(plan).encode())
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            reason = f"the notebook did not finish within the total time limit of {timeout:g} s"
        finally:
            try:  # the whole process group: the runner and anything it left behind
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        for t in threads:
            t.join(timeout=5)
        raw = b"".join(result_chunks)
        if not raw:
            if not reason:
                tail = b"".join(junk).decode("utf-8", "replace").strip().splitlines()[-1:]
                reason = (f"the notebook's process ended before reporting (exit status "
                          f"{proc.returncode}; os._exit, a crash or running out of memory?)"
                          + (f": {tail[0][:200]}" if tail else ""))
            return None, reason
        try:
            report = json.loads(raw.decode("utf-8"))
            if not isinstance(report, dict) or not isinstance(report.get("answers"), dict):
                raise ValueError("not a report")
        except (ValueError, UnicodeDecodeError):
            return None, "the notebook's process sent back an unreadable report"
        return report, reason


def _fmt(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _score_question(q, expected, answer) -> dict:
    """Points and messages for one question, comparing here, in the grader's process."""
    out = {"id": q.id, "title": q.title, "kind": q.kind, "max_points": q.points, "points": 0.0,
           "messages": []}
    if not isinstance(answer, dict):
        answer = {"missing": "no answer was reported"}
    if "missing" in answer:
        out["messages"].append(str(answer["missing"])[:300])
        return out
    if q.kind == "function":
        results = answer.get("cases")
        if not isinstance(results, list) or len(results) != len(expected):
            out["messages"].append("the answers for the test cases are incomplete")
            return out
        passed = 0
        for i, (case, exp, res) in enumerate(zip(q.cases, expected, results)):
            label = f"{'public' if case.public else 'hidden'} case {i + 1}"
            if case.public and case.why:
                label += f" ({case.why})"
            if not isinstance(res, dict) or "value" not in res:
                err = res.get("error", "no result") if isinstance(res, dict) else "no result"
                out["messages"].append(f"{label}: {str(err)[:300]}")
                continue
            ok, why = compare.compare_numeric(exp, res["value"], q.rtol, q.atol, reveal=case.public)
            if ok:
                passed += 1
            else:
                out["messages"].append(f"{label}: {why}")
        out["points"] = q.points * passed / len(expected)
        out["messages"].insert(0, f"{passed}/{len(expected)} test cases passed")
    elif q.kind == "value":
        ok, why = compare.compare_numeric(expected, answer.get("value"), q.rtol, q.atol, reveal=False)
        out["points"] = float(q.points) if ok else 0.0
        out["messages"].append("correct" if ok else why)
    else:
        ok, why = compare.compare_choice(expected, answer.get("value"), q.options)
        out["points"] = float(q.points) if ok else 0.0
        out["messages"].append("correct" if ok else why)
    return out


def grade(notebook: str | os.PathLike, exercise: str | None = None, timeout: float = 60.0,
          cell_timeout: float = 20.0, call_timeout: float = 5.0) -> dict:
    """Grade one submitted notebook. Raises :class:`GraderError` only if grading is impossible."""
    from klbook_lib.grading.hidden import bank

    path = Path(notebook)
    if not path.is_file():
        raise GraderError(f"notebook: no such file {path}")
    if timeout <= 0 or cell_timeout <= 0 or call_timeout <= 0:
        raise GraderError("timeout: time limits must be positive")
    start = time.monotonic()
    notes: list[str] = []
    nb: Any = None
    cells: list[str] | None = None
    try:
        nb = json.loads(path.read_bytes().decode("utf-8"))
        cells = _read_cells(nb)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        notes.append(f"the notebook could not be read ({str(exc)[:200]}); nothing was run")
    name = find_exercise(path, nb, exercise)
    questions = bank.questions(name)
    expected = [q.expected() for q in questions]
    report, reason = None, ""
    if cells is not None:
        if not any(c.strip() for c in cells):
            notes.append("the notebook has no code")
        plan_questions = [{"id": q.id, "kind": q.kind, "name": q.name,
                           "cases": [{"args": c.encoded_args()} for c in q.cases]}
                          for q in questions]
        report, reason = run_student(cells, plan_questions, path, timeout, cell_timeout, call_timeout)
    if reason:
        notes.append(reason)
    answers: dict = {}
    if report is not None:
        answers = report["answers"]
        for cell in report.get("cells", [])[:200]:
            if isinstance(cell, dict) and cell.get("status") == "error":
                notes.append(f"code cell {int(cell.get('index', -1)) + 1} failed: "
                             f"{str(cell.get('error'))[:300]}")
        student_notes = [str(n)[:300] for n in report.get("notes", [])[:200]]
        notes.extend(list(dict.fromkeys(student_notes))[:20])   # unique, in order
        if report.get("output_truncated"):
            notes.append("the notebook printed more than "
                         f"{MAX_OUTPUT_CHARS:,} characters; the rest was discarded")
    scored = [_score_question(q, e, answers.get(q.id)) for q, e in zip(questions, expected)]
    total = sum(s["points"] for s in scored)
    return {"notebook": str(path), "exercise": name, "score": round(total, 4),
            "max_score": float(sum(q.points for q in questions)), "questions": scored,
            "notes": notes, "seconds": round(time.monotonic() - start, 2)}


def format_report(result: dict) -> str:
    lines = [f"Exercise: {result['exercise']}"]
    for note in result["notes"]:
        lines.append("  note: " + " ".join(str(note).split()))
    for q in result["questions"]:
        lines.append(f"{q['id']} {q['title']}: {_fmt(q['points'])}/{_fmt(q['max_points'])}")
        for m in q["messages"]:
            lines.append("    " + " ".join(str(m).split()))
    lines.append(f"Score: {_fmt(result['score'])}/{_fmt(result['max_score'])}")
    return "\n".join(lines)
