"""The grader's side: run a submission in a sandbox, compare its answers here.

:func:`grade` never raises on a bad submission and never hangs: whatever the notebook
does, it returns a result with per-question points and messages. Expected answers are
computed here, in the grader's process, from the reference solutions in
:mod:`klbook_grader.hidden`; the student's code runs in a bubblewrap sandbox (see
:mod:`klbook_grader.sandbox`) that only ever sees the test inputs.

Time limits are enforced from outside: the grader follows the runner's events (a cell
started, a call started...) and kills the whole sandbox when one overruns its limit.
Answers arrive as each question is answered, so what was answered before the kill is
kept; the notebook is then run again without the cell or the question that hung.
"""
from __future__ import annotations

import json
import math
import os
import re
import selectors
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from klbook_grader import cgroups, compare, protocol, sandbox, syscalls
from klbook_grader.protocol import clean
from klbook_grader.sandbox import GRADING_DIR, PACKAGE_DIR, REPO_DIR, Limits  # noqa: F401 - re-exported

DEFAULT_TIMEOUT = 60.0      # seconds for the whole notebook (all runs together)
DEFAULT_CELL_TIMEOUT = 20.0
DEFAULT_CALL_TIMEOUT = 5.0
STARTUP_SECONDS = 60.0      # from starting the sandbox to its first event
IDLE_SECONDS = 30.0         # the runner's own work between two events
AFTER_STEP_SECONDS = 5.0    # past a cell's or a question's limit, until the runner's next step
MAX_RUNS = 8                # a notebook that hangs again and again is not run forever
MAX_NOTEBOOK_BYTES = 50 << 20
PARSE_MEMORY_BYTES = 1 << 30    # the notebook's JSON is parsed in a child limited to this
PARSE_SECONDS = 60.0
MAX_CELLS = 5_000               # cells of a notebook, markdown included (the largest master has 29)
MAX_CODE_CHARS = 2_000_000      # characters of all its code cells together (the largest master: about 9,000)
MAX_NOTES = 40              # general notes of one result (then one line: how many more)
MAX_MESSAGES = 40           # messages of one question (then one line: how many more)
MAX_OUTPUT_CHARS = 1_000_000
SANDBOX_NOTE = "the notebook's process reports: "   # the label of every note sent from the sandbox
PIPE_TAIL = 4000            # bytes of the sandbox's stdout/stderr kept for messages


class GraderError(RuntimeError):
    """The grader itself could not run (unknown exercise, missing file, no isolation...)."""


class IsolationUnavailable(GraderError):
    """No OS-level sandbox on this machine (and ``unsafe_no_isolation`` was not given)."""


def isolation(unsafe_no_isolation: bool = False) -> sandbox.Backend:
    """The sandbox notebooks will run in; raises :class:`IsolationUnavailable` if none."""
    if unsafe_no_isolation:
        return sandbox.UNSAFE
    try:
        return sandbox.backend()
    except sandbox.SandboxUnavailable as exc:
        raise IsolationUnavailable(
            f"cannot isolate the notebook's code: {exc}. Student code is only run inside a "
            "sandbox; to grade anyway, without any protection of this machine, its files or "
            "the grade, pass --unsafe-no-isolation") from None


def blocked_roots() -> list[str]:
    """Paths the audit hook of the *unsafe* mode refuses to open (best effort only)."""
    env_dirs = [Path(p).resolve() for p in (sys.prefix, *site.getsitepackages())]
    if any(PACKAGE_DIR.is_relative_to(e) for e in env_dirs):
        return [str(PACKAGE_DIR), str(GRADING_DIR)]
    roots = []
    for entry in REPO_DIR.iterdir():
        entry = entry.resolve()
        if not any(e.is_relative_to(entry) for e in env_dirs):
            roots.append(str(entry))
    return roots


# ---------------------------------------------------------------- reading the submission
_EXERCISE_IN_NAME = re.compile(r"(?<![A-Za-z0-9])(ex\d\d|project\d)(?!\d)", re.IGNORECASE)


def find_exercise(path: Path, nb: Any, exercise: str | None) -> tuple[str, list[str]]:
    """The exercise to grade: ``exercise`` if given, else the ``exNN`` in the file's name
    (or the ``projectN`` of a project; where two exercises share a number, the one whose full name the file's name contains).

    The notebook's own metadata is never trusted (a student can edit it); if it disagrees,
    a note says so.
    """
    from klbook_grader.hidden import bank

    names = bank.exercise_names()
    if exercise is not None:
        if exercise not in names:
            raise GraderError(f"exercise: unknown exercise {clean(exercise, 80)!r}; "
                              f"known: {', '.join(names)}")
        name = exercise
    else:
        prefixes = {m.lower() for m in _EXERCISE_IN_NAME.findall(path.stem)}
        found = [n for n in names if n.split("_")[0] in prefixes]
        if len(found) > 1:      # two exercises share a number (ex14_review, ex14_offpolicy_kl):
            found = [n for n in found if n in path.stem.lower()] or found   # the full name decides
        if len(found) != 1:
            why = "names several exercises" if len(found) > 1 else "does not name an exercise"
            raise GraderError(f"cannot tell which exercise {clean(path.name, 120)!r} is: its name "
                              f"{why}; name the file exNN_... or pass --exercise")
        name = found[0]
    notes = []
    try:
        meta = nb["metadata"]["klbook"]["exercise"]
    except (TypeError, KeyError, IndexError):
        meta = None
    if meta is not None and meta != name:
        notes.append(f"the notebook's metadata names the exercise {clean(meta, 60)!r}; "
                     f"it was graded as {name}")
    return name, notes


def _grace(seconds: float) -> float:
    """How long past its own limit a cell or call may run before the sandbox is killed."""
    return min(10.0, 1.0 + 0.25 * seconds)


