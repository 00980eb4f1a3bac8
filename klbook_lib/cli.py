"""The ``klbook`` command line: ``klbook grade`` and ``klbook make-student``."""
from __future__ import annotations

import argparse
import json
import sys


def _grade(args: argparse.Namespace) -> int:
    from klbook_lib.grading.grader import GraderError, format_report, grade

    try:
        result = grade(args.notebook, exercise=args.exercise, timeout=args.timeout,
                       cell_timeout=args.cell_timeout, call_timeout=args.call_timeout)
    except GraderError as exc:
        print(f"klbook grade: {exc}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    print(format_report(result), flush=True)
    return 0


def _make_student(args: argparse.Namespace) -> int:
    from klbook_lib.grading.student import make_student

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
    parser = argparse.ArgumentParser(prog="klbook", description="Tools of the KL-in-RL book.")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="grade a submitted exercise notebook")
    g.add_argument("notebook")
    g.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE")
    g.add_argument("--timeout", type=float, default=60.0, help="total seconds (default 60)")
    g.add_argument("--cell-timeout", type=float, default=20.0, help="seconds per cell (default 20)")
    g.add_argument("--call-timeout", type=float, default=5.0,
                   help="seconds per call of a student's function (default 5)")
    g.add_argument("--exercise", help="exercise name if the notebook does not say (exNN_...)")
    g.set_defaults(func=_grade)
    m = sub.add_parser("make-student", help="generate exercises/*.ipynb from exercises/masters")
    m.add_argument("--check", action="store_true", help="only report stale files; exit 1 if any")
    m.set_defaults(func=_make_student)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:  # noqa: BLE001 - the grader itself failed: exit status 2
        print(f"klbook {args.command}: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
