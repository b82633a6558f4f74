"""Files that grant access: refused when every user may write or replace them, wherever on
their path (links followed) that is, and accepted below a directory others cannot enter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retrieval_host.access_files import writable_by_others


def _file(path: Path, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    path.chmod(mode)
    return path


def test_the_file_itself_and_every_directory_above_it_count(open_dir: Path) -> None:
    plain = _file(open_dir / "a" / "b" / "host.json")
    assert writable_by_others(plain) is None
    plain.chmod(0o666)
    assert "writable by every user (mode 0666)" in str(writable_by_others(plain))
    plain.chmod(0o644)
    (open_dir / "a").chmod(0o777)  # a grandparent: `b` can be renamed away and replaced
    assert f"directory {open_dir / 'a'} is writable" in str(writable_by_others(plain))
    (open_dir / "a").chmod(0o1777)
    assert writable_by_others(plain) is None


def test_what_other_users_cannot_reach_is_theirs_to_touch_in_no_way(open_dir: Path) -> None:
    # The quickstart under umask 000 wrote host.json 0666 inside its 0700 state directory.
    private = open_dir / "state"
    kept = _file(private / "host.json", 0o666)
    private.chmod(0o700)
    assert writable_by_others(kept) is None
    private.chmod(0o755)
    assert writable_by_others(kept) is not None


def test_links_are_checked_where_they_are_and_where_they_lead(open_dir: Path) -> None:
    # A black-box test: a link in a 0777 directory to a safe file, a directory link there, and
    # a tokensFile link were accepted (anyone can point the link elsewhere).
    safe = _file(open_dir / "safe" / "host.json")
    shared = open_dir / "shared"
    shared.mkdir()
    (shared / "host.json").symlink_to(safe)
    (shared / "dir").symlink_to(safe.parent)
    shared.chmod(0o777)
    for path in (shared / "host.json", shared / "dir" / "host.json"):
        assert f"directory {shared} is writable" in str(writable_by_others(path)), path
    # A private link to a file others may replace: the target's path counts too.
    private = open_dir / "private"
    private.mkdir()
    (private / "host.json").symlink_to(shared / "target.json")
    shared.chmod(0o755)
    _file(shared / "target.json")
    shared.chmod(0o777)
    private.chmod(0o700)
    assert f"directory {shared} is writable" in str(writable_by_others(private / "host.json"))
    shared.chmod(0o755)
    assert writable_by_others(private / "host.json") is None
    assert writable_by_others(open_dir / "missing.json") is None  # reading it will say so


def test_dot_dot_after_a_link_leaves_the_directory_the_link_leads_to(open_dir: Path) -> None:
    # A second black-box test: `a/lnk/../tokens.json` collapsed as text named `a/tokens.json`
    # (missing: accepted), where the kernel read `evil/tokens.json`, in a 0777 directory.
    evil = open_dir / "evil"
    _file(evil / "tokens.json")
    (evil / "sub").mkdir()
    evil.chmod(0o777)
    (open_dir / "a").mkdir()
    (open_dir / "a" / "lnk").symlink_to(evil / "sub")
    why = writable_by_others(open_dir / "a" / "lnk" / ".." / "tokens.json")
    assert f"directory {evil} is writable" in str(why)
    evil.chmod(0o755)
    assert writable_by_others(open_dir / "a" / "lnk" / ".." / "tokens.json") is None


def test_a_read_only_file_system_cannot_be_written_whatever_its_modes(
    open_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Kubernetes mounts ConfigMap volumes read-only in directories of mode 0777: the shipped
    # deployment's host.json lies in one. (A read-only mount cannot be made in a test here, so
    # the file system's flags are what `os.statvfs` reports for it.)
    volume = open_dir / "config"
    mounted = _file(volume / "host.json")
    volume.chmod(0o777)
    assert writable_by_others(mounted) is not None
    real_statvfs = os.statvfs

    def statvfs(path: str | os.PathLike[str]) -> os.statvfs_result:
        found = real_statvfs(path)
        if Path(path) in (volume, mounted):
            flags = found.f_flag | os.ST_RDONLY
            return os.statvfs_result((*found[:8], flags, found.f_namemax))
        return found

    monkeypatch.setattr(os, "statvfs", statvfs)
    assert writable_by_others(mounted) is None
