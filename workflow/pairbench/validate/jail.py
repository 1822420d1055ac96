"""The kernel half of the sandbox: a private filesystem view and an unprivileged user, set up inside
the namespaces that ``unshare`` made, before any model-written code exists in the process.

Stdlib only, like :mod:`pairbench.validate.runner`, which loads it by path as it starts (``python -I
-S`` puts nothing of pairbench on the path). It runs in two places of the sandbox child:

- :func:`enter` in the monitor, PID 1 of the sandbox's PID namespace, still root there: a tmpfs as
  the new root, holding read-only bind mounts of what Python needs (the system's ``/usr`` and
  ``/lib*``, the Python installation, the dynamic loader's cache) and one writable directory,
  ``/sandbox`` (the temp dir's ``work/``), then ``pivot_root`` into it and the old root detached. The
  harness's files, ``/proc``, ``/tmp``, ``$HOME`` and every other sandbox's directory are not in
  that view at all; the new root itself is read-only. After nsjail's and bubblewrap's
  construction of a root (``--ro-bind``, ``--tmpfs``, ``pivot_root``).
- :func:`drop` in the worker (the process that runs the candidate): the unprivileged user (``nobody``
  when the harness runs as root; in a user namespace, the harness's own user, with every capability
  dropped and locked away), no new privileges, and the resource limits, which Linux enforces for
  every user but root (``RLIMIT_NPROC`` = 0: no process, no thread).

Each call raises OSError naming the step that failed; the caller refuses to run the candidate then.
"""

from __future__ import annotations

import ctypes
import os
import sys

#: Where the worker's writable directory is inside the sandbox (its cwd, HOME and TMPDIR).
SANDBOX_DIR = "/sandbox"

# <sys/mount.h>
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
# statvfs f_flag bits that a remount inside a user namespace must keep (the kernel locks them)
_LOCKED_FLAGS = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                 (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))
SYS_PIVOT_ROOT, SYS_CAPSET = 155, 126
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECUREBITS, PR_CAPBSET_DROP = 1, 38, 28, 24
# SECBIT_NOROOT | _LOCKED, NO_SETUID_FIXUP | _LOCKED, KEEP_CAPS_LOCKED, NO_CAP_AMBIENT_RAISE | _LOCKED
_SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80

#: System paths bound read-only into the sandbox's root when they exist (a symlink, as ``/lib64`` ->
#: ``usr/lib64`` on a merged-/usr system, is copied as the symlink it is).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache",
                "/etc/localtime")
#: Device nodes bound in (each a file bind of the host's node).
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")

_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    _check(_c().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {source or ''} on {target}")


def _locked_flags(path: str) -> int:
    flags = os.statvfs(path).f_flag
    return sum(ms for st, ms in _LOCKED_FLAGS if flags & st)


def bind(source: str, target: str, *, writable: bool = False) -> None:
    """Bind *source* at *target* (made to match: a directory or an empty file), read-only unless
    *writable*; never set-user-ID, never device files."""
    mount(source, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | _locked_flags(target) | (0 if writable else MS_RDONLY)
    mount(None, target, None, flags)


def python_paths() -> list[str]:
    """The Python installation this interpreter runs from (a venv's own prefix and its base)."""
    return sorted({os.path.abspath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)})


def _covered(path: str, bound: list[str]) -> bool:
    return any(path == b or path.startswith(b.rstrip("/") + "/") for b in bound)


def _place(newroot: str, path: str, bound: list[str]) -> None:
    """Make *path* of the host appear read-only at the same path under *newroot*."""
    if _covered(path, bound) or not os.path.lexists(path):
        return
    dest = newroot + path
    os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
    if os.path.islink(path) and os.path.dirname(path) == "/":
        os.symlink(os.readlink(path), dest)  # /lib64 -> usr/lib64 resolves inside the new root
        return
    if _covered(os.path.realpath(path), bound):
        return
    if os.path.isdir(path):
        os.makedirs(dest, mode=0o755, exist_ok=True)
    else:
        open(dest, "a").close()
    bind(path, dest)
    bound.append(path)


def enter(tmp: str, extra_ro: tuple[str, ...] = ()) -> list[str]:
    """Replace this process's root (in its own mount namespace) with a read-only tmpfs holding the
    system's and Python's files read-only and ``tmp/work`` writable at :data:`SANDBOX_DIR`; return
    the host paths bound read-only."""
    newroot, work = os.path.join(tmp, "root"), os.path.join(tmp, "work")
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    mount("tmpfs", newroot, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    bound: list[str] = []
    for path in (*SYSTEM_PATHS, *python_paths(), *extra_ro):
        _place(newroot, path, bound)
    os.makedirs(newroot + "/dev", mode=0o755, exist_ok=True)
    for dev in DEVICES:
        if os.path.exists(dev):
            open(newroot + dev, "a").close()
            mount(dev, newroot + dev, None, MS_BIND)
            mount(None, newroot + dev, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NOEXEC | _locked_flags(newroot + dev))
    os.makedirs(newroot + SANDBOX_DIR, mode=0o755)
    bind(work, newroot + SANDBOX_DIR, writable=True)
    old = newroot + "/.old-root"
    os.mkdir(old, 0o700)
    _check(_c().syscall(SYS_PIVOT_ROOT, os.fsencode(newroot), os.fsencode(old)), "pivot_root")
    os.chdir("/")
    _check(_c().umount2(b"/.old-root", MNT_DETACH), "umount the old root")
    os.rmdir("/.old-root")
    mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | _locked_flags("/"))
    os.chdir(SANDBOX_DIR)
    return bound


def _drop_capabilities() -> None:
    """Every capability gone for good (uid 0 inside a user namespace): the bounding set emptied, the
    securebits that give root its capabilities back on exec locked off, then capset(0)."""
    libc = _c()
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            _check(-1, f"drop capability {cap} from the bounding set")
    _check(libc.prctl(PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0), "lock the securebits")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all zero
    _check(libc.syscall(SYS_CAPSET, header, data), "capset")


def drop(uid: int | None, gid: int | None) -> None:
    """Become *uid*:*gid* with no supplementary groups (root: its capabilities go with it), or, with
    None (a user namespace's root, the harness's own user outside), drop every capability; then no
    new privileges ever, and death with the monitor."""
    libc = _c()
    if uid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if 0 in os.getresuid() or 0 in os.getresgid():
            raise OSError(f"still root after setresuid({uid})")
    else:
        _drop_capabilities()
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    # a credential change clears the parent-death signal; the monitor's death must still end us
    _check(libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != 1:  # the monitor (PID 1 here) is already gone
        os._exit(70)


def limit(cpu_s: int, mem_bytes: int, fsize_bytes: int, *, nproc: bool = True) -> None:
    """The worker's resource limits (set by itself, before the candidate exists): CPU seconds
    (SIGXCPU, then SIGKILL a second later), address space, file size, no core, and (unless a test
    says *nproc* False) no new process or thread."""
    import resource

    for name, soft, hard in (("RLIMIT_CPU", cpu_s, cpu_s + 1), ("RLIMIT_AS", mem_bytes, mem_bytes),
                             ("RLIMIT_FSIZE", fsize_bytes, fsize_bytes), ("RLIMIT_CORE", 0, 0),
                             *((("RLIMIT_NPROC", 0, 0),) if nproc else ())):
        which = getattr(resource, name)
        _, cur = resource.getrlimit(which)
        if cur != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur), min(hard, cur)
        resource.setrlimit(which, (soft, hard))
