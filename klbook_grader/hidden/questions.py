"""What a graded question is: :class:`Question`, its :class:`Case` s, and the helpers that build them.

Every exercise has its own module (``ex01.py`` ... ``ex14.py``) defining ``EXERCISE`` and
``questions()``; :mod:`klbook_grader.hidden.bank` is the registry that lists them.

A question is one of three kinds:

``function``  the student writes a function ``name``; it is called on every case's
              arguments and compared with the reference within ``rtol``/``atol``;
              points are shared equally among the cases (partial credit).
``value``     the student assigns a number or array to the variable ``name``.
``choice``    the student assigns one letter (multiple choice) to ``name``.

Public cases are shown by ``check()`` in the notebook (their expected values are
shipped in ``public_cases.json``); hidden cases are used only by the grader. A hidden
case may say what it ``probe``s (a classic mistake it catches, never its answer); the
feedback names it.

Outcome-graded cases (the end-to-end tasks of :mod:`klbook_grader.tasks`) carry a ``judge``:
the student's function trains something in the sandbox and returns plain data (trained
parameters, a history); the judge evaluates it here, in the grader's process, with its
own code (it runs the returned policy itself) and returns a credit in [0, 1] with a
message. A question's ``core`` cases must all pass before any of its points count (a function
that ignores the mask passes every case whose pads happen to hold zeros). ``full_marks_at`` lets a question give full marks before every case passes
(e.g. 3 of 4 training seeds), so that a correct solution does not lose points to the
rare seed on which training is slow.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from klbook_grader import compare
from klbook_grader.compare import encode

@dataclass(frozen=True)
class Case:
    args: tuple
    public: bool = False
    why: str = ""
    torch: bool = False        # pass array arguments as torch tensors
    probe: str = ""            # what a hidden case tests (shown in the feedback, not the answer)
    judge: Callable | None = None   # outcome-graded: judge(plain result) -> (credit, message)
    core: bool = False         # the question's points count only once every core case passes
    # The case's answer is the gradient of the function's output (summed) with respect to its
    # first argument, computed by autograd where the function runs; ``grad`` is the reference
    # gradient, written out by hand (a loss right in value but detached fails it, issue 36).
    grad: Callable | None = None

    def encoded_args(self) -> list:
        """The arguments as plain data; arrays marked ``torch`` arrive as float64 tensors."""
        out = []
        for a in self.args:
            enc = encode(np.asarray(a, dtype=float) if isinstance(a, np.ndarray) else a)
            if self.torch and enc["t"] == "array":
                enc["lib"] = "torch"
            out.append(enc)
        return out

    def call_args(self) -> list:
        return [np.array(a, dtype=float) if isinstance(a, np.ndarray) else a for a in self.args]


def plain(data: Any) -> Any:
    """Encoded answer data as Python values: arrays as float64 numpy arrays, lists as lists."""
    if not isinstance(data, dict):
        raise TypeError("malformed answer data")
    t = data.get("t")
    if t == "list":
        return [plain(x) for x in data.get("v", [])]
    if t in ("num", "bool", "array"):
        return compare.to_numeric(data)
    if t == "str":
        return str(data.get("v", ""))
    if t == "none":
        return None
    raise TypeError(f"a value of type {data.get('type', t)}")


@dataclass(frozen=True)
class Question:
    id: str
    title: str
    kind: str                   # "function" | "value" | "choice"
    name: str
    points: int
    ref: Any                    # function, zero-argument function (value) or the letter (choice)
    cases: tuple = ()
    rtol: float = 1e-6
    atol: float = 1e-9
    options: str = "ABCD"
    # Limits of the sandbox for this question (None: the grader's defaults). ``timeout`` is
    # seconds per call of the student's function (or to read a value); ``memory_mb`` raises
    # the address-space limit of the sandbox's processes (one limit per run: the largest).
    timeout: float | None = None
    memory_mb: int | None = None
    # klbook_lib modules the sandbox offers to the whole notebook for this question; by default
    # only the public checker and runtime. Never a module that computes an answer of the
    # exercise: the notebook's cells could call it (AUTHORING.md).
    library: tuple = ()
    # klbook_lib modules that only the outcome-graded cases need (e.g. "klbook_lib.ppo" for a
    # task that trains with the book's PPO): those cases run in a sandbox of their own that
    # offers them, whose answers to every other question are not taken.
    task_library: tuple = ()
    # Folders of public data the outcome-graded cases read (e.g. a cached pipeline), each named
    # by ``"module:function"``: the grader calls the function in its own process and copies the
    # folder it returns, read-only, into the tasks' sandbox (``$KLBOOK_TASK_DATA/<its name>``).
    task_data: tuple = ()
    # Full marks once the cases' credits add up to this many (None: all cases).
    full_marks_at: int | None = None
    # What check() runs for an outcome-graded question in the student's notebook: dicts with
    # the function's "args", the task "module" and its "judge" (called with "kwargs").
    public_checks: tuple = ()
    # A choice question's one-sentence reason why each wrong letter is wrong (hidden/choices.py).
    explain: dict | None = None
    # Questions whose functions this one's outcome-graded cases train with ("your reward and
    # your GAE"): those cases earn nothing unless each of them scores points of its own, graded
    # in the cells' sandbox where the library's answers do not exist (issue 36). The tasks'
    # sandbox offers the training library, so a function there could call the library's
    # version; the probe of the same name in the clean sandbox is what makes it the student's.
    requires: tuple = ()
    # Outcome-graded cases scored group by group (tuples of case indices, e.g. the runs of each
    # KL placement): each group earns its share of the points, with full marks at its share of
    # ``full_marks_at``, so that a bug confined to one group costs that group's points.
    run_groups: tuple = ()
    # Modules that compute this question's answer: the grader never asks the question in a
    # sandbox that offers one of them (it gets a sandbox of its own when the notebook's other
    # questions need them), and the bank's test checks that its own library does not.
    refused: tuple = ()

    def expected(self) -> Any:
        if self.kind == "function":
            return [np.asarray((c.grad or self.ref)(*c.call_args()), dtype=float) if c.judge is None
                    else np.asarray(np.nan) for c in self.cases]
        if self.kind == "value":
            return np.asarray(self.ref(), dtype=float)
        return self.ref

    def judge_case(self, case: Case, expected: Any, got: Any) -> tuple[float, str]:
        """Credit in [0, 1] and a message for one case's answer (the grader calls this)."""
        if case.judge is not None:
            try:
                credit, why = case.judge(plain(got))
            except Exception as exc:  # noqa: BLE001 - a malformed result scores 0, never crashes
                return 0.0, f"the result could not be evaluated: {type(exc).__name__}: {exc}"
            return float(min(1.0, max(0.0, credit))), why
        ok, why = compare.compare_numeric(expected, got, self.rtol, self.atol, reveal=case.public)
        return (1.0 if ok else 0.0), why


