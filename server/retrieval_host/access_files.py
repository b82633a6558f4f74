"""Files that decide who may do what must not be writable by every user.

The configuration file (its `tokens`), a `tokensFile` and the example application's `aclFile`
grant access: whoever can write one can grant themselves every corpus (an ACL file is read
again as it changes, so at once). The store refuses group- or world-writable files
(`adapters.sqlite.files`); these were read whatever their mode (a black-box test started a host
with each at 0666).

Refused here, as OpenSSH's `StrictModes` does for its keys: a file that every user may write,
or one that every user may replace: some directory on its path (the path as given, every
symbolic link on it, and the path they lead to) is writable by every user without the sticky
bit (anyone could rename the directory below it, or the file, and put their own in its place).
What lies below a directory that other users cannot enter (no search bit for others, as a
0700 state directory) is out of their reach whatever its mode, and what lies on a file system
mounted read-only is trusted (Kubernetes mounts ConfigMap and Secret volumes so, in directories
of mode 0777): a read-only bind mount of a directory others may write on the machine that
holds it (`docker run -v dir:/etc/rh:ro`) is only as safe as that directory, which the host
cannot see. Group write is accepted:
Kubernetes mounts ConfigMaps and Secrets for the pod's group, and a group is the operator's to
choose.
"""

from __future__ import annotations

import os
import stat
from collections import deque
from pathlib import Path
from typing import Final

_MAX_LINKS: Final = 40  # as the kernel's own bound on links followed in one path


def shared_access_file(path: Path, what: str) -> str | None:
    """Why `path` (`what` names it) must not be used, or None: no other user may write or
    replace it, or it does not exist (reading it says so)."""
    why = writable_by_others(path)
    if why is None:
        return None
    return f"{what} {path} grants access, but {why}"


def writable_by_others(path: Path) -> str | None:
    """Why every user may write or replace `path` (None: they may not, or it does not exist)."""
    if os.name != "posix":
        return None
    try:
        return _walk(os.path.join(os.getcwd(), os.fspath(path)))
    except OSError:
        return None  # reading it says what is wrong


def _walk(given: str) -> str | None:
    """Each directory from `/` down to the file, the names of `given` taken as the kernel takes
    them: a symbolic link is followed where it stands, and `..` leaves the directory actually
    reached (`a/link/..` is the link target's parent; collapsed as text, it named another
    file than the one read, a black-box test). `reached` holds the real directories entered
    and whether other users can get inside each."""
    reached: list[tuple[str, bool]] = []
    names = deque(["/", *given.split("/")])
    links = 0
    while names:
        name = names.popleft()
        if name == "/":  # the root: from here (the start, or an absolute link's target)
            root = os.stat("/")
            reached = [("/", _enterable(root))]
            why = _shared_directory("/", root, True)
            if why is not None:
                return why
            continue
        if name in ("", "."):
            continue
        if name == "..":
            if len(reached) > 1:
                reached.pop()
            continue
        directory, reachable = reached[-1]
        entry = os.path.join(directory, name)
        st = os.lstat(entry)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise OSError("too many symbolic links")
            target = os.readlink(entry)
            names.extendleft(
                reversed(["/", *target.split("/")] if target[:1] == "/" else target.split("/"))
            )
            continue
        if stat.S_ISDIR(st.st_mode):
            why = _shared_directory(entry, st, reachable)
            if why is not None:
                return why
            reached.append((entry, reachable and _enterable(st)))
            continue
        if any(rest not in ("", ".") for rest in names):
            raise OSError("not a directory")  # a file with names after it: nothing to read
        if reachable and st.st_mode & stat.S_IWOTH and not _read_only(entry):
            return (
                f"it is writable by every user (mode {stat.S_IMODE(st.st_mode):04o}): chmod o-w "
                "it (0600 or 0644)"
            )
        return None
    return None


def _enterable(st: os.stat_result) -> bool:
    """Whether other users may enter the directory (its search bit for others)."""
    return bool(st.st_mode & stat.S_IXOTH)


def _shared_directory(path: str, st: os.stat_result, reachable: bool) -> str | None:
    if reachable and _replaceable(st, path):
        return (
            f"the directory {path} is writable by every user without the sticky bit "
            f"(mode {stat.S_IMODE(st.st_mode):04o}), so anyone could put another file in "
            "its place: chmod o-w (or +t) that directory"
        )
    return None


def _replaceable(st: os.stat_result, path: str | Path) -> bool:
    return (
        bool(st.st_mode & stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX and not _read_only(path)
    )


def _read_only(path: str | Path) -> bool:
    """On a file system mounted read-only, whatever the modes: Kubernetes mounts ConfigMap and
    Secret volumes read-only in directories of mode 0777 (a `host.json` there is safe)."""
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
