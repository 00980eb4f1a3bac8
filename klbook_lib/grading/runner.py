"""The student side of the autograder: run a notebook's cells, report plain answers.

The grader starts this file as ``python -I -S runner.py`` in a fresh temporary
directory and writes a *plan* (the cells, the names to look up, the test inputs) to
its standard input. The runner

1. puts a trimmed copy of ``klbook_lib`` (no reference solutions, no hidden tests) on
   ``sys.path`` and installs an audit hook (which cannot be removed from Python code)
   that refuses to open files of the real package, the masters and the tests, refuses
   to modify files outside the temporary directory, refuses to start processes and
   refuses to import any ``klbook_lib`` module a question could be answered with;
2. executes every code cell with a per-cell time limit, recording errors and going on;
3. calls the student's functions on the test inputs and converts whatever comes back
   into plain JSON data, written to a private pipe.

It never compares anything: expected answers are not in this process.
"""
from __future__ import annotations

import builtins
import json
import os
import signal
import sys
import types

_write = os.write
_dumps = json.dumps


class _Timeout(BaseException):
    """Raised by the alarm signal when a cell or a call runs too long."""


class _Capped:
    """A text stream that keeps at most ``limit`` characters and drops the rest."""

    def __init__(self, limit: int) -> None:
        self.limit, self.n, self.truncated = limit, 0, False

    def write(self, s) -> int:
        s = str(s)
        self.n += len(s)
        if self.n > self.limit:
            self.truncated = True
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError("no file descriptor while grading")


def _safe_str(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except BaseException:  # noqa: BLE001 - a hostile __str__
        text = type(exc).__name__
    return text[:500]


def _install_guards(plan: dict, notes: list) -> None:
    roots = [os.path.realpath(r) for r in plan["blocked_roots"]]
    work = os.path.realpath(plan["workdir"])
    allowed_mods = set(plan["allowed_modules"])
    proc_events = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                   "os.fork", "os.forkpty", "pty.spawn", "os.startfile"}
    modify_events = {"os.remove", "os.rmdir", "os.rename", "os.link", "os.symlink", "os.truncate",
                     "os.chmod", "os.chown", "os.utime", "shutil.rmtree", "os.mkdir", "shutil.move",
                     "shutil.copyfile", "os.removexattr", "os.setxattr"}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    import pathlib
    path_types = (str, bytes, pathlib.PurePosixPath, pathlib.PosixPath, pathlib.Path, pathlib.PurePath)
    realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep
    own_pid = str(os.getpid())

    def resolve(path):
        if type(path) not in path_types:
            raise PermissionError("only str, bytes or pathlib paths may be used while grading")
        return realpath(fsdecode(path) if type(path) in (str, bytes) else str(path))

    def inside(p, root):
        return p == root or p.startswith(root + sep)

    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if path is None or isinstance(path, int):
                return
            p = resolve(path)
            if p.startswith("/proc/") and p.split("/")[2].isdigit() and p.split("/")[2] != own_pid:
                notes.append(f"refused to open {p}")
                raise PermissionError("reading other processes' files is not allowed while grading")
            for r in roots:
                if inside(p, r):
                    notes.append(f"refused to open {p}")
                    raise PermissionError(f"reading {p} is not allowed while grading")
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            if writing and not (inside(p, work) or p == "/dev/null"):
                notes.append(f"refused to write {p}")
                raise PermissionError(f"writing {p} is not allowed while grading (only the "
                                      "temporary working directory may be written)")
        elif event == "import":
            name = args[0]
            if isinstance(name, str) and name.split(".")[0] == "klbook_lib" and name not in allowed_mods:
                msg = (f"import of {name} refused while grading: exercises must be solved "
                       "with your own code, not with the library's implementation")
                notes.append(msg)
                raise ImportError(msg)
        elif event in proc_events:
            notes.append(f"refused to start a process ({event})")
            raise PermissionError("starting another process is not allowed while grading")
        elif event in modify_events:
            for a in args[:2]:
                if not isinstance(a, (str, bytes, os.PathLike)):
                    continue            # a mode, a uid, a (atime, mtime) pair...
                p = resolve(a)
                if not inside(p, work):
                    notes.append(f"refused {event} on {p}")
                    raise PermissionError(f"{event} on {p} is not allowed while grading")

    sys.addaudithook(hook)

    class RefuseLibrary:
        """Also refuse ``importlib.import_module`` (which raises no audit event)."""

        @staticmethod
        def find_spec(name, path=None, target=None):
            hook("import", (name,))
            return None

    sys.meta_path.insert(0, RefuseLibrary)


