"""OS-level isolation of a student's notebook: a bubblewrap sandbox, and what it is given.

The student's code runs in ``runner.py`` inside a bubblewrap (``bwrap``) sandbox with

* its own mount namespace holding only the Python environment, read-only (the
  interpreter's prefix, the virtual environment, the programs and libraries of ``/usr``),
  a read-only copy of the *public* part of ``klbook_lib`` and the runner, and a private
  size-limited ``tmpfs`` at ``/tmp`` (its working directory); the repository, the masters,
  the hidden tests, other submissions and the grader's files exist at no path;
* its own PID namespace (it can signal nothing outside; when the sandbox ends, the kernel
  kills every process in it), network namespace (no network), IPC and UTS namespaces;
* limits (``resource.setrlimit``, applied by the runner before any student code) on the
  address space and CPU time per process, the number of processes, file sizes and open
  files; the ``tmpfs`` size limits the disk (``/dev/shm`` is a 64 MB tmpfs of its own, and
  ``/dev`` is read-only with no pseudo-terminals: no ``/dev/ptmx``);
* a seccomp filter (:mod:`klbook_grader.syscalls`, ``bwrap --seccomp``) that refuses
  the kernel keyrings, new namespaces and mounts, tracing, ``memfd_create`` and the
  kernel's administration calls; and, where the machine has them, a cgroup of its own
  (:mod:`klbook_grader.cgroups`) that bounds the memory, processes and CPU of the
  whole sandbox.

Two ways of building it, chosen by :func:`backend` with a real trial run:

``root``    the grader runs as root (CI): bwrap needs no user namespace; the runner drops
            to a fresh unprivileged user id (unique per run, so the process limit counts
            only that run's processes) before running student code.
``userns``  an ordinary user: bwrap creates a user namespace; inside, the notebook's
            processes count against the process limit of that namespace alone, and
            creating further user namespaces is disabled.

If neither works (no bwrap, user namespaces switched off, no libseccomp to build the
filter), :func:`backend` raises :class:`SandboxUnavailable` with what to install.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import importlib.util
import site
import stat
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from klbook_grader import syscalls

GRADING_DIR = Path(__file__).resolve().parent                # .../klbook_grader
# the book's library: a package beside this one (the same checkout, or the same site-packages)
PACKAGE_DIR = Path(importlib.util.find_spec("klbook_lib").origin).resolve().parent   # .../klbook_lib
REPO_DIR = PACKAGE_DIR.parent

# Inside the sandbox
INSIDE_LIB = "/klbook/lib"             # the public copies of klbook_lib and klbook_grader
INSIDE_RUNNER = "/klbook/runner.py"
INSIDE_TMP = "/tmp"                    # the private tmpfs
INSIDE_WORK = "/tmp/work"              # the notebook's working directory (and HOME)
INSIDE_DATA = "/klbook/data"           # read-only data a training task reads (make_staging's data_dirs)
SHM_BYTES = 64 << 20                   # size of the sandbox's /dev/shm (a tmpfs of its own)

# What the student's process gets of the two packages: the runtime helpers, the public
# checker (paths relative to the folder that holds both packages).
PUBLIC_FILES = ("klbook_lib/runtime.py", "klbook_grader/__init__.py", "klbook_grader/checker.py",
                "klbook_grader/compare.py", "klbook_grader/public_cases.json")
PUBLIC_MODULES = ("klbook_lib", "klbook_lib.runtime", "klbook_grader",
                  "klbook_grader.checker", "klbook_grader.compare")
# The sandbox's own package __init__: it does not depend on what the real one imports.
PUBLIC_INIT = '''"""klbook_lib as a notebook sees it while being graded: the public modules only."""
import importlib


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return importlib.import_module(f"{__name__}.{name}")
'''

SYSTEM_DIRS = ("/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32",
               "/usr/libexec", "/usr/share", "/usr/local/bin", "/usr/local/lib", "/usr/local/lib64")
BWRAP_ENV = "KLBOOK_BWRAP"            # path of bwrap to use ("" or a missing file: none)
MODE_ENV = "KLBOOK_SANDBOX_MODE"      # "root" or "userns": try only that way of building it
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`, or "
                "`bash tools/ensure_bubblewrap.sh` in the book's repository)")


class SandboxUnavailable(RuntimeError):
    """No OS-level isolation can be built on this machine; the message says what to install."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox run (per process unless stated).

    ``memory_bytes``   address space of each process (``RLIMIT_AS``);
    ``processes``      processes and threads of the sandbox's user (``RLIMIT_NPROC``);
    ``cpu_seconds``    CPU time of each process (``RLIMIT_CPU``); ``None``: the run's total
                       time limit plus 10 s;
    ``disk_bytes``     size of the private tmpfs holding ``/tmp`` and the working directory;
    ``file_bytes``     largest file a process may write (``RLIMIT_FSIZE``);
    ``open_files``     open file descriptors (``RLIMIT_NOFILE``);
    ``total_memory_bytes``  memory of the whole sandbox, every process, tmpfs and shared
                       memory pages included (its cgroup, where the machine has cgroups).
    """

    memory_bytes: int = 4 << 30
    processes: int = 64
    cpu_seconds: int | None = None
    disk_bytes: int = 256 << 20
    file_bytes: int = 64 << 20
    open_files: int = 1024
    total_memory_bytes: int = 4 << 30

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "processes", "disk_bytes", "file_bytes", "open_files",
                     "total_memory_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if self.cpu_seconds is not None and (not isinstance(self.cpu_seconds, int)
                                             or self.cpu_seconds <= 0):
            raise ValueError(f"cpu_seconds: must be a positive integer or None, got {self.cpu_seconds!r}")

    def merged(self, **changes) -> "Limits":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True)
class Backend:
    """How student code is run: ``mode`` is ``root``, ``userns`` or ``none`` (unsafe)."""

    mode: str
    bwrap: str | None = None
    version: str = ""
    # options of this bwrap (older releases lack some: 0.6 has no --size nor --disable-userns)
    features: frozenset = field(default=frozenset({"--size", "--disable-userns", "--perms",
                                                   "--seccomp"}))

    @property
    def isolated(self) -> bool:
        return self.mode in ("root", "userns")

    def describe(self) -> str:
        if not self.isolated:
            return "none (--unsafe-no-isolation): the notebook ran as the grader's user"
        how = ("as a fresh unprivileged user id" if self.mode == "root"
               else "in an unprivileged user namespace")
        text = (f"{self.version or 'bubblewrap'}, {how}; no network, own PID namespace; "
                f"seccomp filter ({len(syscalls.DENIED) + 3} system calls refused or restricted)")
        if "--size" not in self.features:
            text += "; tmpfs size NOT limited (bubblewrap older than 0.7)"
        return text


UNSAFE = Backend(mode="none")


# ---------------------------------------------------------------- the filesystem it sees
def _outermost(paths) -> list[str]:
    keep: list[str] = []
    for p in sorted(set(paths), key=len):
        if not any(p == k or p.startswith(k + os.sep) for k in keep):
            keep.append(p)
    return keep


def _env_roots(outermost: bool = True) -> list[str]:
    """Directories of the Python environment the sandbox needs, read-only (only the
    outermost ones unless ``outermost`` is false)."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(sys.executable)}
    roots |= set(site.getsitepackages())
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(p)
    out = set()
    for r in roots:
        for p in (os.path.abspath(r), os.path.realpath(r)):
            if os.path.isdir(p):
                out.add(p)
    return _outermost(out) if outermost else sorted(out)


