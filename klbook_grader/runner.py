"""The student side of the autograder: run a notebook's cells, stream plain answers back.

The grader starts this file as ``python -I -S runner.py`` inside the sandbox (see
``sandbox.py``) and writes a *plan* to its standard input: the cells, the names the
questions look up, the test inputs, the limits. The runner

1. drops to an unprivileged user (when the sandbox was built by root), joins a fresh
   anonymous session keyring (the seccomp filter already refuses every other keyring
   operation) and sets its resource limits, before any student code runs;
2. executes the code cells in order, each under a time limit (an alarm; the grader also
   kills the whole sandbox from outside if the alarm does not work), recording errors and
   going on; line and cell magics that time code (``%time``, ``%%time``, ``%timeit``...)
   run their body once, other magics and shell escapes are skipped;
3. after each cell, calls the functions of the questions whose definition changed (the
   function, its code, defaults, closure or a global name it uses) on the test inputs, and
   sends each result as plain JSON data the moment it is known, so that whatever stops
   the notebook later keeps the answers already given.

Everything it sends is one JSON object per line on the result pipe:
``{"ev": "cell", "i": 3, "t": "start"}``, ``{"ev": "cell", "i": 3, "t": "end", "ok": false,
"error": "..."}``, ``{"ev": "q", "q": "q1", "t": "start"}``, ``{"ev": "call", "q": "q1", "j": 0}``,
``{"ev": "case", "q": "q1", "j": 0, "r": {"value": ...}}``, ``{"ev": "value", "q": "q3", "r": ...}``,
``{"ev": "missing", "q": "q2", "why": "..."}``, ``{"ev": "q", "q": "q1", "t": "end"}``,
``{"ev": "note", "text": "..."}``, ``{"ev": "done"}``. The grader trusts none of it.
It never compares anything: expected answers are not in this process.
"""
from __future__ import annotations

import builtins
import json
import os
import re
import signal
import sys
import types

_write = os.write
_dumps = json.dumps
_getpid = os.getpid
_exit = os._exit
_dict_get = dict.get
_MISSING = object()
_EMPTY_CELL = object()
# Magics that time or profile code: their body runs (once), the rest are skipped.
_BODY_MAGICS = {"time", "timeit", "capture", "prun"}
_ASSIGNED_MAGIC = re.compile(r"=\s*[%!]")


class _Timeout(BaseException):
    """Raised by the alarm signal when a cell or a call runs too long."""


class _NoGradient(Exception):
    """A case asks for a gradient and the function's result carries none."""


class _Channel:
    """The result pipe: one JSON object per line, written only by the runner's own process."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pid, self.notes = fd, _getpid(), set()

    def send(self, event: dict) -> None:
        if _getpid() != self.pid:          # a forked child never speaks for the runner
            return
        data = b"\n" + _dumps(event).encode() + b"\n"   # a leading newline ends any junk line
        try:
            while data:
                data = data[_write(self.fd, data):]
        except OSError:
            _exit(3)                       # the pipe is gone: nothing can be reported

    def note(self, text: str) -> None:
        text = str(text)[:300]
        if text not in self.notes and len(self.notes) < 50:
            self.notes.add(text)
            self.send({"ev": "note", "text": text})


class _Capped:
    """A text stream that keeps nothing and counts characters, noting when over the cap."""

    def __init__(self, limit: int, channel: _Channel) -> None:
        self.limit, self.n, self.channel = limit, 0, channel

    def write(self, s) -> int:
        s = s if isinstance(s, str) else str(s)
        if self.n <= self.limit < self.n + len(s):
            self.channel.note(f"the notebook printed more than {self.limit:,} characters; "
                              "the rest was discarded")
        self.n += len(s)
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


def _drop_privileges(uid: int) -> None:
    """Become an unprivileged user for good (root mode of the sandbox)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
        raise SystemExit("could not drop privileges")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise SystemExit("privileges were not dropped")


def _fresh_keyring(keyctl: int | None) -> int:
    """Join a new anonymous session keyring (``KEYCTL_JOIN_SESSION_KEYRING``, no name), so
    that not even a key of the grader's session is within reach; returns its serial number
    (negative if the call failed: the filter still refuses every keyring operation)."""
    if keyctl is None:
        return -1
    import ctypes

    return int(ctypes.CDLL(None, use_errno=True).syscall(int(keyctl), 1, None))


def _keyring_refused(keyctl: int | None) -> bool:
    """Is reading the session keyring refused (``KEYCTL_READ`` fails with EPERM)?"""
    if keyctl is None:
        return False
    import ctypes
    import errno

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(int(keyctl), 11, -3, None, 0) == -1 and ctypes.get_errno() == errno.EPERM


