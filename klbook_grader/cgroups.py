"""A cgroup per sandbox: the memory, processes and CPU of the whole sandbox, not of each process.

``RLIMIT_AS`` and ``RLIMIT_NPROC`` bound each process; what a notebook holds in total (many
processes, pages of the tmpfs, file descriptors of shared memory) and how much CPU it takes
from a neighbour graded beside it (``--jobs N``) only a cgroup bounds. Each sandbox run gets
its own group below ``klbook-grade/``, with

``memory``  a hard limit on everything charged to the group (anonymous memory, the tmpfs
            and shared-memory pages it writes, page cache): over it, the kernel's OOM killer
            ends a process *of the group* (v1 ``memory.limit_in_bytes`` and, with swap
            accounting, ``memory.memsw.limit_in_bytes``; v2 ``memory.max``, ``memory.swap.max``);
``pids``    the number of processes and threads of the group (``pids.max``);
``cpu``     one CPU at most (``cpu.cfs_quota_us`` / v2 ``cpu.max``) and an equal share with
            every other sandbox (``cpu.shares`` / ``cpu.weight``), however many processes it
            starts.

The sandbox enters its group before bubblewrap starts (a small ``sh`` wrapper writes its own
process id into the group's ``cgroup.procs`` and then ``exec``\\ s bwrap), so every process of
the sandbox is in it from the first instruction; the sandbox sees no ``/sys`` and cannot
leave it.

Which cgroups the machine offers is decided once per process by :func:`support`:

* **v1** (this book's development machine): the ``memory``, ``pids`` and ``cpu``
  hierarchies mounted under ``/sys/fs/cgroup/`` and writable (as root);
* **v2**: a unified hierarchy at ``/sys/fs/cgroup`` whose ``memory``, ``pids`` and ``cpu``
  controllers can be enabled below the grader's own group (root, or a delegated group named
  by ``KLBOOK_CGROUP``, e.g. one that ``systemd-run --user -p Delegate=yes`` made);
* otherwise **none**, with the reason: grading still works, the result's ``isolation``
  says so, and ``--jobs`` above 1 is refused. ``KLBOOK_CGROUP=none`` forces this.
"""
from __future__ import annotations

import errno
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ENV = "KLBOOK_CGROUP"          # "none": no cgroups; a directory: the v2 group to work below
ROOT = Path("/sys/fs/cgroup")
GROUP = "klbook-grade"
CONTROLLERS = ("memory", "pids", "cpu")
EXTRA_PROCESSES = 8            # bubblewrap's own processes, on top of Limits.processes
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Support:
    """What this machine offers: ``version`` 1 or 2, or ``None`` with ``reason``.

    ``parents`` are the directories (one per controller for v1, one for v2) below which each
    sandbox's group is made."""

    version: int | None
    parents: tuple = ()
    reason: str = ""
    controllers: tuple = field(default=CONTROLLERS)

    @property
    def available(self) -> bool:
        return self.version is not None

    def describe(self) -> str:
        if self.version is None:
            return (f"NO cgroups ({self.reason}): memory, processes and CPU are limited per "
                    "process only, not per sandbox")
        return f"cgroup v{self.version} per sandbox (memory, processes, CPU)"