def _package_dir(top: str) -> Path | None:
    """The folder of one of the two packages the sandbox copies from, else ``None``."""
    return {"klbook_lib": PACKAGE_DIR, "klbook_grader": GRADING_DIR}.get(top)


def _offerable(parts: list[str]) -> bool:
    """May an exercise let the sandbox import this module: a ``klbook_lib`` module, or one of
    the grader's training tasks (``klbook_grader.tasks``); never the rest of the grader."""
    return len(parts) >= 2 and (parts[0] == "klbook_lib" or parts[:2] == ["klbook_grader", "tasks"])


def _secret_paths() -> list[str]:
    """Paths inside the bound environment that must stay hidden: installed copies of
    ``klbook_lib`` and ``klbook_grader`` (a regular, non-editable install keeps the hidden
    tests there) and, for an editable install, the repository itself if it lies inside the
    environment."""
    sites = {os.path.realpath(p) for p in site.getsitepackages()}
    sites.add(os.path.realpath(sysconfig.get_paths().get("purelib", "") or "/nonexistent"))
    paths = {os.path.join(sp, top) for sp in sites for top in ("klbook_lib", "klbook_grader")
             if os.path.isdir(os.path.join(sp, top))}
    for package, repo in ((PACKAGE_DIR, REPO_DIR), (GRADING_DIR, GRADING_DIR.parent)):
        if not any(os.path.realpath(package).startswith(sp + os.sep) for sp in sites):  # a checkout
            paths.add(os.path.realpath(repo))
    return sorted(paths)