def _set_limits(limits: dict) -> None:
    import resource

    # With SIGXFSZ ignored, writing past the file-size limit raises OSError instead of killing.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    cpu = int(limits["cpu"])
    for what, soft, hard in ((resource.RLIMIT_AS, limits["memory"], limits["memory"]),
                             (resource.RLIMIT_NPROC, limits["processes"], limits["processes"]),
                             (resource.RLIMIT_CPU, cpu, cpu + 5),
                             (resource.RLIMIT_FSIZE, limits["file"], limits["file"]),
                             (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
                             (resource.RLIMIT_CORE, 0, 0)):
        resource.setrlimit(what, (int(soft), int(hard)))


def _install_guards(guards: dict, channel: _Channel) -> None:
    """Best-effort Python audit hook, used only without OS isolation (``--unsafe-no-isolation``).

    It refuses to open the repository, to write outside the working directory and to start
    processes. Pure Python can get around it (PEP 578: audit hooks are not a sandbox); it
    only stops honest mistakes.
    """
    import pathlib

    roots = [os.path.realpath(r) for r in guards["blocked_roots"]]
    work = os.path.realpath(guards["workdir"])
    proc_events = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                   "os.fork", "os.forkpty", "pty.spawn"}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    path_types = (str, bytes, pathlib.PurePath)
    realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep

    def inside(p, root):
        return p == root or p.startswith(root + sep)

    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if path is None or isinstance(path, int) or not isinstance(path, path_types):
                return
            p = realpath(fsdecode(path) if isinstance(path, (str, bytes)) else str(path))
            if any(inside(p, r) for r in roots):
                channel.note(f"refused to open {p}")
                raise PermissionError(f"reading {p} is not allowed while grading")
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            if writing and not (inside(p, work) or p == "/dev/null"):
                channel.note(f"refused to write {p}")
                raise PermissionError(f"writing {p} is not allowed while grading")
        elif event in proc_events:
            channel.note(f"refused to start a process ({event})")
            raise PermissionError("starting another process is not allowed while grading")

    sys.addaudithook(hook)


def _refuse_library(allowed: set, packages: tuple, channel: _Channel) -> None:
    """Refuse ``klbook_lib`` and ``klbook_grader`` modules the sandbox does not offer, with a
    clear message."""

    def offered(name: str) -> bool:     # an offered module, inside one, or a package above one
        return name in allowed or any(name == p or name.startswith(p + ".") or p.startswith(name + ".")
                                      for p in packages)

    class RefuseLibrary:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if isinstance(name, str) and name.split(".")[0] in ("klbook_lib", "klbook_grader") and not offered(name):
                msg = (f"import of {name} refused while grading: exercises must be solved "
                       "with your own code, not with the library's implementation")
                channel.note(msg)
                raise ImportError(msg)
            return None

    sys.meta_path.insert(0, RefuseLibrary)


def _transform(src: str) -> str:
    """IPython syntax (magics, ``!shell``) into plain Python calling ``get_ipython()``."""
    if not any(line.lstrip().startswith(("%", "!")) or _ASSIGNED_MAGIC.search(line)
               for line in src.splitlines()):
        return src
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(src)


def _strip_options(line: str) -> str:
    """``%timeit -n 10 -r 3 f(x)`` -> ``f(x)``: drop the leading options of a timing magic."""
    words = line.split(" ")
    while words and words[0].startswith("-"):
        opt = words.pop(0)
        if opt in ("-n", "-r", "-p", "-s", "-l", "-T", "-D") and words:
            words.pop(0)
    return " ".join(words)


class _Shell:
    """Stands in for ``get_ipython()``: timing magics run their body, others are skipped."""

    def __init__(self, ns: dict, channel: _Channel) -> None:
        self._ns, self._channel = ns, channel

    def _run(self, src: str):
        src = _transform(src)
        try:
            code = compile(src, "<magic>", "eval")
        except SyntaxError:
            exec(compile(src, "<magic>", "exec"), self._ns)
            return None
        return eval(code, self._ns)

    def run_line_magic(self, name, line, *a, **k):
        if name in _BODY_MAGICS:
            return self._run(_strip_options(str(line)))
        self._channel.note(f"skipped the IPython magic %{name}")
        return None

    def run_cell_magic(self, name, line, cell, *a, **k):
        if name in _BODY_MAGICS:
            self._run(str(cell))
            return None
        self._channel.note(f"skipped a cell with the IPython magic %%{name}")
        return None

    def system(self, cmd, *a, **k):
        self._channel.note("skipped a shell command (!...)")

    getoutput = system

    def __getattr__(self, name):
        raise AttributeError(f"get_ipython().{name} is not available while grading")


