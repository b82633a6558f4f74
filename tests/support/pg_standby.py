"""A streaming-replication hot standby of a test PostgreSQL, for the read-only store tests.

`copyable_primary()` yields a server whose data directory is on this machine: the session's
(`tests.support.pg`), or, when that one is external (`RETRIEVAL_HOST_TEST_PG_DSN`), a private
one started for the block. `hot_standby(primary)` copies it with `pg_basebackup -R -X stream`,
run as the service user that `scripts/pg` runs the server as, starts the copy with
`scripts/pg start` on a free port and yields it once it answers in recovery; the block's end
stops it (`scripts/pg stop`) and deletes its directory.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support.pg import (
    SCRIPT,
    START_TIMEOUT_S,
    PgServer,
    connect,
    shared_server,
    start_private_server,
    wait_ready,
)
from tests.support.ports import free_port

SERVICE_USER = os.environ.get("PG_SERVICE_USER", "pgvec")  # as scripts/pg reads it


@dataclass(frozen=True)
class Standby:
    """A running hot standby: its DSN (the primary's password) and data directory."""

    dsn: str
    data_dir: Path

    def wait_replayed(self, primary_dsn: str, timeout_s: float = 30.0) -> None:
        """Poll until the standby replayed all the WAL the primary had written when called
        (so every transaction committed before the call is visible on the standby)."""
        with connect(primary_dsn) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        deadline = time.monotonic() + timeout_s
        with connect(self.dsn) as conn:
            while True:
                done = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],)
                ).fetchone()
                if done is not None and done[0]:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"the standby did not replay up to {row[0]} in time")
                time.sleep(0.02)


@contextlib.contextmanager
def copyable_primary() -> Iterator[PgServer]:
    """The session's server if its data directory is here, else a private one for the block."""
    shared = shared_server()
    if shared.data_dir is not None:
        yield shared
        return
    private = start_private_server()
    try:
        yield private
    finally:
        private.stop()


def bin_dir(primary: PgServer) -> Path:
    """The directory of the binaries running `primary`: `pg_basebackup` must be of the server's
    major version, and `scripts/pg` (its `bin_dir`) chose these when it started the server.
    `postmaster.opts` holds the server's command line, its absolute path first."""
    assert primary.data_dir is not None
    argv = shlex.split((primary.data_dir / "postmaster.opts").read_text())
    return Path(argv[0]).parent


def _as_service_user(argv: list[str]) -> list[str]:
    # As scripts/pg's `as_pg`: root switches to the service user (whose files the server
    # then owns); anyone else must already be it.
    return ["runuser", "-u", SERVICE_USER, "--", *argv] if os.geteuid() == 0 else argv


@contextlib.contextmanager
def hot_standby(primary: PgServer) -> Iterator[Standby]:
    """A streaming-replication standby of `primary`, started and answering in recovery."""
    params = conninfo_to_dict(primary.dsn)
    password = str(params.pop("password", ""))
    # The password goes through the environment, never an argument list others can read.
    env = dict(os.environ, PGPASSWORD=password)
    source = make_conninfo("", **{k: v for k, v in params.items() if k != "dbname"})
    root = Path(tempfile.mkdtemp(prefix="rh-pg-standby-", dir="/tmp"))
    root.chmod(0o711)  # the service user must traverse it, as start_private_server's
    data = root / "data"
    data.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(data, pwd.getpwnam(SERVICE_USER).pw_uid, -1)
    try:
        copied = subprocess.run(
            _as_service_user(
                [
                    str(bin_dir(primary) / "pg_basebackup"),
                    f"--dbname={source}",
                    f"--pgdata={data}",
                    "--write-recovery-conf",  # standby.signal and primary_conninfo
                    "--wal-method=stream",
                    "--checkpoint=fast",  # a spread checkpoint can take minutes
                    "--no-sync",  # a test's copy need not survive a power loss
                ]
            ),
            env=env,
            cwd="/",  # the service user may not enter the caller's directory
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if copied.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed: {copied.stderr}")
        dsn = ""
        last = ""
        for _ in range(3):  # a free port can be taken between the probe and the start
            done = subprocess.run(
                [str(SCRIPT), "start", str(data), str(free_port())],
                env=env,
                capture_output=True,
                text=True,
                timeout=START_TIMEOUT_S,
                check=False,
            )
            if done.returncode == 0:
                dsn = done.stdout.strip()
                break
            last = done.stderr
        else:
            raise RuntimeError(f"scripts/pg start failed for the standby: {last}")
        wait_ready(dsn)
        with connect(dsn) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        # pg_ctl waited for the start, so a standby answers in recovery from its first answer.
        assert row is not None and row[0] is True, "the copy did not start as a standby"
        yield Standby(dsn, data)
    finally:
        subprocess.run(
            [str(SCRIPT), "stop", str(data)], check=False, timeout=90, capture_output=True
        )
        shutil.rmtree(root, ignore_errors=True)