def site_dirs() -> list[str]:
    return [p for p in site.getsitepackages() if os.path.isdir(p)]


def library_files(modules) -> tuple[str, ...]:
    """The files (relative to the folder holding ``klbook_lib/``, e.g. ``klbook_lib/ppo.py``)
    of extra modules or packages an exercise lets the sandbox import, e.g.
    ``("klbook_lib.ppo", "klbook_lib.envs")`` for a task that trains with the book's PPO:
    ``klbook_lib`` modules and the grader's training tasks (``klbook_grader.tasks``), never
    the rest of the grader."""
    files = []
    for name in modules:
        parts = str(name).split(".")
        if not _offerable(parts) or not all(p.isidentifier() for p in parts):
            raise ValueError(f"library: {name!r} is not a klbook_lib module or a klbook_grader task")
        top = _package_dir(parts[0])
        rel = Path(*parts[1:])
        if (top / rel).is_dir():
            files += [str(Path(parts[0]) / f.relative_to(top)) for f in sorted((top / rel).rglob("*.py"))]
        elif (top / rel.with_suffix(".py")).is_file():
            files.append(str(Path(parts[0]) / rel.with_suffix(".py")))
        else:
            raise ValueError(f"library: no module {name!r}")
    return tuple(files)


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    top = _package_dir(parts[0])
    if top is None:
        return None
    rel = Path(*parts[1:])
    for f in (top / rel / "__init__.py", (top / rel).with_suffix(".py")):
        if f.is_file():
            return f
    return None