class _FakeIPython:
    """Stands in for ``get_ipython()``: magics and shell commands are skipped, not run."""

    def __init__(self, notes: list) -> None:
        self._notes = notes

    def run_line_magic(self, name, line, *a, **k):
        self._notes.append(f"skipped the IPython magic %{name}")

    def run_cell_magic(self, name, line, cell, *a, **k):
        self._notes.append(f"skipped a cell with the IPython magic %%{name}")

    def system(self, cmd, *a, **k):
        self._notes.append("skipped a shell command (!...)")

    getoutput = system

    def __getattr__(self, name):
        raise AttributeError(f"get_ipython().{name} is not available while grading")


def _transform(src: str) -> str:
    lines = src.splitlines()
    if not any(line.lstrip().startswith(("%", "!")) for line in lines):
        return src
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(src)


def main() -> None:
    plan = json.loads(sys.stdin.read())
    sys.stdin = open(os.devnull)
    import resource

    # Hard limits (a process can lower but never raise them): memory and file size.
    # With SIGXFSZ ignored, writing past the file-size limit raises OSError instead of killing.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    for limit, value in ((resource.RLIMIT_AS, plan["max_memory"]),
                         (resource.RLIMIT_FSIZE, plan["max_file_size"])):
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):
            pass
    result_fd = plan["result_fd"]
    notes: list = []
    # Only the trimmed library copy and site-packages; no repository paths.
    sys.path[:] = [plan["sandbox"]] + [p for p in sys.path if "site-packages" not in p] + plan["site"]
    sys.dont_write_bytecode = True
    import numpy  # noqa: F401  - imported before the guards: plain, unmodified numpy
    from klbook_lib.grading.compare import encode, materialise
    _install_guards(plan, notes)

    out = _Capped(plan["max_output"])
    sys.stdout = sys.stderr = out
    main_mod = types.ModuleType("__main__")
    ns = main_mod.__dict__
    ns["__builtins__"] = builtins
    ns["get_ipython"] = lambda: _FakeIPython(notes)
    sys.modules["__main__"] = main_mod

    def on_alarm(signum, frame):
        raise _Timeout()

    def timed(seconds, fn, *args):
        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    cells = []
    for index, src in enumerate(plan["cells"]):
        record = {"index": index, "status": "ok"}
        try:
            code = compile(_transform(src), f"<cell {index + 1}>", "exec")
            timed(plan["cell_timeout"], exec, code, ns)
        except _Timeout:
            record = {"index": index, "status": "error",
                      "error": f"stopped after {plan['cell_timeout']:g} s (infinite loop?)"}
        except SystemExit as exc:
            record = {"index": index, "status": "error", "error": f"called sys.exit({exc.code!r:.50})"}
        except BaseException as exc:  # noqa: BLE001 - a student's cell may raise anything
            record = {"index": index, "status": "error", "error": _safe_str(exc)}
        cells.append(record)

    def run_case(fn, case):
        try:
            args = [materialise(a) for a in case["args"]]
            value = timed(plan["call_timeout"], fn, *args)
            return {"value": timed(plan["call_timeout"], encode, value)}
        except NotImplementedError:
            return {"error": "not implemented yet"}
        except _Timeout:
            return {"error": f"did not return within {plan['call_timeout']:g} s"}
        except SystemExit:
            return {"error": "called sys.exit()"}
        except BaseException as exc:  # noqa: BLE001
            return {"error": "raised " + _safe_str(exc)}

    missing = object()
    answers = {}
    for q in plan["questions"]:
        try:
            obj = ns.get(q["name"], missing)
            if obj is missing:
                what = "function" if q["kind"] == "function" else "variable"
                answers[q["id"]] = {"missing": f"the {what} `{q['name']}` is not defined"}
            elif q["kind"] == "function":
                if not callable(obj):
                    answers[q["id"]] = {"missing": f"`{q['name']}` is not a function"}
                else:
                    results, timed_out = [], False
                    for c in q["cases"]:   # after one timeout, do not wait for every case
                        if timed_out:
                            results.append({"error": "skipped after an earlier call timed out"})
                            continue
                        results.append(run_case(obj, c))
                        timed_out = "did not return" in results[-1].get("error", "")
                    answers[q["id"]] = {"cases": results}
            else:
                answers[q["id"]] = {"value": timed(plan["call_timeout"], encode, obj)}
        except BaseException as exc:  # noqa: BLE001
            answers[q["id"]] = {"missing": "could not read the answer: " + _safe_str(exc)}

    payload = _dumps({"cells": cells, "answers": answers, "notes": list(dict.fromkeys(notes))[:50],
                      "output_truncated": out.truncated}).encode()
    while payload:
        payload = payload[_write(result_fd, payload):]
    os._exit(0)


if __name__ == "__main__":
    main()