# ---------------------------------------------------------------- running the sandbox
class _Session:
    """One notebook's grading: one or more sandbox runs, the answers they streamed back."""

    def __init__(self, backend: sandbox.Backend, cells: list[str], questions: list[dict],
                 notebook_name: str, notebook_text: str, total: float, cell_timeout: float,
                 limits: Limits, library: tuple = (),
                 cgroup_support: cgroups.Support | None = None, data_dirs: tuple = ()) -> None:
        self.backend, self.cells, self.questions = backend, cells, questions
        self.cgroups = cgroup_support or cgroups.Support(version=None, reason="not asked for")
        self.group: cgroups.Cgroup | None = None  # the cgroup of the run in progress
        self.library = tuple(dict.fromkeys(library))
        self.library_files = sandbox.library_files(self.library)
        self.data_dirs = tuple(data_dirs)
        self.qmap = {q["id"]: q for q in questions}
        self.notebook_name, self.notebook_text = notebook_name, notebook_text
        self.total, self.cell_timeout, self.limits = total, cell_timeout, limits
        self.answers: dict[str, dict] = {}        # committed answers, by question id
        self.seconds: dict[str, float] = {}       # time each question's evaluation took
        self.cell_errors: dict[int, str] = {}     # latest state of each cell that failed
        self.skip_cells: dict[int, str] = {}      # cells that hung or crashed: not run again
        self.skip_questions: set[str] = set()
        self.notes: list[str] = []
        self.student_notes: list[str] = []
        self.rejected = 0
        self.runs = 0
        self.stopped_early = False

    # -- one run
    def _plan(self, result_fd: int, staging: Path) -> dict:
        plan = {"cells": self.cells, "questions": self.questions, "cell_timeout": self.cell_timeout,
                "max_output": MAX_OUTPUT_CHARS, "result_fd": result_fd,
                "modules": list(sandbox.PUBLIC_MODULES), "packages": list(self.library),
                "site": sandbox.site_dirs(),
                "limits": sandbox.plan_limits(self.limits, self.total),
                "notebook_name": self.notebook_name, "notebook_text": self.notebook_text,
                "skip_cells": sorted(self.skip_cells), "skip_questions": sorted(self.skip_questions)}
        if self.backend.isolated:
            plan.update(lib=sandbox.INSIDE_LIB, work=sandbox.INSIDE_WORK,
                        uid=sandbox.fresh_uid() if self.backend.mode == "root" else None,
                        keyctl=syscalls.keyctl_number())
        else:
            plan.update(lib=str(staging / "lib"), work=str(staging / "work"), uid=None,
                        guards={"blocked_roots": blocked_roots(), "workdir": str(staging)})
        return plan

    def _start(self, staging: Path, result_fd: int, seccomp_fd: int) -> subprocess.Popen:
        fds = (result_fd,)
        if self.backend.isolated:
            cmd = sandbox.command(self.backend, staging, self.limits, seccomp_fd)
            fds = (result_fd, seccomp_fd)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
            cwd = "/"
        else:
            (staging / "work").mkdir()
            cmd = [sys.executable, "-I", "-S", str(staging / "runner.py")]
            env = {**sandbox.sandbox_env(), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                   "HOME": str(staging / "work"), "TMPDIR": str(staging / "work"),
                   "MPLCONFIGDIR": str(staging / "work"), "KLBOOK_TASK_DATA": str(staging / "data")}
            cwd = str(staging / "work")
        if self.group is not None:          # the sandbox starts inside its own cgroup
            cmd = self.group.wrap(cmd)
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=fds, cwd=cwd, env=env,
                                start_new_session=True)

    def run_once(self, deadline: float) -> tuple[str, tuple | None, str]:
        """One sandbox run until it ends or is killed.

        Returns ``(outcome, activity, detail)``: outcome ``done``, ``died``, ``killed``
        (an activity overran its limit), ``total`` (the total limit), ``silent`` (no
        event for too long) or ``overflow``; ``activity`` is what was running then.
        """
        self.runs += 1
        staging = Path(tempfile.mkdtemp(prefix="klbook-grade-"))
        proc = None
        read_fd = write_fd = seccomp_fd = -1
        try:
            sandbox.make_staging(staging, self.library_files, self.data_dirs)
            read_fd, write_fd = os.pipe()
            if self.backend.isolated:
                seccomp_fd = syscalls.program_fd()
            if self.cgroups.available:
                try:
                    self.group = cgroups.Cgroup(self.cgroups, self.limits.total_memory_bytes,
                                                self.limits.processes)
                except OSError as exc:
                    raise GraderError(f"cannot create the sandbox's cgroup: {exc}") from None
            plan = json.dumps(self._plan(write_fd, staging)).encode()
            proc = self._start(staging, write_fd, seccomp_fd)
            for fd in (write_fd, seccomp_fd):
                if fd >= 0:
                    os.close(fd)
            write_fd = seccomp_fd = -1
            feeder = threading.Thread(target=_feed, args=(proc.stdin, plan), daemon=True)
            feeder.start()
            outcome = self._follow(proc, read_fd, deadline)
            feeder.join(timeout=5)
            return outcome
        finally:
            if proc is not None:
                _kill(proc, stragglers=not self.backend.isolated)
            if self.group is not None:
                self.group.remove()
                self.group = None
            for fd in (read_fd, write_fd, seccomp_fd):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            sandbox.remove_tree(staging)

    def _follow(self, proc: subprocess.Popen, read_fd: int, deadline: float) -> tuple:
        reader = protocol.Reader(len(self.cells), self.questions)
        sel = selectors.DefaultSelector()
        tails: dict[int, bytearray] = {}
        for f in (read_fd, proc.stdout.fileno(), proc.stderr.fileno()):
            os.set_blocking(f, False)
            sel.register(f, selectors.EVENT_READ)
            tails[f] = bytearray()
        now = time.monotonic()
        state = {"activity": ("startup",), "until": now + STARTUP_SECONDS, "partial": None,
                 "done": False, "events": 0,
                 # timers the notebook cannot reset: each cell index and each (question,
                 # evaluation, case) gets one clock, started at its first message of this run
                 "timers": {}, "last_cell": -1, "asked": {}}
        result_open, exited_at = True, None
        outcome = None
        try:
            while outcome is None:
                now = time.monotonic()
                if now >= deadline:
                    outcome = ("total", state["activity"], "")
                    break
                if now >= state["until"]:
                    kind = state["activity"][0]
                    outcome = ("killed" if kind in ("cell", "call") else "silent",
                               state["activity"], "")
                    break
                if not result_open:
                    # nobody can write any more: the runner has ended or is about to
                    try:
                        proc.wait(timeout=max(0.0, min(deadline - now, 5.0)))
                    except subprocess.TimeoutExpired:   # it closed the pipe and went on
                        kind = state["activity"][0]
                        outcome = ("killed" if kind in ("cell", "call") else "silent",
                                   state["activity"], "it closed the grader's pipe and went on")
                    break
                if proc.poll() is not None:
                    exited_at = exited_at or now
                    # everything the process wrote is in the pipe; leftovers of the unsafe
                    # mode may hold it open, so do not wait for them
                    if not result_open or now - exited_at > 1.0:
                        break
                if reader.overflow:
                    outcome = ("overflow", state["activity"], "")
                    break
                wait = max(0.0, min(deadline, state["until"]) - now)
                for key, _ in sel.select(timeout=min(wait, 0.25)):
                    fd = key.fd
                    try:
                        data = os.read(fd, 1 << 20)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(fd)
                        if fd == read_fd:
                            result_open = False
                        continue
                    if fd == read_fd:
                        for ev in reader.feed(data):
                            self._event(ev, state)
                    else:
                        tails[fd] += data
                        del tails[fd][:-PIPE_TAIL]
        finally:
            sel.close()
        self.rejected += reader.rejected
        if outcome is not None:
            _kill(proc)
            self._abandon(state, outcome)
            return outcome
        status = proc.wait()
        if state["done"] and status == 0:
            return ("done", None, "")
        err = bytes(tails[proc.stderr.fileno()]).decode("utf-8", "replace").strip().splitlines()
        if state["events"] == 0 and not state["done"]:
            # nothing ran: the sandbox itself failed, which is the machine's problem, not the student's
            raise GraderError("the sandbox did not start (exit status "
                              f"{status}): {clean(err[-1] if err else 'no message', 300)}")
        detail = f"exit status {_status(status)}"
        if self.group is not None and self.group.out_of_memory():
            detail += (f"; the sandbox went over its memory limit of "
                       f"{self.limits.total_memory_bytes / (1 << 30):g} GiB")
        outcome = ("died", state["activity"], detail)
        self._abandon(state, outcome)
        return outcome

    def _legal(self, ev: dict, state: dict) -> bool:
        """Is ``ev`` a step the runner can take from where it is? Student code, which can
        write into the pipe while its cell or call runs, cannot forge the runner's steps."""
        kind, act = ev["ev"], state["activity"]
        if kind == "note":
            return True
        if act[0] in ("startup", "idle"):
            if kind == "cell" and ev["t"] == "start":
                # cells run in order, once each: a cell index never starts twice in a run
                return ev["i"] > state.get("last_cell", -1)
            if kind == "q" and ev["t"] == "start":
                # the runner asks a question once after a cell (a value is read once more at
                # the very end): a question cannot be started again to reset its clocks
                asked = state.get("asked", {}).get((ev["q"], state.get("last_cell", -1)), 0)
                q = self.qmap.get(ev["q"])
                return q is not None and asked < (1 if q["kind"] == "function" else 2)
            return kind == "done"
        if act[0] == "cell":
            return kind == "cell" and ev["t"] == "end" and ev["i"] == act[1]
        if act[0] == "q":
            p = state.get("partial")
            if kind == "call":             # call ids strictly increasing within an evaluation
                return ev.get("q") == act[1] and (p is None or ev["j"] > p.get("last_j", -1))
            return ev.get("q") == act[1] and (kind == "missing" or (
                kind == "q" and ev["t"] == "end"))
        if act[0] == "call":
            return ev.get("q") == act[1] and (
                (kind == "case" and ev["j"] == act[2]) or kind == "value")
        return False

    def _event(self, ev: dict, state: dict) -> None:
        if not self._legal(ev, state):
            self.rejected += 1
            return
        now = time.monotonic()
        state["events"] += 1
        kind = ev["ev"]
        timers = state.setdefault("timers", {})
        if kind == "cell":
            if ev["t"] == "start":
                state["last_cell"] = ev["i"]
                t0 = timers.setdefault(("cell", ev["i"]), now)
                state["activity"] = ("cell", ev["i"])
                state["until"] = t0 + self.cell_timeout + _grace(self.cell_timeout)
            else:
                if ev["ok"]:
                    self.cell_errors.pop(ev["i"], None)
                else:
                    self.cell_errors[ev["i"]] = clean(ev.get("error", "failed"))
                state["activity"] = ("idle",)
                # the runner's next step follows at once: an "end" the cell forged itself
                # while it went on running buys it no more than a few seconds past its limit
                cell_until = timers[("cell", ev["i"])] + self.cell_timeout + _grace(self.cell_timeout)
                state["until"] = min(now + IDLE_SECONDS, max(cell_until, now + AFTER_STEP_SECONDS))
        elif kind == "q":
            q = self.qmap[ev["q"]]
            if ev["t"] == "start":
                key = (q["id"], state.get("last_cell", -1))
                asked = state.setdefault("asked", {})
                asked[key] = asked.get(key, 0) + 1
                seconds = float(q["timeout"])
                state["partial"] = {"q": q["id"], "cases": {}, "value": None, "missing": None,
                                    "t0": now, "last_j": -1, "spent": 0.0, "call_t0": None,
                                    "evaluation": key + (asked[key],),
                                    # the whole evaluation: every call at its limit, at most
                                    "budget_until": now + AFTER_STEP_SECONDS + max(1, len(q["cases"])) * (
                                        seconds + _grace(seconds))}
                state["activity"] = ("q", q["id"])
            elif state["partial"] is not None and state["partial"]["q"] == q["id"]:
                budget = state["partial"]["budget_until"]
                self._commit(state["partial"], now)
                state["partial"] = None
                state["activity"] = ("idle",)
                state["until"] = min(now + IDLE_SECONDS, max(budget, now + AFTER_STEP_SECONDS))
                return
            state["until"] = now + IDLE_SECONDS
        elif kind == "call":
            p = state["partial"]
            if p is not None and p["q"] == ev["q"]:
                seconds = float(self.qmap[ev["q"]]["timeout"])
                t0 = timers.setdefault(("call",) + p["evaluation"] + (ev["j"],), now)
                p["last_j"], p["call_t0"] = ev["j"], t0
                state["activity"] = ("call", ev["q"], ev["j"])
                state["until"] = min(t0 + seconds + _grace(seconds), p["budget_until"])
        elif kind in ("case", "value", "missing"):
            p = state["partial"]
            if p is not None and p["q"] == ev["q"]:
                if p.get("call_t0") is not None:     # the question's time: its calls summed
                    p["spent"] += now - p["call_t0"]
                    p["call_t0"] = None
                if kind == "case":
                    p["cases"][ev["j"]] = ev["r"]
                elif kind == "value":
                    p["value"] = ev["r"]
                else:
                    p["missing"] = clean(ev["why"])
                state["activity"] = ("q", ev["q"])
                state["until"] = min(now + IDLE_SECONDS, max(p["budget_until"], now + AFTER_STEP_SECONDS))
        elif kind == "note":
            text = clean(ev["text"])
            if text and text not in self.student_notes and len(self.student_notes) < 20:
                self.student_notes.append(text)
        elif kind == "done":
            state["done"] = True
            state["activity"] = ("idle",)
            state["until"] = now + IDLE_SECONDS

    def _commit(self, p: dict, now: float, stop: str | None = None, at: int | None = None,
                rest: str = "") -> None:
        """Make a question's (possibly interrupted) evaluation its answer: ``stop`` is the
        message of the call ``at`` that was interrupted, ``rest`` that of the calls after it."""
        q = self.qmap[p["q"]]
        if p["missing"] is not None:
            answer = {"missing": p["missing"]}
        elif q["kind"] == "function":
            cases = []
            for j in range(len(q["cases"])):
                if j in p["cases"]:
                    cases.append(p["cases"][j])
                elif stop is not None and j == at:
                    cases.append({"error": stop})
                elif stop is not None:
                    cases.append({"error": rest or stop})
                else:
                    cases.append({"error": "no result was reported"})
            answer = {"cases": cases}
        elif p["value"] is not None:
            answer = p["value"]
        else:
            answer = {"error": stop or "no answer was reported"}
        self.answers[q["id"]] = answer
        spent = p.get("spent", now - p["t0"])
        if p.get("call_t0") is not None:         # the call that was interrupted
            spent += now - p["call_t0"]
        self.seconds[q["id"]] = round(spent, 3)

    def _abandon(self, state: dict, outcome: tuple) -> None:
        """After a kill or a crash: record what was interrupted, decide what to skip."""
        what, activity, detail = outcome
        kind = activity[0] if activity else "idle"
        p = state["partial"]
        if kind in ("call", "q") and p is not None:
            q = self.qmap[p["q"]]
            seconds = float(q["timeout"])
            if what == "killed":
                stop = (f"stopped from outside ({detail})" if detail else
                        f"did not return within {seconds:g} s (stopped from outside)")
                rest = "skipped after an earlier call timed out"
            elif what == "died":
                stop = (f"the notebook's process ended during this call ({detail}: os._exit, "
                        "a crash or running out of memory?)")
                rest = "skipped after an earlier call ended the notebook's process"
            elif what == "total":
                stop = rest = "not run: the notebook ran out of time"
            else:
                stop = rest = f"the notebook's process stopped responding ({what})"
            self._commit(p, time.monotonic(), stop=stop, rest=rest,
                         at=activity[2] if kind == "call" else None)
            if what in ("killed", "died", "silent"):
                self.skip_questions.add(q["id"])
        elif kind == "cell" and what in ("killed", "died"):
            i = activity[1]
            if what == "killed":
                why = (f"stopped from outside ({detail})" if detail else
                       f"stopped from outside after {self.cell_timeout + _grace(self.cell_timeout):g} s "
                       "(it did not respond to the time limit)")
            else:
                why = (f"the notebook's process ended while it ran ({detail}: os._exit, a crash, "
                       "a signal or running out of memory?)")
            self.skip_cells[i] = why
            self.cell_errors[i] = why + "; the notebook was run again without it"

    # -- the whole grading
    def run(self, deadline: float | None = None) -> None:
        """Run the notebook (again, after a kill) until done, or until ``deadline`` (by
        default the session's total time from now)."""
        deadline = deadline if deadline is not None else time.monotonic() + self.total
        while True:
            if time.monotonic() >= deadline:
                outcome = ("total", None, "")
            else:
                outcome = self.run_once(deadline)
            what, activity, _ = outcome
            if what == "done":
                return
            self.stopped_early = True
            if what == "total":
                self.notes.append(f"the notebook did not finish within the total time limit of "
                                  f"{self.total:g} s; the answers it had given by then were graded")
                return
            if what == "overflow":
                self.notes.append("the notebook's process sent more data than allowed; it was stopped")
                return
            restartable = activity is not None and activity[0] in ("cell", "call", "q") and (
                what in ("killed", "died") or (what == "silent" and activity[0] == "q"))
            if not restartable:
                self.notes.append(f"the notebook's process {_describe(outcome)}; the answers it "
                                  "had given by then were graded")
                return
            if self.runs >= MAX_RUNS:
                self.notes.append(f"the notebook was stopped {self.runs} times (cells or calls that "
                                  "hang or crash); the answers given by then were graded")
                return


