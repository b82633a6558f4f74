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
0700 state directory) is out of their reach whatever its mode, and so is what lies on a file
system mounted read-only (Kubernetes mounts ConfigMap and Secret volumes so, in directories of
mode 0777). Group write is accepted:
Kubernetes mounts ConfigMaps and Secrets for the pod's group, and a group is the operator's to
choose.
"""

from __future__ import annotations

import os
import stat
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
        return _walk(Path(os.path.abspath(path)), 0)
    except OSError:
        return None  # reading it says what is wrong


def _walk(path: Path, links: int) -> str | None:
    """Each directory from `/` down to `path`, following symbolic links where they are (each
    link's own directory checked before its target's path is)."""
    if links > _MAX_LINKS:
        raise OSError("too many symbolic links")
    current = Path(path.anchor)
    reachable = True  # whether other users can still get here
    for name in path.parts[1:]:
        st = os.stat(current)
        if reachable and _replaceable(st, current):
            return (
                f"the directory {current} is writable by every user without the sticky bit "
                f"(mode {stat.S_IMODE(st.st_mode):04o}), so anyone could put another file in "
                "its place: chmod o-w (or +t) that directory"
            )
        if not st.st_mode & stat.S_IXOTH:
            reachable = False  # others cannot enter it: nothing below is theirs to touch
        following = current / name
        if stat.S_ISLNK(os.lstat(following).st_mode):
            target = Path(os.path.join(current, os.readlink(following)))
            rest = path.parts[len(following.parts) :]
            # The link is checked where it is (above); what it leads to, wherever that is.
            return _walk(Path(os.path.normpath(target.joinpath(*rest))), links + 1)
        current = following
    st = os.stat(current)
    if reachable and st.st_mode & stat.S_IWOTH and not _read_only(current):
        return (
            f"it is writable by every user (mode {stat.S_IMODE(st.st_mode):04o}): chmod o-w it "
            "(0600 or 0644)"
        )
    return None


def _replaceable(st: os.stat_result, path: Path) -> bool:
    return (
        bool(st.st_mode & stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX and not _read_only(path)
    )


def _read_only(path: Path) -> bool:
    """On a file system mounted read-only, whatever the modes: Kubernetes mounts ConfigMap and
    Secret volumes read-only in directories of mode 0777 (a `host.json` there is safe)."""
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
