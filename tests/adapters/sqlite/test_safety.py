"""The SQLite store refuses database files, sidecars and directories others could tamper with.

Foreign ownership is simulated with chown, so these tests run as root (as the CI container
does); pytest's temporary directories (0700 under the root-owned sticky /tmp) pass the checks.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from retrieval_host.adapters.sqlite import SqliteRunStore, SqliteVectorStore
from retrieval_host.adapters.sqlite.files import own_groups
from retrieval_host.core.errors import ErrorCode, RetrievalError

OTHER_UID = 65534  # nobody


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def make_store(path: Path) -> Path:
    SqliteVectorStore.open(path).close()
    return path


def refused(path: Path, reason: str) -> RetrievalError:
    with pytest.raises(RetrievalError) as excinfo:
        SqliteVectorStore.open(path)
    assert excinfo.value.code is ErrorCode.UNSAFE_STORE, excinfo.value
    assert excinfo.value.reason == reason, excinfo.value
    return excinfo.value


def test_pytest_temporary_directories_pass_the_checks(tmp_path: Path) -> None:
    # The chain is tmp_path (0700) / pytest dirs (0700) / /tmp (root, sticky 1777) / "/".
    assert Path("/tmp") in tmp_path.parents
    with SqliteVectorStore.open(tmp_path / "store.db") as store:
        assert store.reclamation == "pending"  # index snapshots on: rewritten after a delete


def test_a_new_store_gets_a_private_directory_and_files(tmp_path: Path) -> None:
    current = os.umask(0o000)  # the most permissive umask: the modes are still private
    try:
        path = tmp_path / "data" / "store.db"
        with SqliteVectorStore.open(path):
            assert mode(path.parent) == 0o700
            assert mode(path) == 0o600
            for sidecar in ("store.db-wal", "store.db-shm"):
                assert mode(path.parent / sidecar) == 0o600
    finally:
        os.umask(current)


def test_a_missing_grandparent_directory_is_not_created(tmp_path: Path) -> None:
    with pytest.raises(RetrievalError) as excinfo:
        SqliteVectorStore.open(tmp_path / "a" / "b" / "store.db")
    assert excinfo.value.code is ErrorCode.STORE_UNAVAILABLE
    assert not (tmp_path / "a").exists()


def test_a_symlinked_database_is_refused(tmp_path: Path) -> None:
    real = make_store(tmp_path / "real.db")
    link = tmp_path / "link.db"
    link.symlink_to(real)
    error = refused(link, "symlink")
    assert str(link) in error.detail


def test_a_hard_linked_database_is_refused(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.db")
    os.link(path, tmp_path / "alias.db")
    refused(path, "hard-link")


@pytest.mark.parametrize("bits", [0o660, 0o602, 0o666])
def test_a_database_writable_by_others_is_refused(tmp_path: Path, bits: int) -> None:
    path = make_store(tmp_path / "store.db")
    path.chmod(bits)
    error = refused(path, "writable-by-others")
    assert oct(bits)[2:] in error.detail


def test_a_symlinked_wal_sidecar_is_refused(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.db")
    (tmp_path / "planted").write_bytes(b"")
    (tmp_path / "store.db-wal").symlink_to(tmp_path / "planted")
    error = refused(path, "symlink")
    assert "-wal" in error.detail


def test_a_shared_shm_sidecar_is_refused(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.db")
    shm = tmp_path / "store.db-shm"
    shm.write_bytes(b"")
    shm.chmod(0o666)
    error = refused(path, "writable-by-others")
    assert "-shm" in error.detail


def test_a_database_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.db")
    os.chown(path, OTHER_UID, -1)
    error = refused(path, "foreign-owner")
    assert str(OTHER_UID) in error.detail


def test_a_sidecar_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.db")
    wal = tmp_path / "store.db-wal"
    wal.write_bytes(b"")
    wal.chmod(0o600)
    os.chown(wal, OTHER_UID, -1)
    refused(path, "foreign-owner")


def test_a_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o700)
    os.chown(directory, OTHER_UID, -1)
    refused(directory / "store.db", "foreign-owner")


def test_an_ancestor_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    (tmp_path / "theirs" / "mine").mkdir(parents=True, mode=0o700)
    os.chown(tmp_path / "theirs", OTHER_UID, -1)
    error = refused(tmp_path / "theirs" / "mine" / "store.db", "foreign-owner")
    assert str(tmp_path / "theirs") in error.detail


@pytest.mark.parametrize("bits", [0o770, 0o707, 0o1777])
def test_a_database_directory_writable_by_others_is_refused(tmp_path: Path, bits: int) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(bits)  # sticky or not: others could create the sidecar names here
    refused(directory / "store.db", "writable-by-others")
    assert not (directory / "store.db").exists()


def test_a_world_writable_ancestor_is_refused_unless_sticky_and_root_owned(
    tmp_path: Path,
) -> None:
    ancestor = tmp_path / "shared"
    (ancestor / "private").mkdir(parents=True, mode=0o700)
    ancestor.chmod(0o777)
    refused(ancestor / "private" / "store.db", "writable-by-others")

    ancestor.chmod(0o1777)  # like /tmp: others cannot rename "private" away
    assert os.lstat(ancestor).st_uid == 0
    SqliteVectorStore.open(ancestor / "private" / "store.db").close()

    os.chown(ancestor, OTHER_UID, -1)  # sticky but owned by someone else
    refused(ancestor / "private" / "store.db", "foreign-owner")


def test_a_symlinked_directory_is_resolved_and_its_target_checked(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    (tmp_path / "alias").symlink_to(target)
    SqliteVectorStore.open(tmp_path / "alias" / "store.db").close()
    assert (target / "store.db").is_file()

    target.chmod(0o770)
    refused(tmp_path / "alias" / "store.db", "writable-by-others")


# --- a volume provisioned for the host's group (fsGroup, OpenShift's gid 0) ----------------

OTHER_GID = 65534  # nogroup


def fs_group_volume(tmp_path: Path, gid: int) -> Path:
    """A directory as kubelet provisions an `fsGroup` volume: setgid, group-writable."""
    volume = tmp_path / "volume"
    volume.mkdir()
    os.chown(volume, -1, gid)
    volume.chmod(0o2770)
    return volume


def test_a_volume_writable_by_the_hosts_own_group_is_accepted_when_trusted(
    tmp_path: Path,
) -> None:
    own = own_groups()
    assert os.getegid() in own
    volume = fs_group_volume(tmp_path, os.getegid())
    refused(volume / "store.db", "writable-by-others")  # not trusted: the rule as before

    with SqliteVectorStore.open(volume / "store.db", trusted_groups=own) as store:
        assert store.reclamation == "pending"  # index snapshots on: rewritten after a delete
    # kubelet's `fsGroupChangePolicy: Always` makes the files group-writable at each mount.
    for name in ("store.db", "store.db-wal", "store.db-shm"):
        if (volume / name).exists():
            (volume / name).chmod(0o660)
    SqliteVectorStore.open(volume / "store.db", trusted_groups=own).close()
    SqliteRunStore.open(volume / "runs.db", trusted_groups=own).close()
    assert mode(volume / "runs.db") == 0o600  # what the host creates stays private


def test_another_group_or_others_writing_is_refused_even_when_trusted(tmp_path: Path) -> None:
    own = own_groups()
    assert OTHER_GID not in own
    volume = fs_group_volume(tmp_path, OTHER_GID)
    with pytest.raises(RetrievalError) as excinfo:
        SqliteVectorStore.open(volume / "store.db", trusted_groups=own)
    assert excinfo.value.reason == "writable-by-others"
    assert str(OTHER_GID) in excinfo.value.detail

    (tmp_path / "x").mkdir()
    mine = fs_group_volume(tmp_path / "x", os.getegid())
    mine.chmod(0o2777)  # others too
    with pytest.raises(RetrievalError) as excinfo:
        SqliteVectorStore.open(mine / "store.db", trusted_groups=own)
    assert excinfo.value.reason == "writable-by-others"

    path = make_store(tmp_path / "private" / "store.db")
    path.chmod(0o606)  # a file writable by others
    with pytest.raises(RetrievalError) as excinfo:
        SqliteVectorStore.open(path, trusted_groups=own)
    assert excinfo.value.reason == "writable-by-others"
