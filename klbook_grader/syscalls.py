"""The sandbox's seccomp filter: the system calls a notebook being graded may not make.

bubblewrap loads the filter (``bwrap --seccomp FD``) into the sandbox's first process just
before it starts the runner, so that it holds for every process of the sandbox, the
runner's own start-up included, and cannot be removed. The program is built with libseccomp
through its ``pyseccomp`` binding (pinned in ``requirements.txt``; the library itself is
Debian's ``libseccomp2``, ``tools/ensure_seccomp.sh``). Everything is allowed except:

* the **kernel keyrings**: ``add_key``, ``request_key`` and ``keyctl`` (every operation but
  joining a fresh anonymous session keyring, which the runner does first: a second line
  behind the filter);
* **new namespaces and mounts**: ``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*``
  flag, ``clone3`` (answered ``ENOSYS``, so that the C library falls back to ``clone``,
  whose flags the filter can read), ``mount``, ``umount2``, ``pivot_root``, ``chroot`` and
  the new mount API (``fsopen``, ``fsmount``, ``move_mount``, ``open_tree``...);
* **looking into other processes**: ``ptrace``, ``process_vm_readv``/``writev``,
  ``pidfd_getfd``, ``kcmp``, ``perf_event_open``;
* **memory outside the limits**: ``memfd_create`` and ``memfd_secret`` (pages held by a file
  descriptor count against no ``RLIMIT_AS``), ``userfaultfd``;
* **the kernel itself**: ``bpf``, ``io_uring_*``, module loading, ``kexec_*``, ``reboot``,
  ``swapon``/``swapoff``, ``acct``, ``quotactl``, the clocks (``settimeofday``,
  ``clock_settime``, ``adjtimex``, ``clock_adjtime``), ``syslog``, ``iopl``/``ioperm``,
  ``open_by_handle_at``/``name_to_handle_at``, ``lookup_dcookie``, ``uselib``, ``vhangup``
  and the obsolete calls that Docker's default profile also refuses.

A refused call fails with ``EPERM`` (``clone3``: ``ENOSYS``); a call of another architecture
(a 32-bit ``int 0x80`` on x86-64) kills the process (libseccomp's default). :func:`program`
returns the BPF program, built once per process; :func:`unavailable` says why it cannot be
built on this machine, or ``None``.
"""
from __future__ import annotations

import errno
import os
import threading

# (system call, why) refused with EPERM; names unknown on this architecture are skipped
DENIED: tuple[tuple[str, str], ...] = (
    ("add_key", "keyring"), ("request_key", "keyring"),
    ("unshare", "namespaces"), ("setns", "namespaces"), ("mount", "mounts"), ("umount2", "mounts"),
    ("pivot_root", "mounts"), ("chroot", "mounts"), ("fsopen", "mounts"), ("fsconfig", "mounts"),
    ("fsmount", "mounts"), ("fspick", "mounts"), ("move_mount", "mounts"), ("open_tree", "mounts"),
    ("mount_setattr", "mounts"),
    ("ptrace", "other processes"), ("process_vm_readv", "other processes"),
    ("process_vm_writev", "other processes"), ("pidfd_getfd", "other processes"),
    ("kcmp", "other processes"), ("perf_event_open", "other processes"),
    ("memfd_create", "memory"), ("memfd_secret", "memory"), ("userfaultfd", "memory"),
    ("bpf", "kernel"), ("io_uring_setup", "kernel"), ("io_uring_enter", "kernel"),
    ("io_uring_register", "kernel"), ("init_module", "kernel"), ("finit_module", "kernel"),
    ("delete_module", "kernel"), ("create_module", "kernel"), ("query_module", "kernel"),
    ("get_kernel_syms", "kernel"), ("kexec_load", "kernel"), ("kexec_file_load", "kernel"),
    ("reboot", "kernel"), ("swapon", "kernel"), ("swapoff", "kernel"), ("acct", "kernel"),
    ("quotactl", "kernel"), ("quotactl_fd", "kernel"), ("settimeofday", "kernel"),
    ("clock_settime", "kernel"), ("adjtimex", "kernel"), ("clock_adjtime", "kernel"),
    ("syslog", "kernel"), ("iopl", "kernel"), ("ioperm", "kernel"),
    ("open_by_handle_at", "kernel"), ("name_to_handle_at", "kernel"), ("lookup_dcookie", "kernel"),
    ("uselib", "kernel"), ("vhangup", "kernel"), ("nfsservctl", "kernel"), ("_sysctl", "kernel"),
    ("sysfs", "kernel"), ("ustat", "kernel"), ("vm86", "kernel"), ("vm86old", "kernel"),
    ("fanotify_init", "kernel"),
)
KEYCTL_JOIN_SESSION_KEYRING = 1
CLONE_NAMESPACE_FLAGS = (0x00000080, 0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000,
                         0x20000000, 0x40000000)   # NEWTIME NEWNS NEWCGROUP NEWUTS NEWIPC NEWUSER NEWPID NEWNET