def _imports(path: Path, module: str, everything: bool) -> set[str]:
    """The ``klbook_lib`` and ``klbook_grader`` modules a file imports: at its top level only (not inside functions,
    nor under ``if TYPE_CHECKING``), or ``everything``."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not everything:
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
                continue
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[:len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                subs = {f"{base}.{a.name}" for a in node.names}
                found = {m for m in subs if _module_file(m) is not None}
                out.update(found)
                if found != subs:          # names of the module itself, not submodules
                    out.add(base)
            visit(ast.iter_child_nodes(node))

    visit(tree.body)
    return {m for m in out if _package_dir(m.split(".")[0]) is not None and _module_file(m) is not None}


def library_closure(modules, everything: bool = False) -> tuple[str, ...]:
    """``modules`` and every ``klbook_lib`` module (or grader task) they import, transitively
    (modules and packages named; packages with all their modules): at the top level of each
    file only, which is what importing them runs, or ``everything`` (imports inside functions
    too). The rest of ``klbook_grader`` is never part of it (its public checker is in every
    sandbox anyway)."""
    named = {str(m) for m in modules}
    for m in named:                  # issue 36: a question names modules, never a whole package
        f = _module_file(m) if m.split(".")[0] == "klbook_lib" else None
        if f is not None and f.name == "__init__.py" and m != "klbook_lib":
            raise ValueError(f"library: {m!r} is a package; name the modules the question needs")
    todo = sorted(named)
    seen: list[str] = []
    while todo:
        name = todo.pop()
        if name in seen or not _offerable(name.split(".")):
            continue
        seen.append(name)
        f = _module_file(name)
        if f is None:
            continue
        files = [f]
        if f.name == "__init__.py" and name in named:     # a package named: all of it
            files = sorted(f.parent.rglob("*.py"))
        for g in files:
            top = name.split(".")[0]
            sub = ".".join([top, *g.relative_to(_package_dir(top)).with_suffix("").parts])
            sub = sub.removesuffix(".__init__")
            todo += sorted(_imports(g, sub, everything) - set(seen))
    return tuple(sorted(seen))


def make_staging(root: Path, extra_files: tuple = (), data_dirs: tuple = ()) -> None:
    """Write the runner and the public copies of ``klbook_lib`` and ``klbook_grader`` into
    ``root`` (read-only inside),
    and a copy of each of ``data_dirs`` (folders of public data a training task reads, such as a
    cached pipeline: ``Question.task_data``) into ``root/data/<its name>`` (:data:`INSIDE_DATA`)."""
    lib = root / "lib"
    for d in data_dirs:
        src = Path(d)
        if not src.is_dir() or src.is_symlink():
            raise ValueError(f"data_dirs: {str(d)!r} is not a folder")
        shutil.copytree(src, root / "data" / src.name, symlinks=False)
    for rel in PUBLIC_FILES + tuple(extra_files):
        parts = Path(rel).parts
        top = _package_dir(parts[0]) if len(parts) >= 2 else None
        src = top / Path(*parts[1:]) if top is not None else None
        if src is None or not src.is_file() or ".." in parts or "hidden" in parts or (
                rel not in PUBLIC_FILES and not _offerable(list(parts))):
            raise ValueError(f"extra_files: {rel!r} is not a public file of klbook_lib or klbook_grader")
        dst = lib / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    (lib / "klbook_lib" / "__init__.py").write_text(PUBLIC_INIT, encoding="utf-8")
    for d in [p for p in lib.rglob("*") if p.is_dir()]:
        init = d / "__init__.py"
        if not init.exists():
            init.write_text("", encoding="utf-8")
    shutil.copyfile(GRADING_DIR / "runner.py", root / "runner.py")
    for p in [root, *root.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)


def sandbox_env() -> dict:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": INSIDE_WORK, "TMPDIR": INSIDE_TMP,
            "USER": "student", "LOGNAME": "student", "MPLBACKEND": "Agg",
            "MPLCONFIGDIR": INSIDE_TMP + "/.matplotlib", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1", "KLBOOK_GRADING": "1", "LANG": "C.UTF-8",
            "KLBOOK_TASK_DATA": INSIDE_DATA}


def command(backend: Backend, staging: Path, limits: Limits, seccomp_fd: int | None = None) -> list[str]:
    """The bwrap command line that runs ``runner.py`` from ``staging`` in a fresh sandbox,
    with the seccomp filter read from ``seccomp_fd`` (:func:`syscalls.program_fd`)."""
    b = [backend.bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net",
         "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if seccomp_fd is not None:
        b += ["--seccomp", str(seccomp_fd)]
    if backend.mode == "userns":
        b += ["--unshare-user", "--uid", "65534", "--gid", "65534"]
        if "--disable-userns" in backend.features:
            b += ["--disable-userns"]
    else:   # real root: keep only what the runner needs to drop to an unprivileged user
        b += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    b += ["--clearenv"]
    for k, v in sandbox_env().items():
        b += ["--setenv", k, v]
    # the private, size-limited tmpfs first, so that nothing mounted later can be hidden by it
    b += ["--perms", "1777"]
    if "--size" in backend.features:
        b += ["--size", str(limits.disk_bytes)]
    b += ["--tmpfs", INSIDE_TMP]
    made: set = set()

    def parents(path: str) -> list[str]:
        """Create the directories leading to ``path`` with mode 0755: bwrap would copy the
        host's modes (e.g. /root's 0700), which the unprivileged user could not traverse."""
        out = []
        for d in map(str, list(Path(path).parents)[::-1][1:]):
            if d not in made and d != INSIDE_TMP and not any(
                    d == x or d.startswith(x + os.sep) for x in bound):
                out += ["--perms", "0755", "--dir", d]
                made.add(d)
        return out

    bound: list[str] = []

    def bind(src: str, dst: str) -> list[str]:
        out = parents(dst) + ["--ro-bind", src, dst]
        bound.append(dst)
        return out

    # the system: programs, libraries and shared data of /usr (not /usr/src, /usr/local/src,
    # /usr/include..., where source checkouts may live) and the usual links into it
    system = [d for d in SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
    for d in system:
        b += bind(d, d)
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            b += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            b += bind(top, top)
    for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime"):
        if os.path.exists(f):
            b += bind(f, f)
    roots = [r for r in _env_roots() if not any(r == d or r.startswith(d + os.sep) for d in system)]
    for r in roots:
        b += bind(r, r)
    # hide whatever secret lies inside a bound directory: a regular install of klbook_lib or
    # klbook_grader is replaced by its public copy; a checkout inside the environment by an
    # empty read-only tmpfs (in which the environment's own directories are bound again)
    for secret in _secret_paths():
        if not (os.path.isdir(secret) and any(secret.startswith(r + os.sep) for r in roots + system)):
            continue
        if os.path.basename(secret) in ("klbook_lib", "klbook_grader"):
            b += ["--ro-bind", str(staging / "lib" / os.path.basename(secret)), secret]
            continue
        b += ["--tmpfs", secret]
        for r in _outermost(d for d in _env_roots(outermost=False) if d.startswith(secret + os.sep)):
            b += ["--ro-bind", r, r]
        b += ["--remount-ro", secret]
    b += ["--ro-bind", str(staging), "/klbook", "--proc", "/proc", "--dev", "/dev",
          # /dev read-only: /dev/shm a small tmpfs of its own, and an empty read-only
          # /dev/pts hides the pseudo-terminal multiplexer (/dev/ptmx dangles)
          "--perms", "1777", *(["--size", str(SHM_BYTES)] if "--size" in backend.features else []),
          "--tmpfs", "/dev/shm", "--tmpfs", "/dev/pts", "--remount-ro", "/dev/pts",
          "--remount-ro", "/dev",
          # everything bwrap created at the top is read-only: only the tmpfs can be written
          "--remount-ro", "/", "--chdir", INSIDE_TMP]
    b += [sys.executable, "-I", "-S", INSIDE_RUNNER]
    return b


# ---------------------------------------------------------------- choosing the backend
_lock = threading.Lock()
_cached: Backend | None = None
_cached_error: str | None = None


def _bwrap_path() -> str | None:
    forced = os.environ.get(BWRAP_ENV)
    if forced is not None:
        return forced if forced and os.path.isfile(forced) and os.access(forced, os.X_OK) else None
    return shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/bin/bwrap")
                                          if os.access(p, os.X_OK)), None)


def _trial(backend: Backend, staging: Path) -> str | None:
    """Run the runner's self-test in the sandbox; ``None`` if it works, else the reason."""
    plan = {"probe": True, "uid": fresh_uid() if backend.mode == "root" else None,
            "limits": plan_limits(Limits(), 30), "lib": INSIDE_LIB, "site": site_dirs(),
            "work": INSIDE_WORK, "keyctl": syscalls.keyctl_number(),
            "hidden": [str(GRADING_DIR / "hidden"), str(REPO_DIR / "exercises" / "masters")]}
    fd = -1
    try:
        fd = syscalls.program_fd()
        res = subprocess.run(command(backend, staging, Limits(), fd), input=json.dumps(plan).encode(),
                             capture_output=True, timeout=60, pass_fds=(fd,))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        if fd >= 0:
            os.close(fd)
    out = res.stdout.decode("utf-8", "replace").strip().splitlines()
    if res.returncode == 0 and out and out[-1] == "klbook-sandbox-ok":
        return None
    err = (res.stderr.decode("utf-8", "replace").strip().splitlines() or ["no message"])[-1]
    return f"exit status {res.returncode}: {err[:300]}"


