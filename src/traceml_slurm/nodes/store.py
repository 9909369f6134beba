"""The node evidence store: one SQLite file per user, shared by all their jobs (docs/node-health.md).

Every run (node 0's aggregator, through ``SlurmEnvironment``) and every ``traceml slurm doctor``
adds one *record*: its job, when, which hosts took part, and what it measured of each host
(:class:`~traceml_core.plugins.NodeObservation`). ``traceml slurm nodes`` and the health rule
(:mod:`.health`) read them back.

Where: ``$TRACEML_NODE_STORE``, else ``$XDG_CACHE_HOME/traceml/nodes.sqlite``, else
``~/.cache/traceml/nodes.sqlite`` (a home directory is usually shared by the cluster's nodes, so
node 0 of every job finds the same file). ``TRACEML_NODE_STORE=off`` turns it off.

Never on a run's critical path: a run's summary only *reads* it, waiting at most
:data:`READ_WAIT_S` for another job's transaction, and adds its record after the summary is
written, waiting at most :data:`WRITE_WAIT_S`; a store busy longer is skipped with a note.
Concurrent jobs take turns: each write is one ``BEGIN IMMEDIATE`` transaction (the rollback
journal, not WAL, since WAL needs shared memory that network filesystems do not give). Bounded:
records older than :data:`MAX_AGE_DAYS` and, past :data:`MAX_OBSERVATIONS`, the oldest records
are deleted at each write. A file that is not a store (corrupt, truncated, another program's) is
moved aside and a new one started, with a note.

Trusted only when it is the user's alone (:meth:`NodeStore.refusal`): a regular file (never a
link, a device, a FIFO), owned by the user, mode ``0600``, in a directory of the user's that
nobody else may write (else another user could replace the file, or plant its journal, which
SQLite would roll back into it). Anything else is ignored, with a note that names the path and
the fix; never read, never written, never moved. Host names are Slurm host names
(``hostlists.is_host_name``) before they are stored, and again when read back.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import stat
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence
from urllib.parse import quote

from traceml_core.plugins import NodeObservation, RunEvidence
from traceml_core.safeio import kind_of, writable_by_others

from ..hostlists import is_host_name, shown

SCHEMA_VERSION = 2
#: schema 2 added the ranks an observation is about and whether their work was measured equal
#: (report/nodeevidence.PLACED_KINDS); a schema-1 store is migrated in place, its rows keeping ""
_MIGRATE = {"1": ("ALTER TABLE observations ADD COLUMN ranks TEXT NOT NULL DEFAULT ''",
                  "ALTER TABLE observations ADD COLUMN work TEXT NOT NULL DEFAULT ''")}
#: seconds the summary's read waits for another job's transaction (the summary waits on it)
READ_WAIT_S = 0.2
#: seconds adding a record waits for another job's transaction (after the summary is written)
WRITE_WAIT_S = 2.0
#: records older than this are deleted (the health rule ages evidence out much earlier)
MAX_AGE_DAYS = 90
#: the store keeps at most this many observations (~100 bytes each: a few MB), oldest records first out
MAX_OBSERVATIONS = 100_000
#: the values of TRACEML_NODE_STORE that turn the store off
OFF_WORDS = frozenset({"off", "none", "no", "false", "0", "disabled"})
#: how the path of a store that is off reads (``default_path``)
OFF = Path("off")
#: how to turn it off, said in every note that refuses a store
OFF_HINT = "TRACEML_NODE_STORE=off turns the node store off"

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
    strong INTEGER NOT NULL, note TEXT NOT NULL, ranks TEXT NOT NULL DEFAULT '',
    work TEXT NOT NULL DEFAULT '', PRIMARY KEY (record, host, kind));
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
    XDG_CACHE_HOME, HOME). :data:`OFF` when TRACEML_NODE_STORE turns the store off."""
    explicit = (environ_get("TRACEML_NODE_STORE") or "").strip()
    if explicit.lower() in OFF_WORDS:
        return OFF
    if explicit:
        return Path(explicit).expanduser()
    cache = (environ_get("XDG_CACHE_HOME") or "").strip()
    base = Path(cache) if cache else Path(environ_get("HOME") or "~").expanduser() / ".cache"
    return base / "traceml" / "nodes.sqlite"