def _code_names(code, out: set, depth: int = 0) -> None:
    out.update(code.co_names)
    if depth < 10:
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                _code_names(const, out, depth + 1)


def _dependencies(obj, ns: dict, out: list, seen: set, depth: int = 0) -> None:
    """Objects an answer depends on, compared by identity after each cell: the function,
    its code, defaults and closure, and the notebook's globals it names (recursively for the
    notebook's own functions). A change in any of them means the question is asked again."""
    out.append(obj)
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
        out.append(obj)
    if not isinstance(obj, types.FunctionType) or id(obj) in seen or len(out) > 5000:
        out.append(type(obj))
        return
    seen.add(id(obj))
    out += [obj.__code__, obj.__defaults__, obj.__kwdefaults__]
    for cell in obj.__closure__ or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:
            out.append(_EMPTY_CELL)
    names: set = set()
    _code_names(obj.__code__, names)
    globs = obj.__globals__
    for name in sorted(names):
        value = _dict_get(globs, name, _MISSING)
        out.append(value)
        if depth < 4 and isinstance(value, types.FunctionType) and value.__globals__ is ns:
            _dependencies(value, ns, out, seen, depth + 1)


def _same(a, b) -> bool:
    return a is not None and len(a) == len(b) and all(x is y for x, y in zip(a, b))


def main() -> None:
    plan = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)
    if plan.get("uid") is not None:
        _drop_privileges(int(plan["uid"]))
    keyring = _fresh_keyring(plan.get("keyctl"))
    _set_limits(plan["limits"])
    # Only the public library copy, the standard library and site-packages; no repository.
    sys.path[:] = [plan["lib"]] + [p for p in sys.path if "site-packages" not in p] + plan["site"]
    sys.dont_write_bytecode = True
    if plan.get("probe"):
        import numpy  # noqa: F401 - the environment works

        if os.getuid() == 0 or any(os.path.exists(p) for p in plan.get("hidden", [])):
            raise SystemExit("the sandbox is not isolated")
        if plan.get("keyctl") is not None and (keyring < 0 or not _keyring_refused(plan["keyctl"])):
            raise SystemExit("the seccomp filter is not in force (the keyring can be read)")
        print("klbook-sandbox-ok", flush=True)
        _exit(0)
    run(plan)