class Cgroup:
    """One sandbox run's group; :meth:`wrap` prefixes a command so that it starts inside it,
    :meth:`remove` deletes it once the sandbox is gone, :meth:`out_of_memory` tells whether
    the kernel killed a process of it for memory."""

    def __init__(self, support: Support, memory_bytes: int, processes: int, cpus: float = 1.0) -> None:
        if not support.available:
            raise ValueError(f"support: no cgroups here ({support.reason})")
        self.support = support
        name = f"run-{os.getpid()}-{secrets.token_hex(6)}"
        self.dirs = [Path(p) / name for p in support.parents]
        made: list[Path] = []
        try:
            for d in self.dirs:
                _make_group(d, parents=support.version == 1)
                made.append(d)
            self._configure(int(memory_bytes), int(processes) + EXTRA_PROCESSES, float(cpus))
        except OSError:
            for d in made:
                _rmdir(d)
            raise

    def _write(self, d: Path, name: str, value: str, optional: bool = False) -> None:
        try:
            (d / name).write_text(value)
        except FileNotFoundError:
            if not optional:
                raise
        except OSError:
            if not optional:
                raise

    def _configure(self, memory: int, pids: int, cpus: float) -> None:
        quota = max(1000, int(CPU_PERIOD_US * cpus))
        if self.support.version == 2:
            d = self.dirs[0]
            self._write(d, "memory.max", str(memory))
            self._write(d, "memory.swap.max", "0", optional=True)
            self._write(d, "pids.max", str(pids))
            self._write(d, "cpu.max", f"{quota} {CPU_PERIOD_US}")
            self._write(d, "cpu.weight", "100", optional=True)
            return
        for d, ctl in zip(self.dirs, self.support.controllers):
            if ctl == "memory":
                self._write(d, "memory.limit_in_bytes", str(memory))
                self._write(d, "memory.memsw.limit_in_bytes", str(memory), optional=True)
            elif ctl == "pids":
                self._write(d, "pids.max", str(pids))
            elif ctl == "cpu":
                self._write(d, "cpu.shares", "1024", optional=True)
                self._write(d, "cpu.cfs_period_us", str(CPU_PERIOD_US))
                self._write(d, "cpu.cfs_quota_us", str(quota))

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` started inside this group: ``sh`` writes its own process id into every
        ``cgroup.procs`` (failing if it cannot), then becomes ``cmd``."""
        script = ('while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; '
                  'exec "$@"')
        return ["/bin/sh", "-c", script, "klbook-cgroup",
                *[str(d / "cgroup.procs") for d in self.dirs], "--", *cmd]

    def out_of_memory(self) -> bool:
        """Did the kernel kill a process of this group for going over its memory limit?"""
        for d, ctl in zip(self.dirs, self.support.controllers if self.support.version == 1
                          else ("memory",)):
            if ctl != "memory":
                continue
            for name in ("memory.events", "memory.oom_control"):
                try:
                    text = (d / name).read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                        return True
        return False

    def remove(self, wait: float = 5.0) -> None:
        """Delete the group (its processes are gone with the sandbox; wait for the kernel
        to finish reaping them, and kill what is left if need be)."""
        deadline = time.monotonic() + wait
        for d in self.dirs:
            while d.exists():
                try:
                    d.rmdir()
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        _kill_members(d)
                        if time.monotonic() > deadline + 2:
                            break
                    time.sleep(0.02)
        if self.support.version == 1:          # v1 needs nothing of klbook-grade/: leave no
            for d in self.dirs:                # empty folder in the machine's hierarchy
                _rmdir(d.parent)


def _kill_members(d: Path) -> None:
    import signal

    try:
        (d / "cgroup.kill").write_text("1")          # v2, Linux 5.14+
        return
    except OSError:
        pass
    try:
        pids = [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _make_group(d: Path, parents: bool, tries: int = 50) -> None:
    """``mkdir d``; with ``parents`` (v1), make ``klbook-grade/`` again if need be. Another
    grader's :meth:`Cgroup.remove` may delete an empty ``klbook-grade/`` between the
    parent's ``mkdir`` and the child's (measured: 2 % of runs when three graders start and
    end groups at once), so that ``FileNotFoundError`` is retried; once ``d`` exists, its
    parent can no longer be removed."""
    for attempt in range(tries):
        try:
            os.mkdir(d, 0o755)
            return
        except FileNotFoundError:
            if not parents or attempt == tries - 1:
                raise
        try:                         # not Path.mkdir(exist_ok=True): it re-checks is_dir()
            os.mkdir(d.parent, 0o755)   # and raises if the folder is gone again by then
        except FileExistsError:
            pass


def _rmdir(d: Path) -> None:
    try:
        d.rmdir()
    except OSError:
        pass


# ---------------------------------------------------------------- what the machine offers
def _own_paths() -> dict:
    """``/proc/self/cgroup``: controller (or "" for v2) -> this process's group path."""
    out = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for ctl in (parts[1].split(",") if parts[1] else [""]):
            out[ctl] = parts[2]
    return out


def _mounts() -> list[tuple[str, str, str, set]]:
    """(mount point, root in the hierarchy, type, super options) of cgroup file systems."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) >= 5 and len(r) >= 3 and r[0] in ("cgroup", "cgroup2"):
            out.append((f[4], f[3], r[0], set(r[2].split(","))))
    return out


def _writable(d: Path) -> bool:
    return d.is_dir() and os.access(d, os.W_OK | os.X_OK)


def _parent_below(base: Path) -> Path:
    """``base/klbook-grade``, made if need be."""
    p = base / GROUP
    p.mkdir(mode=0o755, exist_ok=True)
    return p


def _trial(s: Support) -> str | None:
    """Make and remove one group with the limits set; ``None`` if it works, else why not."""
    try:
        Cgroup(s, 64 << 20, 8).remove()
    except OSError as exc:
        return f"{exc.strerror or exc} ({getattr(exc, 'filename', '') or ''})".strip()
    return None


def _detect_v1() -> Support | str:
    own = _own_paths()
    parents = []
    for ctl in CONTROLLERS:
        mount = next((m for m in _mounts() if m[2] == "cgroup" and ctl in m[3]), None)
        if mount is None:
            return f"no cgroup v1 '{ctl}' hierarchy is mounted"
        point, root, _, _ = mount
        rel = own.get(ctl, "/")
        rel = rel[len(root):] if root != "/" and rel.startswith(root) else rel
        base = Path(point) / rel.lstrip("/")
        if not _writable(base):
            base = Path(point)
        if not _writable(base):
            return f"{base} is not writable (cgroups need root or a delegated hierarchy)"
        try:
            parents.append(str(_parent_below(base)))
        except OSError as exc:
            return f"cannot create {base / GROUP}: {exc.strerror or exc}"
    return Support(version=1, parents=tuple(parents))


def _enable(d: Path, controllers) -> None:
    have = set((d / "cgroup.subtree_control").read_text().split())
    missing = [c for c in controllers if c not in have]
    if missing:
        (d / "cgroup.subtree_control").write_text(" ".join("+" + c for c in missing))


def _detect_v2(base: Path | None = None) -> Support | str:
    if base is None:
        mount = next((m for m in _mounts() if m[2] == "cgroup2" and m[0] == str(ROOT)), None)
        if mount is None:
            return "no cgroup v2 hierarchy at /sys/fs/cgroup"
        base = ROOT / _own_paths().get("", "/").lstrip("/")
    try:
        available = set((base / "cgroup.controllers").read_text().split())
    except OSError as exc:
        return f"cannot read {base / 'cgroup.controllers'}: {exc.strerror or exc}"
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        return f"the cgroup v2 controllers {', '.join(missing)} are not available in {base}"
    try:
        _enable(base, CONTROLLERS)         # fails in a group that holds processes (not root)
        parent = _parent_below(base)
        _enable(parent, CONTROLLERS)
    except OSError as exc:
        return (f"cannot enable the memory, pids and cpu controllers below {base} "
                f"({exc.strerror or exc}); run as root, or name a delegated group in {ENV}")
    return Support(version=2, parents=(str(parent),))


_lock = threading.Lock()
_cached: Support | None = None


def detect() -> Support:
    """Find out, without caching, which cgroups this process can give its sandboxes."""
    forced = os.environ.get(ENV, "")
    if forced.lower() == "none":
        return Support(version=None, reason=f"switched off by {ENV}=none")
    if forced:
        found = _detect_v2(Path(forced))
    elif (ROOT / "cgroup.controllers").is_file():          # unified hierarchy (v2 only)
        found = _detect_v2()
    else:
        found = _detect_v1()
        if isinstance(found, str):
            v2 = _detect_v2()
            found = v2 if isinstance(v2, Support) else found
    if isinstance(found, str):
        return Support(version=None, reason=found)
    why = _trial(found)
    if why is not None:
        return Support(version=None, reason=f"cgroup v{found.version} is there but a group "
                                            f"cannot be set up: {why}")
    return found


def support() -> Support:
    """:func:`detect`, once per process."""
    global _cached
    with _lock:
        if _cached is None:
            _cached = detect()
        return _cached