def printable(text: str, limit: int = 300) -> str:
    """A stored note as one line: control characters (a newline that would forge a line) as spaces."""
    return "".join(ch if ch.isprintable() else " " for ch in str(text)[:limit])


class NodeStore:
    """The store at ``path``; every method returns notes instead of raising."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def off(self) -> bool:
        return self.path == OFF

    # -- trusting ------------------------------------------------------------------------------
    def refusal(self) -> Optional[str]:
        """Why the store is not to be used (see the module's docstring); None when it is."""
        path = self.path
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            return self._refused(f"it cannot be checked ({_why(exc)})")
        if st is not None:
            if not stat.S_ISREG(st.st_mode):
                what = kind_of(st.st_mode)
                fix = ("set TRACEML_NODE_STORE=off instead" if stat.S_ISCHR(st.st_mode)
                       else "point TRACEML_NODE_STORE at a file of yours, or set TRACEML_NODE_STORE=off")
                return self._refused(f"it is {what}, not a file; TraceML neither follows nor replaces it ({fix})")
            if st.st_uid != os.getuid():
                return self._refused(f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()}): another "
                                     "user's records could exclude healthy nodes, and yours would be theirs "
                                     "to read. Remove it if it is yours to remove, or point TRACEML_NODE_STORE "
                                     "at a file in a directory of yours")
            if stat.S_IMODE(st.st_mode) & 0o077:
                return self._refused(f"its mode is {stat.S_IMODE(st.st_mode):04o}, so others may have written "
                                     f"records into it; if you trust its records, `chmod 600 {path}`, else "
                                     "remove it")
        parent = path.parent
        try:
            pst = os.stat(parent)
        except FileNotFoundError:
            return None  # made by the first write, 0700
        except OSError as exc:
            return self._refused(f"its directory {parent} cannot be checked ({_why(exc)})")
        if pst.st_uid not in (os.getuid(), 0) or writable_by_others(pst):
            who = f"owned by uid {pst.st_uid}" if pst.st_uid not in (os.getuid(), 0) else \
                f"writable by others (mode {stat.S_IMODE(pst.st_mode):04o})"
            return self._refused(f"its directory {parent} is {who}: another user could replace the store or "
                                 "plant its journal. Point TRACEML_NODE_STORE at a file in a directory only "
                                 "you can write (the default ~/.cache/traceml/nodes.sqlite is)")
        return None

    def _refused(self, why: str) -> str:
        return f"the node store {self.path} is ignored: {why}. Node health is neither read from it nor recorded ({OFF_HINT})"

    # -- opening ---------------------------------------------------------------------------------
    def _connect(self, wait_s: float) -> sqlite3.Connection:
        # mode=rw: SQLite never creates the file itself (``_create`` made it, 0600, O_EXCL)
        conn = sqlite3.connect(f"file:{quote(str(self.path.absolute()))}?mode=rw", uri=True, timeout=wait_s,
                               isolation_level=None)
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA trusted_schema = OFF")
        return conn

    def _create(self) -> None:
        """The store's file, new, 0600, never through a link; its directory 0700 when new."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            os.close(os.open(self.path, flags, 0o600))
        except FileExistsError:
            pass  # another job made it meanwhile: checked below like any other

    def open(self, *, create: bool, wait_s: float = READ_WAIT_S, _retry: bool = True) -> Opened:
        if self.off:
            return Opened(None)
        refused = self.refusal()
        if refused is not None:
            return Opened(None, [refused])
        if not create and not self.path.exists():
            return Opened(None)
        try:
            if create:
                self._create()
                refused = self.refusal()  # what exists now (made by us or by another job)
                if refused is not None:
                    return Opened(None, [refused])
            opened_ino = _inode(self.path)
            conn = self._connect(wait_s)
            if _inode(self.path) != opened_ino:  # swapped between the check and the open
                conn.close()
                return Opened(None, [self._refused("it was replaced while it was opened")])
        except (OSError, sqlite3.Error) as exc:
            return Opened(None, [f"the node store {self.path} cannot be opened ({_why(exc)}); node "
                                 "health is not recorded this time"])
        try:
            self._check(conn, create)
            return Opened(conn)
        except sqlite3.OperationalError as exc:
            conn.close()
            if _busy(exc):
                return Opened(None, [self.busy_note(wait_s)])
            return Opened(None, [f"the node store {self.path} cannot be used ({_why(exc)}); node "
                                 "health is not recorded this time"])
        except (sqlite3.DatabaseError, _NotOurs) as exc:
            conn.close()
            if _retry and _inode(self.path) != opened_ino:
                # another job moved the bad file aside meanwhile and started a new store: use it
                return self.open(create=create, wait_s=wait_s, _retry=False)
            return self._set_aside(exc, create, opened_ino, wait_s)

    def busy_note(self, wait_s: float) -> str:
        return (f"the node store {self.path} was busy (another job held it) for {wait_s:g} s, so it was "
                "skipped: node health is not recorded this time")

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
            return
        row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone() if "meta" in tables else None
        if row is not None and row[0] in _MIGRATE:
            self._migrate(conn)
            row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None or row[0] != str(SCHEMA_VERSION):
            raise _NotOurs(f"schema {row[0] if row else 'unknown'}, this TraceML reads {SCHEMA_VERSION}")
        conn.execute("SELECT count(*) FROM records").fetchone()  # reads a page: corruption shows here

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """An older schema to this one, in one transaction (another job may be doing the same)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            while row is not None and row[0] in _MIGRATE:
                for statement in _MIGRATE[row[0]]:
                    conn.execute(statement)
                conn.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(int(row[0]) + 1),))
                row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _set_aside(self, exc: BaseException, create: bool, seen: Optional[tuple[int, int]], wait_s: float) -> Opened:
        aside = self.path.with_name(f"{self.path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        what = f"the node store {self.path} is not a TraceML node store ({_why(exc)})"
        if not create:
            # read by a summary (recorded after it is written) and by `traceml slurm nodes`
            return Opened(None, [f"{what}; the next run that records node evidence moves it aside "
                                 "and starts a new one (a summary records after it is written)"])
        try:  # one job at a time moves it, and only the file it found bad (not another's new store)
            with open(f"{self.path}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if _inode(self.path) != seen:
                    return self.open(create=True, wait_s=wait_s, _retry=False)
                os.replace(self.path, aside)
                for suffix in ("-journal", "-wal", "-shm"):  # what belonged to the old file
                    try:
                        os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
                    except OSError:
                        pass
        except OSError as err:
            return Opened(None, [f"{what} and cannot be moved aside ({_why(err)}); remove it to record "
                                 "node health again"])
        opened = self.open(create=True, wait_s=wait_s, _retry=False)
        opened.notes.insert(0, f"{what}: moved it to {aside} and started a new one; node health "
                               "starts from this run")
        return opened

    # -- writing ---------------------------------------------------------------------------------
    def add(self, cluster: str, evidence: RunEvidence, *, wait_s: float = WRITE_WAIT_S) -> list[str]:
        """Record one run or doctor (replacing an earlier record of the same job, run and
        source: a summary written twice counts once), then prune. Returns notes. A host that is
        not a Slurm host name is neither stored nor printed (:func:`valid_evidence`)."""
        evidence, notes = valid_evidence(evidence)
        opened = self.open(create=True, wait_s=wait_s)
        conn = opened.conn
        if conn is None:
            return notes + opened.notes
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
                    "INSERT OR REPLACE INTO observations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(rid, o.host, o.kind, o.value, o.peers, o.unit, int(o.bad), int(o.strong), printable(o.note),
                      ",".join(str(int(r)) for r in o.ranks[:64]), "equal" if o.work == "equal" else "")
                     for o in evidence.observations])
                self._prune(conn, evidence.at)
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                opened.notes.append(self.busy_note(wait_s) if _busy(exc) else
                                    f"the node store {self.path} could not be written ({_why(exc)}); this "
                                    "run's node evidence is not recorded")
        return notes + opened.notes

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
    def records(self, cluster: Optional[str], since: float = 0.0, *,
                wait_s: float = READ_WAIT_S) -> tuple[list[Record], list[str]]:
        """Every record of ``cluster`` (None: all clusters) newer than ``since``, oldest first. A
        host read back that is not a Slurm host name (a store written by an older TraceML) is left
        out, with one note."""
        opened = self.open(create=False, wait_s=wait_s)
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
                bad_names = 0
                for rid, host in _in(conn, "SELECT record, host FROM members", ids):
                    if is_host_name(host):
                        members[rid].append(host)
                    else:
                        bad_names += 1
                for rid, host, kind, value, peers, unit, bad, strong, note, ranks, work in _in(
                        conn, "SELECT record, host, kind, value, peers, unit, bad, strong, note, ranks, work "
                              "FROM observations", ids):
                    if is_host_name(host):
                        obs[rid].append(NodeObservation(host, str(kind), value, peers, printable(unit, 20),
                                                        bool(bad), bool(strong), printable(note), _ranks(ranks),
                                                        "equal" if work == "equal" else ""))
            except sqlite3.Error as exc:
                if _busy(exc):
                    return [], [self.busy_note(wait_s).replace("is not recorded", "is not judged")]
                return [], [f"the node store {self.path} cannot be read ({_why(exc)})"]
        if bad_names:
            opened.notes.append(f"the node store {self.path} holds {bad_names} host name(s) that are not Slurm "
                                "host names; they are left out")
        return [Record(c, printable(j, 40), printable(n, 200), printable(s, 20), at, tuple(sorted(members[i])),
                       tuple(obs[i])) for i, c, j, n, s, at in recs], opened.notes