def run(plan: dict) -> None:
    channel = _Channel(int(plan["result_fd"]))
    os.set_inheritable(channel.fd, False)
    os.makedirs(plan["work"], exist_ok=True)
    os.chdir(plan["work"])
    name = plan.get("notebook_name")
    if name:
        with open(name, "w", encoding="utf-8") as fh:      # the notebook's own copy
            fh.write(plan.get("notebook_text", ""))
    import numpy  # noqa: F401 - imported before student code: plain, unmodified numpy
    from klbook_grader.compare import encode, materialise

    if plan.get("guards"):
        _install_guards(plan["guards"], channel)
    _refuse_library(set(plan["modules"]), tuple(plan.get("packages", ())), channel)

    out = _Capped(int(plan["max_output"]), channel)
    sys.stdout = sys.stderr = out
    main_mod = types.ModuleType("__main__")
    ns = main_mod.__dict__
    ns["__builtins__"] = builtins
    shell = _Shell(ns, channel)
    ns["get_ipython"] = lambda: shell
    sys.modules["__main__"] = main_mod
    main_pid = _getpid()

    def on_alarm(signum, frame):
        raise _Timeout()

    def timed(seconds, fn, *args):
        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def describe(exc, seconds):
        try:
            return timed(seconds, _safe_str, exc)
        except BaseException:  # noqa: BLE001
            return type(exc).__name__

    def gradient(fn, args, seconds):
        """d sum(fn(*args)) / d args[0], by autograd (a case whose answer is a gradient)."""
        import torch

        if not isinstance(args[0], torch.Tensor):
            raise TypeError("the first argument is not a tensor")
        x = args[0].detach().clone().requires_grad_(True)
        out = timed(seconds, fn, x, *args[1:])
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            raise _NoGradient
        (g,) = timed(seconds, lambda: torch.autograd.grad(out.sum(), x, allow_unused=True))
        return torch.zeros_like(x) if g is None else g.detach()

    def run_case(fn, args, seconds, grad=False):
        try:
            value = gradient(fn, args, seconds) if grad else timed(seconds, fn, *args)
            return {"value": timed(seconds, encode, value)}
        except _NoGradient:
            return {"error": "the result carries no gradient with respect to the first argument "
                             "(was something detached, or converted to numpy?)"}
        except NotImplementedError:
            return {"error": "not implemented yet"}
        except _Timeout:
            return {"error": f"did not return within {seconds:g} s", "timeout": True}
        except SystemExit:
            return {"error": "called sys.exit()"}
        except BaseException as exc:  # noqa: BLE001
            return {"error": "raised " + describe(exc, seconds)}
        finally:
            if _getpid() != main_pid:
                _exit(0)

    skip_questions = set(plan.get("skip_questions", []))
    fingerprints: dict = {q["id"]: None for q in plan["questions"]}

    def ask(q, obj):
        qid, seconds = q["id"], float(q["timeout"])
        channel.send({"ev": "q", "q": qid, "t": "start"})
        what = "function" if q["kind"] == "function" else "variable"
        if obj is _MISSING:
            channel.send({"ev": "missing", "q": qid, "why": f"the {what} `{q['name']}` is not defined"})
        elif q["kind"] == "function":
            if not callable(obj):
                channel.send({"ev": "missing", "q": qid, "why": f"`{q['name']}` is not a function"})
            else:
                timed_out = False
                for j, case in enumerate(q["cases"]):
                    args = None
                    if timed_out:
                        r = {"error": "skipped after an earlier call timed out"}
                    else:
                        try:
                            args = [materialise(a) for a in case["args"]]
                        except BaseException as exc:  # noqa: BLE001 - e.g. torch missing
                            r = {"error": "could not build the test input: " + _safe_str(exc)}
                    channel.send({"ev": "call", "q": qid, "j": j})
                    if args is not None:
                        r = run_case(obj, args, seconds, bool(case.get("grad")))
                        timed_out = bool(r.pop("timeout", False))
                    channel.send({"ev": "case", "q": qid, "j": j, "r": r})
        else:
            channel.send({"ev": "call", "q": qid, "j": 0})
            try:
                r = {"value": timed(seconds, encode, obj)}
            except _Timeout:
                r = {"error": f"could not read the answer within {seconds:g} s"}
            except BaseException as exc:  # noqa: BLE001
                r = {"error": "could not read the answer: " + describe(exc, seconds)}
            finally:
                if _getpid() != main_pid:
                    _exit(0)
            channel.send({"ev": "value", "q": qid, "r": r})
        channel.send({"ev": "q", "q": qid, "t": "end"})

    def answer_changed(final: bool) -> None:
        for q in plan["questions"]:
            if q["id"] in skip_questions:
                continue
            obj = _dict_get(ns, q["name"], _MISSING)
            if q["kind"] == "function":
                fp: list = []
                _dependencies(obj, ns, fp, set())
            else:
                fp = [obj]
            prev = fingerprints[q["id"]]
            if prev is None and obj is _MISSING and not final:
                continue                      # not defined yet
            if _same(prev, fp) and not (final and q["kind"] != "function"):
                continue                      # unchanged (values are read again at the end)
            fingerprints[q["id"]] = fp
            ask(q, obj)

    skip_cells = {int(i) for i in plan.get("skip_cells", [])}
    cell_seconds = float(plan["cell_timeout"])
    for index, src in enumerate(plan["cells"]):
        if index in skip_cells:
            continue
        channel.send({"ev": "cell", "i": index, "t": "start"})
        record = {"ev": "cell", "i": index, "t": "end", "ok": True}
        try:
            code = compile(_transform(src), f"<cell {index + 1}>", "exec")
            timed(cell_seconds, exec, code, ns)
        except _Timeout:
            record.update(ok=False, error=f"stopped after {cell_seconds:g} s (infinite loop?)")
        except SystemExit as exc:
            code_repr = describe_exit(exc)
            record.update(ok=False, error=f"called sys.exit({code_repr})")
        except BaseException as exc:  # noqa: BLE001 - a student's cell may raise anything
            record.update(ok=False, error=describe(exc, cell_seconds))
        finally:
            if _getpid() != main_pid:
                _exit(0)
        channel.send(record)
        answer_changed(final=False)
    answer_changed(final=True)
    channel.send({"ev": "done"})
    _exit(0)


def describe_exit(exc: SystemExit) -> str:
    code = exc.code
    if code is None or type(code) in (int, float, bool):   # never a student's __repr__
        return repr(code)[:50]
    return "..."


if __name__ == "__main__":
    main()
