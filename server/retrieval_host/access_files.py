"""Files that decide who may do what must not be writable by every user.

The configuration file (its `tokens`), a `tokensFile` and the example application's `aclFile`
grant access: whoever can write one can grant themselves every corpus (an ACL file is read
again as it changes, so at once). The store refuses group- or world-writable files
(`adapters.sqlite.files`); these were read whatever their mode (a black-box test started a host
with each at 0666). Refused here: a file writable by others, or one in a directory writable by
others without the sticky bit (anyone could put another file in its place). Group write is
accepted: Kubernetes mounts ConfigMaps and Secrets for the pod's group, and a group is the
operator's to choose. Links are followed (ConfigMaps are links to their current version); the
file reached is checked, and its directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def shared_access_file(path: Path, what: str) -> str | None:
    """Why `path` (`what` names it) must not be used, or None: it may not be written by any
    user, or it does not exist (reading it says so)."""
    why = writable_by_others(path)
    if why is None:
        return None
    return f"{what} {path} grants access, but {why}; make it 0600 or 0644"


def writable_by_others(path: Path) -> str | None:
    """Why `path` may be written by any user (None: it may not, or it does not exist)."""
    if os.name != "posix":
        return None
    try:
        real = path.resolve(strict=True)
        st = os.stat(real)
        parent = os.stat(real.parent)
    except OSError:
        return None  # reading it says what is wrong
    if st.st_mode & stat.S_IWOTH:
        return f"it is writable by every user (mode {stat.S_IMODE(st.st_mode):04o})"
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        return (
            f"its directory {real.parent} is writable by every user without the sticky bit "
            f"(mode {stat.S_IMODE(parent.st_mode):04o}), so anyone could replace it"
        )
    return None