class _NotOurs(Exception):
    pass


def _in(conn: sqlite3.Connection, select: str, ids: Sequence[int]) -> Iterable[tuple]:
    """``select ... WHERE record IN ids``, in chunks (SQLite's limit of bound parameters)."""
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        yield from conn.execute(f"{select} WHERE record IN ({','.join('?' * len(chunk))})", chunk)


def valid_evidence(evidence: RunEvidence) -> tuple[RunEvidence, list[str]]:
    """``evidence`` without the hosts (and their observations) whose names are not Slurm host
    names, and one note naming them (quoted: a newline in a name is shown, never printed)."""
    bad = sorted({h for h in evidence.hosts if not is_host_name(h)}
                 | {o.host for o in evidence.observations if not is_host_name(o.host)}, key=str)
    if not bad:
        return evidence, []
    from dataclasses import replace

    kept = replace(evidence, hosts=tuple(h for h in evidence.hosts if is_host_name(h)),
                   observations=tuple(o for o in evidence.observations if is_host_name(o.host)))
    return kept, [f"{len(bad)} host name(s) of this {evidence.source} are not Slurm host names and are not "
                  f"recorded: {', '.join(shown(h) for h in bad[:3])}" + (" ..." if len(bad) > 3 else "")]


def _ranks(text: object) -> tuple[int, ...]:
    """The stored ranks (``"1,3"``) back; () for anything else."""
    parts = str(text or "").split(",")
    return tuple(int(p) for p in parts if p.isdigit() and len(p) < 10)


def _busy(exc: BaseException) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


def _inode(path: Path) -> Optional[tuple[int, int]]:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) else (exc.strerror or str(exc))
