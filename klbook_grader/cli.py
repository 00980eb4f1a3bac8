"""The ``klbook`` command line: ``klbook grade`` (one notebook or a class), ``klbook release``
and ``klbook make-student``."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def write_result(path: str, result: dict) -> None:
    """Write the JSON result atomically: a new file next to ``path``, then renamed over it.

    Whatever is at ``path`` (a FIFO, a symbolic link, a file being read) is replaced, never
    opened or followed; the grader writes it only after the sandbox is gone.
    """
    from klbook_grader.batch import atomic_write_text

    atomic_write_text(Path(os.path.abspath(path)), json.dumps(result, indent=1))


def _no_hidden_tests(command: str) -> int | None:
    """Exit status 2 with a message when this copy of klbook_lib has no hidden tests (a
    student release or the published wheel); ``None`` when it has them."""
    from klbook_grader.release import has_hidden_tests

    if has_hidden_tests():
        return None
    print(f"klbook {command}: this copy of the book has no reference solutions or hidden "
          "tests (it is a student release or the published wheel); this command needs the "
          "instructor's full repository", file=sys.stderr)
    return 2


def _grade(args: argparse.Namespace) -> int:
    from klbook_grader.grader import GraderError, format_report, grade

    if (status := _no_hidden_tests("grade")) is not None:
        return status
    if os.path.isdir(args.notebook):           # a class: DIR/<student>/exNN_....ipynb
        from klbook_grader.batch import run_cli

        if args.csv is None or args.json or args.exercise:
            print("klbook grade: grading a folder needs --csv FILE (and takes --json-dir, "
                  "--jobs; not --json or --exercise)", file=sys.stderr)
            return 2
        return run_cli(args.notebook, args.csv, args.json_dir, args.jobs,
                       timeout=args.timeout, cell_timeout=args.cell_timeout,
                       call_timeout=args.call_timeout,
                       unsafe_no_isolation=args.unsafe_no_isolation)
    if args.csv is not None or args.json_dir is not None or args.jobs != 1:
        print("klbook grade: --csv, --json-dir and --jobs are for a folder of submissions; "
              "for one notebook use --json FILE", file=sys.stderr)
        return 2
    try:
        result = grade(args.notebook, exercise=args.exercise, timeout=args.timeout,
                       cell_timeout=args.cell_timeout, call_timeout=args.call_timeout,
                       unsafe_no_isolation=args.unsafe_no_isolation)
    except GraderError as exc:
        print(f"klbook grade: {exc}", file=sys.stderr)
        return 2
    if args.json:
        try:
            write_result(args.json, result)
        except OSError as exc:
            print(f"klbook grade: --json: cannot write {args.json!r}: {exc.strerror or exc}",
                  file=sys.stderr)
            print(format_report(result), flush=True)
            return 2
    print(format_report(result), flush=True)
    return 0


def _jobs(text: str) -> int:
    from klbook_grader.batch import MAX_JOBS

    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_JOBS:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {MAX_JOBS}, got {text!r}")
    return n


def _release(args: argparse.Namespace) -> int:
    from klbook_grader.release import ReleaseError, release

    if (status := _no_hidden_tests("release")) is not None:
        return status
    try:
        report = release(args.outdir)
    except ReleaseError as exc:
        print(f"klbook release: {exc}", file=sys.stderr)
        return 2
    print(report.describe(), flush=True)
    return 0


def _make_student(args: argparse.Namespace) -> int:
    from klbook_grader.student import make_student

    if (status := _no_hidden_tests("make-student")) is not None:
        return status
    stale = make_student(check=args.check)
    for p in stale:
        print(("stale: " if args.check else "wrote: ") + str(p))
    if args.check and stale:
        print("student notebooks are out of date: run `klbook make-student`")
        return 1
    if not stale:
        print("student notebooks are up to date")
    return 0


def main(argv: list[str] | None = None) -> int:
    from klbook_grader.batch import safe_output

    for stream in (sys.stdout, sys.stderr):     # whatever the terminal's encoding
        safe_output(stream)
    parser = argparse.ArgumentParser(prog="klbook", description="Tools of the KL-in-RL book.")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="grade a submitted exercise notebook (in a sandbox)")
    g.add_argument("notebook", help="a notebook, or a folder of submissions "
                                    "(DIR/<student>/exNN_....ipynb; needs --csv)")
    g.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE")
    g.add_argument("--timeout", type=float, default=None,
                   help="total seconds for the notebook (default 60, more for questions "
                        "that declare long calls)")
    g.add_argument("--cell-timeout", type=float, default=20.0, help="seconds per cell (default 20)")
    g.add_argument("--call-timeout", type=float, default=5.0,
                   help="seconds per call of a student's function (default 5)")
    g.add_argument("--exercise", help="exercise name if the file name does not say (exNN_...)")
    g.add_argument("--unsafe-no-isolation", action="store_true",
                   help="run the notebook WITHOUT the bubblewrap sandbox (only for notebooks "
                        "you trust: their code can then read the answers and damage files)")
    g.add_argument("--csv", metavar="FILE",
                   help="grade a folder of submissions (DIR/<student>/exNN_....ipynb) and "
                        "write one row per question to FILE")
    g.add_argument("--json-dir", metavar="DIR",
                   help="with a folder: one JSON file per student here (default: next to "
                        "the CSV, in <csv name>-json/)")
    g.add_argument("--jobs", type=_jobs, default=1,
                   help="with a folder: notebooks graded at once, each in its own sandbox "
                        "(default 1)")
    g.set_defaults(func=_grade)
    r = sub.add_parser("release", help="write a student copy of the book: no reference "
                                       "solutions, no hidden tests")
    r.add_argument("outdir", help="a new or empty folder")
    r.set_defaults(func=_release)
    m = sub.add_parser("make-student", help="generate exercises/*.ipynb from exercises/masters")
    m.add_argument("--check", action="store_true", help="only report stale files; exit 1 if any")
    m.set_defaults(func=_make_student)
    from klbook_grader.start import add_parser as add_start   # klbook start exNN [DIR]

    add_start(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:  # noqa: BLE001 - the grader itself failed: exit status 2
        print(f"klbook {args.command}: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
