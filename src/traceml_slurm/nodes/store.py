"""The node evidence store: one SQLite file per user, shared by all their jobs (docs/node-health.md).

Every run (node 0's aggregator, through ``SlurmEnvironment.run_ended``) and every ``traceml slurm
doctor`` adds one *record*: its job, when, which hosts took part, and what it measured of each
host (:class:`~traceml_core.plugins.NodeObservation`). ``traceml slurm nodes`` and the health rule
(:mod:`.health`) read them back.

Where: ``$TRACEML_NODE_STORE``, else ``$XDG_CACHE_HOME/traceml/nodes.sqlite``, else
``~/.cache/traceml/nodes.sqlite`` (a home directory is usually shared by the cluster's nodes, so
node 0 of every job finds the same file).

Safe for concurrent jobs: each write is one ``BEGIN IMMEDIATE`` transaction with a busy timeout
(two jobs ending at once take turns; the rollback journal, not WAL, since WAL needs shared memory
that network filesystems do not give). Bounded: records older than :data:`MAX_AGE_DAYS` and, past
:data:`MAX_OBSERVATIONS`, the oldest records are deleted at each write. A file that is not a store
(corrupt, truncated, another program's) is moved aside and a new one started, with a note; a store
that cannot be opened at all (an unwritable directory, a lock held past the timeout) is a note,
never an exception: node health must never cost a summary or a doctor.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from traceml_core.plugins import NodeObservation, RunEvidence

SCHEMA_VERSION = 1
#: seconds a writer waits for another job's transaction before giving up (with a note)
BUSY_TIMEOUT_S = 5.0
#: records older than this are deleted (the health rule ages evidence out much earlier)
MAX_AGE_DAYS = 90
#: the store keeps at most this many observations (~100 bytes each: a few MB), oldest records first out
MAX_OBSERVATIONS = 100_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY, cluster TEXT NOT NULL, job_id TEXT NOT NULL, run_name TEXT NOT NULL,
    source TEXT NOT NULL, at REAL NOT NULL, UNIQUE (cluster, job_id, run_name, source));
CREATE TABLE IF NOT EXISTS members (
    record INTEGER NOT NULL REFERENCES records(id) ON DELETE CASCADE, host TEXT NOT NULL,
    PRIMARY KEY (record, host));
CREATE TABLE IF NOT EXISTS observations (
    record INTEGER NOT NULL REFERENCES records(id) ON DELETE CASCADE, host TEXT NOT NULL,
    kind TEXT NOT NULL, value REAL, peers REAL, unit TEXT NOT NULL, bad INTEGER NOT NULL,
    strong INTEGER NOT NULL, note TEXT NOT NULL, PRIMARY KEY (record, host, kind));
CREATE INDEX IF NOT EXISTS records_at ON records (cluster, at);
"""


@dataclass(frozen=True)
class Record:
    """One run or doctor as stored: its identity, its hosts, its observations."""

    cluster: str
    job_id: str
    run_name: str
    source: str
    at: float
    hosts: tuple[str, ...]
    observations: tuple[NodeObservation, ...] = ()


@dataclass
class Opened:
    """What opening the store found: the connection (None when it could not be opened) and notes."""

    conn: Optional[sqlite3.Connection]
    notes: list[str] = field(default_factory=list)


def default_path(environ_get) -> Path:
    """``environ_get``: the facts' getter of the process environment (TRACEML_NODE_STORE,
    XDG_CACHE_HOME, HOME)."""
    explicit = (environ_get("TRACEML_NODE_STORE") or "").strip()
    if explicit:
        return Path(explicit).expanduser()
    cache = (environ_get("XDG_CACHE_HOME") or "").strip()
    base = Path(cache) if cache else Path(environ_get("HOME") or "~").expanduser() / ".cache"
    return base / "traceml" / "nodes.sqlite"