# socket families a notebook may create (issue 36: an allow-list): AF_UNIX, AF_INET, AF_INET6;
# socket() and socketpair() with any other family (netlink, packet, vsock, bluetooth...) fail
SOCKET_FAMILIES = (1, 2, 10)
INSTALL_HINT = ("install the pinned requirements (`pyseccomp` in requirements.txt) and libseccomp "
                "(Debian/Ubuntu: `sudo apt-get install libseccomp2`, or `bash tools/ensure_seccomp.sh`)")

_lock = threading.Lock()
_program: bytes | None = None
_error: str | None = None


def _build() -> bytes:
    import tempfile

    import pyseccomp as sc

    f = sc.SyscallFilter(defaction=sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)

    def rule(action: int, name: str, *args) -> None:
        try:
            f.add_rule(action, name, *args)
        except (OSError, ValueError, RuntimeError):
            pass                                  # no such call on this architecture

    for name, _why in DENIED:
        rule(eperm, name)
    # keyctl: only KEYCTL_JOIN_SESSION_KEYRING with no name (a fresh anonymous keyring)
    rule(eperm, "keyctl", sc.Arg(0, sc.NE, KEYCTL_JOIN_SESSION_KEYRING))
    rule(eperm, "keyctl", sc.Arg(1, sc.NE, 0))
    for flag in CLONE_NAMESPACE_FLAGS:
        rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    rule(sc.ERRNO(errno.ENOSYS), "clone3")
    top = max(SOCKET_FAMILIES)
    for name in ("socket", "socketpair"):
        rule(eperm, name, sc.Arg(0, sc.GT, top))                 # every family above AF_INET6
        for family in range(top):
            if family not in SOCKET_FAMILIES:
                rule(eperm, name, sc.Arg(0, sc.EQ, family))
    with tempfile.TemporaryFile() as fh:
        f.export_bpf(fh)
        fh.seek(0)
        return fh.read()


def _load() -> None:
    global _program, _error
    with _lock:
        if _program is not None or _error is not None:
            return
        try:
            _program = _build()
        except ImportError as exc:
            _error = f"no seccomp binding ({exc}): {INSTALL_HINT}"
        except (OSError, AttributeError, RuntimeError, ValueError) as exc:
            _error = f"libseccomp cannot build the filter ({type(exc).__name__}: {exc}): {INSTALL_HINT}"
        if _program is not None and not _program:
            _program, _error = None, f"libseccomp built an empty filter: {INSTALL_HINT}"


def unavailable() -> str | None:
    """Why the filter cannot be built here (no binding, no libseccomp), or ``None``."""
    _load()
    return _error


def program() -> bytes:
    """The filter as a BPF program (``struct sock_filter`` array), for ``bwrap --seccomp``."""
    _load()
    if _program is None:
        raise RuntimeError(_error or "no seccomp filter")
    return _program


def program_fd() -> int:
    """A pipe's read end holding the program, to pass to ``bwrap --seccomp FD`` (which reads
    it to the end); the caller closes it once bwrap has started."""
    data = program()
    r, w = os.pipe()
    try:
        if len(data) > 60_000:                   # a pipe holds 64 KiB without a reader
            raise RuntimeError("the seccomp program is too large for a pipe")
        os.write(w, data)
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return r


def keyctl_number() -> int | None:
    """The number of the ``keyctl`` system call on this machine (the runner joins a fresh
    session keyring with it), or ``None`` if it cannot be told."""
    try:
        import pyseccomp as sc

        return int(sc.resolve_syscall(sc.system_arch(), "keyctl"))
    except Exception:  # noqa: BLE001 - no binding: the runner skips the second line
        return None