def backend() -> Backend:
    """The isolation this machine offers (tried once per process); raises SandboxUnavailable."""
    global _cached, _cached_error
    with _lock:
        if _cached is not None:
            return _cached
        if _cached_error is not None:
            raise SandboxUnavailable(_cached_error)
        bwrap = _bwrap_path()
        if bwrap is None:
            _cached_error = f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}"
            raise SandboxUnavailable(_cached_error)
        try:
            usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True,
                                   timeout=20).stdout
            features = frozenset(f for f in ("--size", "--disable-userns", "--perms", "--seccomp")
                                 if f in usage)
            version = subprocess.run([bwrap, "--version"], capture_output=True, text=True,
                                     timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            _cached_error = f"{bwrap} does not run ({exc}): {INSTALL_HINT}"
            raise SandboxUnavailable(_cached_error) from None
        if "--seccomp" not in features:
            _cached_error = f"{version or bwrap} cannot load a seccomp filter: {INSTALL_HINT}"
            raise SandboxUnavailable(_cached_error)
        why_not = syscalls.unavailable()
        if why_not is not None:
            _cached_error = f"the sandbox's seccomp filter cannot be built: {why_not}"
            raise SandboxUnavailable(_cached_error)
        import tempfile

        staging = Path(tempfile.mkdtemp(prefix="klbook-grade-probe-"))
        reasons = []
        try:
            make_staging(staging)
            modes = ("root", "userns") if os.geteuid() == 0 else ("userns",)
            forced = os.environ.get(MODE_ENV)
            if forced:
                if forced not in ("root", "userns"):
                    raise SandboxUnavailable(f"{MODE_ENV}: must be 'root' or 'userns', got {forced!r}")
                modes = (forced,)
            for mode in modes:
                candidate = Backend(mode=mode, bwrap=bwrap, version=version, features=features)
                why = _trial(candidate, staging)
                if why is None:
                    _cached = candidate
                    return candidate
                reasons.append(f"{mode}: {why}")
        finally:
            remove_tree(staging)
        _cached_error = ("bubblewrap is installed but cannot build a sandbox here ("
                         + "; ".join(reasons) + "). It needs unprivileged user namespaces "
                         "(sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also "
                         "kernel.apparmor_restrict_unprivileged_userns=0) or running as root "
                         "outside a restricted container")
        raise SandboxUnavailable(_cached_error)


def fresh_uid() -> int:
    """An unused-looking user id for one run (root mode): its processes are counted alone."""
    return 0x40000000 + secrets.randbelow(0x3FFF0000)


def plan_limits(limits: Limits, total_seconds: float) -> dict:
    cpu = limits.cpu_seconds or int(total_seconds) + 10
    return {"memory": limits.memory_bytes, "processes": limits.processes, "cpu": cpu,
            "file": limits.file_bytes, "open_files": limits.open_files}


# ---------------------------------------------------------------- clean-up
def remove_tree(path: str | os.PathLike) -> None:
    """Delete a directory tree of any depth without recursion, fixing permissions on the way.

    Never follows symbolic links; works with directory file descriptors so that a tree
    thousands of levels deep (deeper than ``PATH_MAX``) is removed too.
    """
    path = os.fspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    parent_fd = os.open(os.path.dirname(os.path.abspath(path)) or "/", os.O_RDONLY | os.O_DIRECTORY)
    name = os.path.basename(os.path.abspath(path))
    try:
        _remove_entry(parent_fd, name)
    finally:
        os.close(parent_fd)


def _open_dir(parent_fd: int, name: str) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=parent_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=parent_fd, follow_symlinks=False)
        return os.open(name, flags, dir_fd=parent_fd)


def _remove_entry(parent_fd: int, name: str) -> None:
    """Empty and remove one directory, depth first, with an explicit stack of names (no
    recursion) and one directory descriptor at a time (going up through ``..``)."""
    fd = _open_dir(parent_fd, name)
    names = [name]                     # the path from ``name`` down to the current directory
    pending: list = [None]             # at each level, the entries still to remove
    try:
        while True:
            if pending[-1] is None:
                os.fchmod(fd, 0o700)
                with os.scandir(fd) as it:
                    pending[-1] = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
            entries = pending[-1]
            descended = False
            while entries:
                entry, is_dir = entries.pop()
                if not is_dir:
                    os.unlink(entry, dir_fd=fd)
                    continue
                child = _open_dir(fd, entry)
                os.close(fd)
                fd = child
                names.append(entry)
                pending.append(None)
                descended = True
                break
            if descended:
                continue
            if len(names) == 1:
                break
            parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
            pending.pop()
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)