def _describe(outcome: tuple) -> str:
    what, activity, detail = outcome
    if what == "died":
        return f"ended unexpectedly ({detail})"
    if what == "silent":
        return "stopped responding and was killed"
    return what


def _status(status: int) -> str:
    if status < 0:
        try:
            return f"{-status} ({signal.Signals(-status).name})"
        except ValueError:
            return str(-status)
    if status > 128:
        try:
            return f"{status} ({signal.Signals(status - 128).name}?)"
        except ValueError:
            pass
    return str(status)


def _feed(stream, data: bytes) -> None:
    try:
        stream.write(data)
    except (OSError, ValueError):
        pass
    finally:
        try:
            stream.close()
        except (OSError, ValueError):
            pass


def _kill(proc: subprocess.Popen, stragglers: bool = False) -> None:
    """End the sandbox: its bwrap process (whose death ends every process in the sandbox's
    PID namespace) and its process group; with ``stragglers`` (the unsafe mode, where there
    is no PID namespace) also what is left of the group after the process has ended."""
    if proc.returncode is None:
        for how in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
            try:
                how()
            except OSError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    elif stragglers:
        try:      # a group id stays reserved while the group has members: no reuse risk
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    for f in (proc.stdin, proc.stdout, proc.stderr):
        try:
            if f is not None:
                f.close()
        except OSError:
            pass