def outcome(*args, **kwargs):
    """The ``ref`` of an outcome-graded question: it has no reference value."""
    raise RuntimeError("an outcome-graded question has no reference value")


def pub(*args, why="", torch=False, core=False) -> Case:
    """A public case (shown by ``check()``, with ``why`` it is there)."""
    return Case(tuple(args), public=True, why=why, torch=torch, core=core)


def hid(*args, torch=False, probe="", core=False, grad=None) -> Case:
    """A hidden case; ``probe`` says what it tests (never its answer). A ``core`` case tests what
    the question is about (the mask of a padded batch, the target of a controller): while one
    fails, the question scores 0, so that a function wrong at its core earns nothing from the
    cases where the mistake happens not to show."""
    return Case(tuple(args), public=False, torch=torch, probe=probe, core=core, grad=grad)


def task(*args, judge, probe="") -> Case:
    """An outcome-graded hidden case: ``judge(plain result)`` gives its credit."""
    return Case(tuple(args), public=False, probe=probe, judge=judge)


def task_judge(module: str, name: str, **kwargs) -> Callable:
    """A judge from a task module, imported only when a result is judged (they import torch)."""
    def judge(result):
        import importlib

        return getattr(importlib.import_module(module), name)(result, **kwargs)
    return judge


def simplex(rng: np.random.Generator, k: int, zeros: int = 0) -> np.ndarray:
    """A random point of the probability simplex of size ``k``, ``zeros`` entries set to 0."""
    p = rng.dirichlet(np.ones(k))
    if zeros:
        p[rng.choice(k, zeros, replace=False)] = 0.0
        p /= p.sum()
    return p



REL = dict(rtol=5e-3, atol=0.0)     # hand-computed numbers: an answer rounded to three significant
# figures is within half a unit of its third figure, a relative error of at most 0.5 % (1.00 -> 0.995)