class NodeStore:
    """The store at ``path``; every method returns notes instead of raising."""

    def __init__(self, path: Path, *, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s

    # -- opening ---------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), timeout=self.busy_timeout_s, isolation_level=None)
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def open(self, *, create: bool, _retry: bool = True) -> Opened:
        if not create and not self.path.exists():
            return Opened(None)
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            conn = self._connect()
            opened_ino = _inode(self.path)
        except (OSError, sqlite3.Error) as exc:
            return Opened(None, [f"the node store {self.path} cannot be opened ({_why(exc)}); node "
                                 "health is not recorded this time"])
        try:
            self._check(conn, create)
            return Opened(conn)
        except sqlite3.OperationalError as exc:
            conn.close()
            if "locked" in str(exc) or "busy" in str(exc):
                return Opened(None, [f"the node store {self.path} was locked by another job for "
                                     f"{self.busy_timeout_s:.0f} s; node health is not recorded this time"])
            return Opened(None, [f"the node store {self.path} cannot be used ({_why(exc)}); node "
                                 "health is not recorded this time"])
        except (sqlite3.DatabaseError, _NotOurs) as exc:
            conn.close()
            if _retry and _inode(self.path) != opened_ino:
                # another job moved the bad file aside meanwhile and started a new store: use it
                return self.open(create=create, _retry=False)
            return self._set_aside(exc, create, opened_ino)

    def _check(self, conn: sqlite3.Connection, create: bool) -> None:
        """A store of ours, made or checked; ``_NotOurs`` for another schema, DatabaseError for a
        file that is not a database."""
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            if not create:
                raise _NotOurs("empty")
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    conn.execute(statement)
                conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            try:
                os.chmod(self.path, 0o600)
            except OSError:
                pass
            return
        row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone() if "meta" in tables else None
        if row is None or row[0] != str(SCHEMA_VERSION):
            raise _NotOurs(f"schema {row[0] if row else 'unknown'}, this TraceML reads {SCHEMA_VERSION}")
        conn.execute("SELECT count(*) FROM records").fetchone()  # reads a page: corruption shows here

    def _set_aside(self, exc: BaseException, create: bool, seen: Optional[tuple[int, int]]) -> Opened:
        aside = self.path.with_name(f"{self.path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        what = f"the node store {self.path} is not a TraceML node store ({_why(exc)})"
        if not create:
            return Opened(None, [f"{what}; the next run moves it aside and starts a new one"])
        try:  # one job at a time moves it, and only the file it found bad (not another's new store)
            with open(f"{self.path}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if _inode(self.path) != seen:
                    return self.open(create=True, _retry=False)
                os.replace(self.path, aside)
                for suffix in ("-journal", "-wal", "-shm"):  # what belonged to the old file
                    try:
                        os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
                    except OSError:
                        pass
        except OSError as err:
            return Opened(None, [f"{what} and cannot be moved aside ({_why(err)}); remove it to record "
                                 "node health again"])
        opened = self.open(create=True, _retry=False)
        opened.notes.insert(0, f"{what}: moved it to {aside} and started a new one; node health "
                               "starts from this run")
        return opened

    # -- writing ---------------------------------------------------------------------------------
    def add(self, cluster: str, evidence: RunEvidence) -> list[str]:
        """Record one run or doctor (replacing an earlier record of the same job, run and
        source: a summary written twice counts once), then prune. Returns notes."""
        opened = self.open(create=True)
        conn = opened.conn
        if conn is None:
            return opened.notes
        with closing(conn):
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("DELETE FROM records WHERE cluster=? AND job_id=? AND run_name=? AND source=?",
                             (cluster, evidence.job_id or "", evidence.run_name, evidence.source))
                rid = conn.execute("INSERT INTO records (cluster, job_id, run_name, source, at) VALUES "
                                   "(?, ?, ?, ?, ?)", (cluster, evidence.job_id or "", evidence.run_name,
                                                       evidence.source, evidence.at)).lastrowid
                conn.executemany("INSERT OR IGNORE INTO members VALUES (?, ?)",
                                 [(rid, h) for h in sorted(set(evidence.hosts))])
                conn.executemany(
                    "INSERT OR REPLACE INTO observations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(rid, o.host, o.kind, o.value, o.peers, o.unit, int(o.bad), int(o.strong), o.note[:300])
                     for o in evidence.observations])
                self._prune(conn, evidence.at)
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                busy = "locked" in str(exc) or "busy" in str(exc)
                opened.notes.append(
                    f"the node store {self.path} was locked by another job for {self.busy_timeout_s:.0f} s"
                    if busy else f"the node store {self.path} could not be written ({_why(exc)})")
                opened.notes[-1] += "; this run's node evidence is not recorded"
        return opened.notes

    @staticmethod
    def _prune(conn: sqlite3.Connection, now: float) -> None:
        conn.execute("DELETE FROM records WHERE at < ?", (now - MAX_AGE_DAYS * 86400.0,))
        n = conn.execute("SELECT count(*) FROM observations").fetchone()[0]
        if n <= MAX_OBSERVATIONS:
            return
        rows = conn.execute("SELECT r.id, count(o.record) FROM records r LEFT JOIN observations o "
                            "ON o.record = r.id GROUP BY r.id ORDER BY r.at").fetchall()
        drop = []
        for rid, count in rows:
            if n <= MAX_OBSERVATIONS:
                break
            drop.append((rid,))
            n -= count
        conn.executemany("DELETE FROM records WHERE id=?", drop)

    # -- reading ---------------------------------------------------------------------------------
    def records(self, cluster: Optional[str], since: float = 0.0) -> tuple[list[Record], list[str]]:
        """Every record of ``cluster`` (None: all clusters) newer than ``since``, oldest first."""
        opened = self.open(create=False)
        conn = opened.conn
        if conn is None:
            return [], opened.notes
        with closing(conn):
            try:
                where, args = "at >= ?", [since]
                if cluster is not None:
                    where += " AND cluster = ?"
                    args.append(cluster)
                recs = conn.execute(f"SELECT id, cluster, job_id, run_name, source, at FROM records WHERE "
                                    f"{where} ORDER BY at, id", args).fetchall()
                ids = [r[0] for r in recs]
                members: dict[int, list[str]] = {i: [] for i in ids}
                obs: dict[int, list[NodeObservation]] = {i: [] for i in ids}
                for rid, host in _in(conn, "SELECT record, host FROM members", ids):
                    members[rid].append(host)
                for rid, host, kind, value, peers, unit, bad, strong, note in _in(
                        conn, "SELECT record, host, kind, value, peers, unit, bad, strong, note FROM observations", ids):
                    obs[rid].append(NodeObservation(host, kind, value, peers, unit, bool(bad), bool(strong), note))
            except sqlite3.Error as exc:
                return [], [f"the node store {self.path} cannot be read ({_why(exc)})"]
        return [Record(c, j, n, s, at, tuple(sorted(members[i])), tuple(obs[i]))
                for i, c, j, n, s, at in recs], opened.notes


class _NotOurs(Exception):
    pass


def _in(conn: sqlite3.Connection, select: str, ids: Sequence[int]) -> Iterable[tuple]:
    """``select ... WHERE record IN ids``, in chunks (SQLite's limit of bound parameters)."""
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        yield from conn.execute(f"{select} WHERE record IN ({','.join('?' * len(chunk))})", chunk)


def _inode(path: Path) -> Optional[tuple[int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) else (exc.strerror or str(exc))