# ---------------------------------------------------------------- scoring
def _fmt(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _score_question(q, expected, answer, unanswered: str) -> dict:
    """Points and messages for one question, comparing here, in the grader's process."""
    out = {"id": q.id, "title": q.title, "kind": q.kind, "max_points": q.points, "points": 0.0,
           "messages": []}
    if not isinstance(answer, dict):
        out["messages"].append(unanswered)
        return out
    if "missing" in answer:
        out["messages"].append(clean(answer["missing"]))
        return out
    if q.kind == "function":
        results = answer.get("cases")
        if not isinstance(results, list) or len(results) != len(expected):
            out["messages"].append("the answers for the test cases are incomplete")
            return out
        passed = 0
        credits: dict[int, float] = {}
        core_failed: list[int] = []
        same = _identical_runs(q, results)
        for i, (case, exp, res) in enumerate(zip(q.cases, expected, results)):
            label = f"{'public' if case.public else 'hidden'} case {i + 1}"
            core = bool(getattr(case, "core", False))
            if case.public and case.why:
                label += f" ({case.why}{', a core case' if core else ''})"
            elif getattr(case, "probe", ""):       # what a hidden case tests, not its answer
                label += f" (probes: {case.probe}{', a core case' if core else ''})"
            elif core:
                label += " (a core case)"
            if "value" not in res:
                out["messages"].append(f"{label}: {clean(res.get('error', 'no result'))}")
                if core:
                    core_failed.append(i + 1)
                continue
            judge = getattr(q, "judge_case", None)  # outcome-graded cases (hidden/bank.py)
            if i in same:
                credit, why = 0.0, (f"this run returned exactly what the run of case {same[i] + 1} "
                                    "returned on another seed: a run that samples differs from seed "
                                    "to seed (a written-down or exactly computed table earns nothing)")
            elif judge is not None:
                credit, why = judge(case, exp, res["value"])
            else:
                ok, why = compare.compare_numeric(exp, res["value"], q.rtol, q.atol, reveal=case.public)
                credit = 1.0 if ok else 0.0
            passed += credit
            credits[i] = credit
            if core and credit < 1:
                core_failed.append(i + 1)
            if credit < 1 or getattr(case, "judge", None) is not None:
                out["messages"].append(f"{label}: {clean(why, 500)}")
        full = getattr(q, "full_marks_at", None) or len(expected)   # e.g. 3 of 4 training seeds
        out["points"] = 0.0 if core_failed else q.points * min(1.0, passed / full)
        groups = getattr(q, "run_groups", ()) or ()
        if groups and not core_failed:      # each group (a placement's runs) earns its own share
            n = sum(len(g) for g in groups)
            share = [(len(g) / n, sum(credits.get(k, 0.0) for k in g), full * len(g) / n) for g in groups]
            out["points"] = q.points * sum(w * min(1.0, got / need) for w, got, need in share)
        head = (f"{_fmt(passed)}/{len(expected)} test cases passed"
                + (f" (full marks at {full})" if full < len(expected) else ""))
        if core_failed:
            which = ", ".join(str(k) for k in core_failed)
            head += (f"; no points: core case{'s' if len(core_failed) > 1 else ''} {which} failed (the"
                     " question's points count only once its core cases pass)")
        out["messages"].insert(0, head)
        return out
    if "value" not in answer:
        out["messages"].append(clean(answer.get("error", "no answer was reported")))
        return out
    if q.kind == "value":
        ok, why = compare.compare_numeric(expected, answer["value"], q.rtol, q.atol, reveal=False)
    else:
        ok, why = compare.compare_choice(expected, answer["value"], q.options, getattr(q, "explain", None))
    out["points"] = float(q.points) if ok else 0.0
    out["messages"].append("correct" if ok else clean(why, 500))
    return out


def _require(questions, scored: list[dict]) -> None:
    """A question that trains with the student's own functions (``Question.requires``) earns
    nothing while one of those functions scores nothing on its own question (issue 36)."""
    by_id = {s["id"]: s for s in scored}
    for q, s in zip(questions, scored):
        failed = [r for r in getattr(q, "requires", ()) if r in by_id and by_id[r]["points"] <= 0]
        if failed and s["points"] > 0:
            names = ", ".join(f"{r} (`{next(x.name for x in questions if x.id == r)}`)" for r in failed)
            s["points"] = 0.0
            s["messages"].insert(0, f"no points: this run trains with your answer to {names}, "
                                    "which scored nothing on its own cases (where the library's "
                                    "version cannot be imported); the training counts only once "
                                    "the function it uses is yours")


def _identical_runs(q, results: list) -> dict[int, int]:
    """Outcome-graded cases whose result equals that of another such case with other arguments
    (another seed): a run that samples never returns the same thing twice (issue 36: the exact
    optimum and exact gradient ascent gave one table for every seed). Maps a case to the other."""
    seen: dict[str, int] = {}
    out: dict[int, int] = {}
    for i, (case, res) in enumerate(zip(q.cases, results)):
        if getattr(case, "judge", None) is None or not isinstance(res, dict) or "value" not in res:
            continue
        key = json.dumps(res["value"], sort_keys=True)
        if key in seen and q.cases[seen[key]].args != case.args:
            out[i] = seen[key]
            out.setdefault(seen[key], i)
        seen.setdefault(key, i)
    return out


def _positive(name: str, value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise GraderError(f"{name}: time limits must be numbers, got {value!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise GraderError(f"{name}: time limits must be positive and finite, got {value!r}")
    return value


# The child that parses a submitted notebook: its memory is limited before it reads a byte, so
# that a notebook built to blow up the JSON parser (millions of empty cells) costs the child,
# never the grader. It writes the code cells' sources and the metadata's exercise as JSON.
_PARSER = r"""
import json, re, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (@BYTES@, @BYTES@))
resource.setrlimit(resource.RLIMIT_CPU, (60, 60))
try:
    nb = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("the notebook has no list of cells")
    if len(nb["cells"]) > @MAX_CELLS@:
        raise ValueError(f"it has {len(nb['cells']):,} cells, more than @MAX_CELLS_TEXT@")
    cells, where, question, size = [], [], "", 0
    for k, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict):
            continue
        src = cell.get("source", "")
        if isinstance(src, list):
            src = "".join(s for s in src if isinstance(s, str))
        if cell.get("cell_type") == "markdown" and isinstance(src, str):
            # "## Question 3: ..." or, in the Chinese edition's notebooks, "## 第 3 题：..."
            head = re.match(r"\s*#+\s*(?:Question\s+(\d+)\b|第\s*(\d+)\s*题)", src)
            question = f"Question {head.group(1) or head.group(2)}" if head else question
            continue
        if cell.get("cell_type") != "code":
            continue
        if not isinstance(src, str):
            raise ValueError("a code cell's source is not text")
        size += len(src)
        if size > @MAX_CODE@:
            raise ValueError("its code cells hold more than @MAX_CODE_TEXT@ characters")
        cells.append(src)
        where.append([k + 1, question])
    nb["cells"] = None
    try:
        meta = nb["metadata"]["klbook"]["exercise"]
    except (TypeError, KeyError, IndexError):
        meta = None
    out = {"cells": cells, "where": where,
           "meta": meta if isinstance(meta, str) else (None if meta is None else repr(meta)[:100])}
except MemoryError:
    out = {"error": "it needs more than @TEXT@ of memory to parse"}
except (ValueError, UnicodeDecodeError, RecursionError) as exc:
    out = {"error": str(exc)[:300]}
sys.stdout.write(json.dumps(out))
"""


def read_notebook(raw: bytes, where: list | None = None) -> tuple[list[str], Any]:
    """The code cells of a notebook's bytes and its metadata's exercise (``None`` if it has
    none), parsed in a child process limited to :data:`PARSE_MEMORY_BYTES` of memory.
    Raises ValueError with the reason when the notebook cannot be read. ``where``, if given, is
    filled with the name of each code cell as the student sees it (:func:`cell_name`)."""
    code = (_PARSER.replace("@TEXT@", f"{PARSE_MEMORY_BYTES >> 20} MB")
            .replace("@BYTES@", str(PARSE_MEMORY_BYTES))
            .replace("@MAX_CELLS_TEXT@", f"{MAX_CELLS:,}").replace("@MAX_CELLS@", str(MAX_CELLS))
            .replace("@MAX_CODE_TEXT@", f"{MAX_CODE_CHARS:,}").replace("@MAX_CODE@", str(MAX_CODE_CHARS)))
    try:
        res = subprocess.run([sys.executable, "-I", "-S", "-c", code], input=raw,
                             capture_output=True, timeout=PARSE_SECONDS)
    except subprocess.TimeoutExpired:
        raise ValueError(f"parsing it took more than {PARSE_SECONDS:g} s") from None
    try:
        out = json.loads(res.stdout.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        out = {"error": f"the parser ended with status {res.returncode} (too large or too deeply "
                        "nested to parse?)"}
    if not isinstance(out, dict) or "error" in out or not isinstance(out.get("cells"), list):
        raise ValueError(str(out.get("error", "malformed") if isinstance(out, dict) else "malformed"))
    cells = [str(c) for c in out["cells"]]
    if where is not None:
        got = out.get("where")
        ok = isinstance(got, list) and len(got) == len(cells)
        where.extend(cell_name(i, got[i] if ok else None) for i in range(len(cells)))
    return cells, out.get("meta")


def cell_name(code_index: int, where: Any = None) -> str:
    """How the feedback names the code cell ``code_index`` (0-based among the code cells): its
    position among all the notebook's cells, markdown included, as the student counts them in
    Jupyter, and the question whose heading it follows (``where = [position, "Question 3"]``)."""
    try:
        pos, question = int(where[0]), str(where[1])[:40]
    except (TypeError, ValueError, IndexError):
        return f"cell {code_index + 1}"
    return f"cell {pos}" + (f" ({question})" if question else "")


def cap(lines: list[str], limit: int, what: str = "notes") -> list[str]:
    """At most ``limit`` lines: the first ``limit - 1`` and one saying how many were left out."""
    if len(lines) <= limit:
        return list(lines)
    return list(lines[:limit - 1]) + [f"... and {len(lines) - limit + 1} more {what} (not shown)"]


def task_data(questions) -> tuple:
    """The folders the questions' ``task_data`` functions return (called here, in the grader's
    process: e.g. the cached pipeline a training task starts from, built here if need be)."""
    import importlib

    out: list = []
    for q in questions:
        for spec in getattr(q, "task_data", ()):
            module, _, name = spec.partition(":")
            folder = str(getattr(importlib.import_module(module), name)())
            if folder not in out:
                out.append(folder)
    return tuple(out)


def _plan_question(q, call_timeout: float, cases: list[int]) -> dict:
    return {"id": q.id, "kind": q.kind, "name": q.name,
            "timeout": float(q.timeout or call_timeout),
            "cases": [dict({"args": q.cases[j].encoded_args()},
                           **({"grad": True} if getattr(q.cases[j], "grad", None) else {}))
                      for j in cases]}


def _split(questions) -> tuple[list[tuple], list[tuple]]:
    """The questions of the notebook's sandbox and of the training tasks' sandbox, each as
    ``(question, indices of its cases asked there)``: outcome-graded cases (those with a
    judge) run in a sandbox of their own that offers ``task_library``; every other case and
    question runs in one that offers only ``library``."""
    plain, tasks = [], []
    for q in questions:
        if q.kind != "function":
            plain.append((q, []))
            continue
        judged = [j for j, c in enumerate(q.cases) if c.judge is not None]
        rest = [j for j in range(len(q.cases)) if j not in judged]
        if rest or not judged:
            plain.append((q, rest))
        if judged:
            tasks.append((q, judged))
    return plain, tasks


def _sessions(questions, cell_library: list) -> list[tuple[list[tuple], bool, tuple]]:
    """The sandboxes of one grading, each as ``(part, is_task, library)``: first the cells'
    sandbox (the modules every question declares and what importing them imports, never what
    they import inside functions), then one per question whose ``refused`` modules that
    sandbox offers (with only the question's own modules), then the tasks' sandbox (also the
    modules the outcome-graded cases declare). No sandbox ever offers a question's refused
    module (issue 36)."""
    plain, tasks = _split(questions)
    union = sandbox.library_closure(cell_library)
    main, alone = [], []
    for q, idx in plain:
        if set(getattr(q, "refused", ())) & set(union):
            own = sandbox.library_closure(q.library)
            alone.append(([(q, idx)], False, own))
        else:
            main.append((q, idx))
    out = [(main, False, union)] + alone
    if tasks:
        out.append((tasks, True, sandbox.library_closure(
            cell_library + [m for q, _ in tasks for m in q.task_library])))
    for part, _, library in out:
        for q, _ in part:
            bad = set(getattr(q, "refused", ())) & set(library)
            if bad:
                raise GraderError(f"the question bank offers {q.id} a module that answers it: "
                                  f"{', '.join(sorted(bad))}")
    return out


def offered_modules_table() -> str:
    """grading.md's table of the ``klbook_lib`` modules each question's sandbox offers, made
    from the bank (``tests/test_exercise_traps.py`` checks that the page holds it as it is)."""
    from klbook_grader.hidden import bank

    lines = ["| exercise | questions | sandbox | modules it offers |", "|---|---|---|---|"]
    for ex in bank.exercise_names():
        qs = bank.questions(ex)
        groups = _sessions(qs, [m for q in qs for m in q.library])
        if not any(lib for _, _, lib in groups) and len(groups) == 1:
            continue
        for k, (part, task, library) in enumerate(groups):
            if not part:
                continue
            kind = "training runs" if task else ("cells" if k == 0 else "its own")
            mods = ", ".join(f"`{m}`" for m in library) or "none"
            lines.append(f"| `{ex}` | {', '.join(q.id for q, _ in part)} | {kind} | {mods} |")
    return "\n".join(lines)


def _merge(q, parts: list[tuple[list[int], dict | None]]) -> dict | None:
    """One question's answer from the sessions that asked parts of it."""
    answered = [(idx, a) for idx, a in parts if isinstance(a, dict)]
    if not answered:
        return None
    if q.kind != "function":
        return answered[0][1]
    if all("missing" in a for _, a in answered):
        return answered[0][1]
    cases: list = [{"error": "no result was reported"}] * len(q.cases)
    for idx, a in parts:
        if not isinstance(a, dict):
            continue
        got = a.get("cases") if isinstance(a.get("cases"), list) else None
        for k, j in enumerate(idx):
            if got is not None and k < len(got):
                cases[j] = got[k]
            elif "missing" in a:
                cases[j] = {"error": clean(a["missing"])}
    return {"cases": cases}


def grade(notebook: str | os.PathLike, exercise: str | None = None, timeout: float | None = None,
          cell_timeout: float = DEFAULT_CELL_TIMEOUT, call_timeout: float = DEFAULT_CALL_TIMEOUT,
          *, unsafe_no_isolation: bool = False, limits: Limits | None = None) -> dict:
    """Grade one submitted notebook. Raises :class:`GraderError` only if grading is impossible.

    ``timeout`` is the total for the notebook (all its cells and calls); by default 60 s
    plus the calls of questions that declare their own ``timeout`` (long training runs).
    ``limits`` overrides the sandbox's resource limits (:class:`sandbox.Limits`).
    Without OS isolation :class:`IsolationUnavailable` is raised, unless
    ``unsafe_no_isolation`` is set. The notebook runs in one sandbox; the outcome-graded
    cases of its training tasks, if any, run in a second one (see :func:`_split`).
    """
    from klbook_grader.hidden import bank

    path = Path(notebook)
    if not path.is_file():
        raise GraderError(f"notebook: no such file {clean(str(path), 200)}")
    cell_timeout = _positive("cell_timeout", cell_timeout)
    call_timeout = _positive("call_timeout", call_timeout)
    if timeout is not None:
        timeout = _positive("timeout", timeout)
    backend = isolation(unsafe_no_isolation)
    groups = cgroups.support()
    start = time.monotonic()
    notes: list[str] = []
    nb: Any = None
    cells: list[str] | None = None
    names: list[str] = []
    raw = b""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_NOTEBOOK_BYTES + 1)
        if len(raw) > MAX_NOTEBOOK_BYTES:
            raise ValueError(f"larger than {MAX_NOTEBOOK_BYTES >> 20} MB")
        cells, meta = read_notebook(raw, names)
        nb = {"metadata": {"klbook": {"exercise": meta}}}
    except (ValueError, OSError) as exc:
        notes.append(f"the notebook could not be read ({clean(str(exc), 200)}); nothing was run")
    name, meta_notes = find_exercise(path, nb, exercise)
    notes += meta_notes
    questions = bank.questions(name)
    expected = [q.expected() for q in questions]          # here, never in the sandbox
    if timeout is None:
        timeout = DEFAULT_TIMEOUT + sum(q.timeout * len(q.cases or (0,)) for q in questions
                                        if q.timeout is not None)
    memory = max([q.memory_mb << 20 for q in questions if q.memory_mb] + [0])
    base = limits or Limits()
    limits = base.merged(memory_bytes=max(memory, base.memory_bytes),
                         total_memory_bytes=max(memory, base.total_memory_bytes))
    sessions: list[tuple[_Session, list[tuple]]] = []
    kinds: list[str] = []          # "cells", "alone" (a question refusing a module), "task"
    if cells is not None:
        if not any(c.strip() for c in cells):
            notes.append("the notebook has no code")
        nb_name = re.sub(r"[^A-Za-z0-9._-]", "_", path.name)[:100] or "submission.ipynb"
        text = raw.decode("utf-8")
        deadline = start + timeout
        cell_library = [m for q in questions for m in q.library]
        groups_of = _sessions(questions, cell_library)
        for part, task, library in groups_of:
            if not part:
                continue
            data: tuple = ()
            if task:
                try:
                    data = task_data([q for q, _ in part])
                except Exception as exc:  # noqa: BLE001 - the runs then build what they need themselves
                    notes.append(f"the training tasks' data could not be prepared ({clean(str(exc), 200)}); "
                                 "the runs build it themselves")
            session = _Session(backend, cells, [_plan_question(q, call_timeout, idx) for q, idx in part],
                               nb_name, text, timeout, cell_timeout, limits, tuple(library), groups,
                               data_dirs=data)
            session.run(deadline)
            sessions.append((session, part))
            kinds.append("task" if task else ("alone" if part is not groups_of[0][0] else "cells"))
        cell_errors: dict[int, str] = {}
        for k, (session, _) in enumerate(sessions):
            if kinds[k] == "alone":    # cells importing what that sandbox lacks fail there, by design
                continue
            for i, why in session.cell_errors.items():
                cell_errors.setdefault(i, why + (" (in the sandbox of the training tasks)"
                                                 if kinds[k] == "task" else ""))
        for i in sorted(cell_errors):
            where = names[i] if i < len(names) else cell_name(i)
            notes.append(f"{where} failed: {cell_errors[i]}")
        for k, (session, part) in enumerate(sessions):
            # what the sandbox sends is the notebook's word, whoever wrote it (the runner or a
            # cell writing into its pipe): labelled, never shown as the grader's own (issue 36)
            own = session.notes + [SANDBOX_NOTE + n for n in session.student_notes]
            if kinds[k] == "alone":     # only the refusals of what answers that question
                refused = [m for q, _ in part for m in q.refused]
                own = session.notes + [
                    f"{SANDBOX_NOTE}{n} (question {part[0][0].id} is graded in a sandbox without it)"
                    for n in session.student_notes
                    if "refused while grading" in n and any(f"import of {m} " in n for m in refused)]
            notes.extend(n for n in own if n not in notes)
            if session.rejected:
                notes.append(f"the notebook's process sent {session.rejected} malformed message(s); "
                             "they were ignored")
    stopped = any(s.stopped_early for s, _ in sessions)
    unanswered = ("not graded: the notebook was stopped before this answer was read"
                  if stopped else "no answer was reported")
    answers, seconds = {}, {}
    for q in questions:
        parts = [(idx, s.answers.get(q.id)) for s, part in sessions for qq, idx in part if qq is q]
        answers[q.id] = _merge(q, parts)
        took = [s.seconds[q.id] for s, part in sessions if q.id in s.seconds]
        if took:
            seconds[q.id] = round(sum(took), 3)
    scored = [_score_question(q, e, answers.get(q.id), unanswered) for q, e in zip(questions, expected)]
    _require(questions, scored)
    for s in scored:
        s["messages"] = cap(s["messages"], MAX_MESSAGES, "messages")
        if s["id"] in seconds:
            s["seconds"] = seconds[s["id"]]
    total = sum(s["points"] for s in scored)
    return {"notebook": str(path), "exercise": name, "score": round(total, 4),
            "max_score": float(sum(q.points for q in questions)), "questions": scored,
            "notes": cap([clean(n, 400) for n in notes], MAX_NOTES),
            "isolation": f"{backend.describe()}; {groups.describe()}",
            # runs of the notebook's sandbox (more than 1 after a cell or call that hung); the
            # sandbox of the training tasks, if any, apart
            "runs": sum(s.runs for k, (s, _) in enumerate(sessions) if kinds[k] == "cells"),
            "task_runs": sum(s.runs for k, (s, _) in enumerate(sessions) if kinds[k] == "task"),
            # the sandboxes of questions graded apart, without a module that answers them
            "question_runs": sum(s.runs for k, (s, _) in enumerate(sessions) if kinds[k] == "alone"),
            "seconds": round(time.monotonic() - start, 2)}


def format_report(result: dict) -> str:
    """The text the CLI prints: one line per item, ``Score: X/Y`` last; nothing unclean."""
    lines = [f"Exercise: {clean(result['exercise'], 80)}"]
    if result.get("isolation", "").startswith("none"):
        lines.append("  WARNING: graded without isolation (--unsafe-no-isolation)")
    if "NO cgroups" in result.get("isolation", ""):
        why = result["isolation"].split("NO cgroups", 1)[1].split(":", 1)[0].strip(" ()")
        lines.append(f"  WARNING: no cgroups on this machine ({clean(why, 200)}): the sandbox's "
                     "memory, processes and CPU are limited per process only")
    for note in result["notes"]:
        lines.append("  note: " + clean(note, 400))
    for q in result["questions"]:
        lines.append(f"{clean(q['id'], 20)} {clean(q['title'], 120)}: "
                     f"{_fmt(q['points'])}/{_fmt(q['max_points'])}")
        for m in q["messages"]:
            lines.append("    " + clean(m, 500))
    lines.append(f"Score: {_fmt(result['score'])}/{_fmt(result['max_score'])}")
    return "\n".join(lines)
