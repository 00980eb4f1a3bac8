"""Public checks a student runs inside an exercise notebook.

``check = checker_for("ex01_kl_definition")`` in the setup cell, then ``check("q1")``
after answering question 1 (or ``check()`` for all). The check runs your function on
the public cases (their expected values ship in ``public_cases.json``), prints which
pass and why a failing one fails, and never raises. The grader does not use it: it
runs public *and* hidden cases in its own process.
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
from pathlib import Path
from typing import Any, Callable

from klbook_grader import compare

PUBLIC_CASES = Path(__file__).with_name("public_cases.json")


def _load(exercise: str) -> dict:
    data = json.loads(PUBLIC_CASES.read_text(encoding="utf-8"))
    if exercise not in data:
        raise KeyError(f"no public checks for exercise {exercise!r}")
    return data[exercise]


def _check_one(qid: str, q: dict, ns: dict) -> tuple[int, int]:
    """Print the report of one question; return (passed, total) public cases."""
    head = f"{qid} ({q['title']}, {q['points']} points)"
    missing = object()
    obj = ns.get(q["name"], missing)
    if q["kind"] == "function":
        if obj is missing or not callable(obj):
            print(f"{head}: define the function `{q['name']}` and run its cell first")
            return 0, len(q["cases"])
        if q.get("outcome_checks") and not q["cases"]:
            return _check_outcome(head, obj, q)
        passed = 0
        lines = []
        for i, case in enumerate(q["cases"], 1):
            label = f"  case {i} ({case['why']})"
            try:
                value = obj(*[compare.materialise(a) for a in case["args"]])
            except NotImplementedError:
                print(f"{head}: not implemented yet")
                return 0, len(q["cases"])
            except Exception as exc:  # noqa: BLE001 - report, never raise
                lines.append(f"{label}: FAILED, raised {type(exc).__name__}: {exc}")
                continue
            ok, why = compare.compare_numeric(compare.to_numeric(case["expected"]), compare.encode(value),
                                              q["rtol"], q["atol"])
            passed += ok
            lines.append(f"{label}: " + ("passed" if ok else f"FAILED, {why}"))
        print(f"{head}: {passed}/{len(q['cases'])} public cases pass"
              f" (the grader also runs {q['n_hidden']} hidden cases)")
        print("\n".join(lines))
        return passed, len(q["cases"])
    if obj is missing or obj is None:
        print(f"{head}: not answered yet (set `{q['name']}`)")
        return 0, 1
    if q["kind"] == "choice":
        letter = compare.normalise_choice(compare.encode(obj))
        if letter is None or len(letter) != 1 or letter not in q["options"]:
            print(f"{head}: `{q['name']}` must be one of the letters {', '.join(q['options'])}")
            return 0, 1
        print(f"{head}: answer {letter} recorded; the grader checks it")
        return 1, 1
    try:
        arr = compare.to_numeric(compare.encode(obj))
    except TypeError as exc:
        print(f"{head}: `{q['name']}` must be a number or a list of numbers, got {exc}")
        return 0, 1
    if list(arr.shape) != q["shape"]:
        want = "a single number" if not q["shape"] else f"{q['shape'][0]} numbers"
        print(f"{head}: `{q['name']}` should be {want}, got shape {tuple(arr.shape)}")
        return 0, 1
    if not (arr == arr).all() or abs(arr).max(initial=0) == float("inf"):
        print(f"{head}: `{q['name']}` is not finite")
        return 0, 1
    print(f"{head}: answer has the right form; the grader checks its value "
          f"({compare.tolerance_text(q['rtol'], q['atol'])})")
    return 1, 1


def _check_outcome(head: str, fn: Callable, q: dict) -> tuple[int, int]:
    """Run an outcome-graded function as the grader will (a training run) and judge the result
    with the task's own judge. Skipped while grading: the grader runs it itself."""
    if os.environ.get("KLBOOK_GRADING") == "1":
        print(f"{head}: the grader runs this training itself")
        return 0, len(q["outcome_checks"])
    passed = 0.0
    results: dict = {}
    for check in q["outcome_checks"]:
        key = json.dumps(check["args"])
        try:
            if key not in results:
                results[key] = fn(*check["args"])
            credit, why = getattr(importlib.import_module(check["module"]), check["judge"])(
                results[key], **check["kwargs"])
        except NotImplementedError:
            print(f"{head}: not implemented yet (a function it calls still raises NotImplementedError)")
            return 0, len(q["outcome_checks"])
        except Exception as exc:  # noqa: BLE001 - report, never raise
            print(f"{head}: {check['why']}: FAILED, raised {type(exc).__name__}: {exc}")
            continue
        passed += credit
        print(f"{head}: {check['why']}: credit {credit:g} of 1: {why}")
    runs = q.get("n_hidden_runs", q["n_hidden"])
    others = q["n_hidden"] - runs
    print(f"  (the grader runs {runs} training run{'s' if runs != 1 else ''} like "
          f"{'these' if len(q['outcome_checks']) > 1 else 'this one'}, on seeds of its own"
          + (f", and {others} hidden case{'s' if others != 1 else ''} of another kind: the function's "
             "parts called on hidden inputs)" if others else ")"))
    return passed, len(q["outcome_checks"])


def checker_for(exercise: str) -> Callable[..., None]:
    """The ``check`` function of one exercise notebook."""

    def check(question: str | None = None, *, _ns: dict | None = None) -> None:
        try:
            ns: Any = _ns if _ns is not None else inspect.currentframe().f_back.f_globals
            spec = _load(exercise)
            ids = list(spec) if question is None else [question]
            for qid in ids:
                if qid not in spec:
                    print(f"unknown question {qid!r}; questions: {', '.join(spec)}")
                    continue
                _check_one(qid, spec[qid], ns)
        except Exception as exc:  # noqa: BLE001 - a check must never break the notebook
            print(f"check could not run: {type(exc).__name__}: {exc}")

    return check
