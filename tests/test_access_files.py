"""Files that grant access: refused when every user may write or replace them, wherever on
their path (links followed) that is, and accepted below a directory others cannot enter."""

from __future__ import annotations

from pathlib import Path

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
