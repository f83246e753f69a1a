"""The durable record of jobs: a local SQLite journal (WAL) of job records and their state transitions.

Only meshd writes it. One transaction per engine event (`batch()`); WAL with synchronous=NORMAL survives
a killed daemon (kill -9) without losing a committed transaction. `mesh` never opens it: it asks meshd.
A batch's writes are committed when it ends; an engine event's that a full disk refuses are kept in memory
and go with the next commit (`pending`, `retry`; daemon/diskwatch.py retries them).
A file that is not a readable journal (not SQLite, or a damaged page: SQLite's quick check runs at open) raises
JournalError with one line saying what to do; ids never go back below a floor the caller gives (daemon/idmark.py:
every id given out and every job directory, kept apart from the journal), so a lost journal reuses nothing.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, fields
from pathlib import Path

from meshsched.state import JobState

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    record TEXT NOT NULL,
    state TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE TABLE IF NOT EXISTS transitions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    time REAL NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS transitions_job ON transitions(job_id);
CREATE TABLE IF NOT EXISTS accounting (
    job_id TEXT PRIMARY KEY,
    end_time REAL NOT NULL,
    user TEXT NOT NULL,
    uid INTEGER,
    row TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS accounting_end ON accounting(end_time);
CREATE TABLE IF NOT EXISTS envs (digest TEXT PRIMARY KEY, env TEXT NOT NULL);
"""

TERMINAL = frozenset(s.value for s in JobState if s.is_terminal)  # a record's state: the job has ended
HOLDING = frozenset(s.value for s in JobState if s.holds_gpus)  # a record's state: the job holds its GPUs
# The WAL is checkpointed into the journal at this many pages and cut back to this size after: SQLite's default
# (1000 pages, never cut back) let it grow to MBs of superseded pages that filled a small state disk for good.
WAL_PAGES = 256


@dataclass(slots=True)
class JobRecord:
    """Everything meshd must remember about a job across restarts."""

    job_id: str
    seq: int
    # JobSpec fields
    gpus: int
    model: str
    batch_size: int
    iterations: int
    submit_time: float
    name: str
    user: str
    deadline: float | None
    guaranteed: bool
    # how to run it
    command: list[str]
    cwd: str
    env: dict[str, str]
    job_dir: str
    # where it stands
    state: str = "PENDING"
    reason: str = ""
    node: str = ""
    assigned: list[int] = field(default_factory=list)
    restarts: int = 0
    done_iterations: float = 0.0
    checkpoint_iterations: float = 0.0
    step_time: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    supervisor_pid: int = 0
    supervisor_start: str = ""  # /proc/PID/stat start time, guards against PID reuse
    pausing: bool = False  # a preemption was asked for: its exit means JobPaused
    exec: dict | None = None  # ExecConfig.to_dict(): how it trains (micro-batch, accumulation, MPS limits, plan)
    iterations_given: bool = True  # by `mesh submit --iters`; False: the script's declared total replaces it
    cancelling: bool = False  # a cancel was asked for: CANCELLED once every process of the job is gone
    cancel_proposed: bool = False  # (mesh) this node proposed a cancel: proposed again after a restart until done
    self_preempts: int = 0  # exits with the resumable code that no preemption asked for
    # job control (daemon/control.py)
    array_id: str = ""  # the array it is a task of; its job_id is ARRAY_TASK
    array_task: int | None = None
    array_limit: int = 0  # at most this many tasks of its array queued or running at once (0: no limit)
    dependency: list = field(default_factory=list)  # [[kind, job_id], ...] as resolved at submit
    time_limit: float | None = None  # seconds per run
    time_limit_at: float | None = None  # when the current run exceeds it (re-armed after a meshd restart)
    held: bool = False  # a user hold
    begin_time: float | None = None  # not queued before (--begin)
    signal: str = ""  # --signal in canonical form, B:SIGUSR1@60 (meshsched/wire/jobsignal.py); "": none
    output: str = ""  # absolute paths the patterns of --output / --error expanded to ("" : none)
    error: str = ""
    exit_code: int | None = None  # the job's exit code once it ended (a failed rank's; 0 when completed)
    uid: int | None = None  # the user it runs as (many users, daemon/users.py); None: meshd's own user
    # resources and plan asked for (Rubick; `mesh submit --plan --cpus --mem --tenant`)
    plan: str | None = None  # the execution plan asked for (canonical form); MESH_PLAN unless a policy set one
    cpus: int | None = None  # CPU cores in all (None: the node's share per GPU)
    memory_gb: float | None = None  # host memory in all, GB
    tenant: str = "default"
    # what its current (else last) run on this node is confined to (daemon/confine.py)
    cpu_ids: list[int] = field(default_factory=list)  # CPUs its ranks run on ([]: not pinned)
    memory_limit_gb: float | None = None  # its memory allocation here, GiB
    memory_enforced_by: str = ""  # systemd | cgroup v2 | cgroup v1; "": the limit is not enforced
    # its environment (`mesh submit --export`): `env` is what the submitter exported (meshd's own variables taken
    # out), kept for every run of the job; ALL: the submitter's whole environment; NONE or the names listed: over a
    # minimal PATH/HOME/USER/LANG; "" : a record from before --export, run like NONE (never with meshd's environment)
    export: str = ""
    # honest figures (daemon/listing.py): [iterations, step time] as the job itself last reported them (meshsched.job;
    # None: it never did, so every progress figure is the scheduler's estimate); seconds it held GPUs in runs that
    # ended (`ran`) and when its current run took them (`held_since`): TIME counts neither queue nor preemption
    reported: list | None = None
    ran: float = 0.0
    held_since: float | None = None

    def to_json(self, env_ref: str = "") -> str:
        """The same text as json.dumps(asdict(self)), without asdict's deep copy (the fields hold plain values,
        lists and dicts): a 300-task array is 600 of these. The env is encoded once for the records that share
        one dict (an array's tasks: `_env_text`), the fields before and after it each in one call. `env_ref`: the
        journal's text, which names the env by its digest instead (`Journal.put`)."""
        head = _ENCODE({f: getattr(self, f) for f in _HEAD_FIELDS})
        tail = _ENCODE({f: getattr(self, f) for f in _TAIL_FIELDS})
        env = f'"env_ref":"{env_ref}"' if env_ref else f'"env":{_env_text(self.env)[0]}'
        return f"{head[:-1]},{env},{tail[1:]}"

    def values(self) -> tuple:
        """Every field's value in declaration order: a cheap snapshot, equal to a later one while the record's JSON
        is the same, unless a list or dict it holds was changed in place (meshd assigns new ones)."""
        return _VALUES(self)

    @classmethod
    def from_json(cls, text: str) -> JobRecord:
        return cls(**json.loads(text))


_RECORD_FIELDS = tuple(f.name for f in fields(JobRecord))  # JobRecord.to_json's keys, in declaration order
_VALUES = operator.attrgetter(*_RECORD_FIELDS)  # JobRecord.values
_HEAD_FIELDS = _RECORD_FIELDS[: _RECORD_FIELDS.index("env")]  # (job_id first: never empty)
_TAIL_FIELDS = _RECORD_FIELDS[_RECORD_FIELDS.index("env") + 1 :]  # (job_dir first)
_ENV_TEXT: list = [None, "", ""]  # the last env dict encoded, its JSON text and that text's digest
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps(.., separators=..) without a new encoder each


def _env_text(env: dict) -> tuple[str, str]:
    """`env` as JSON and the text's digest; the last dict's again when it is the same object (meshd never changes a
    record's env in place: an array's tasks share theirs, `daemon.submission.array_env`)."""
    if _ENV_TEXT[0] is not env:
        text = _ENCODE(env)
        _ENV_TEXT[:] = [env, text, hashlib.sha256(text.encode()).hexdigest()[:32]]
    return _ENV_TEXT[1], _ENV_TEXT[2]


class JournalError(RuntimeError):
    """The journal cannot be opened or read (corrupt, not a database, unreadable)."""


def unusable(path: Path, why: str) -> str:
    """The one line meshd stops with when its journal cannot be read."""
    if "disk is full" in why:  # a full state disk, not a damaged journal: moving it aside would discard every job
        return (f"journal {path} cannot be opened: the state disk is full ({why}); free space on it and start meshd "
                "again (the journal is not damaged: keep it where it is)")
    return (f"journal {path} is unusable ({why}); move it aside to start with an empty queue (meshd then stops "
            "the jobs it no longer knows, and job ids continue past every id given out)")


def _damage(db: sqlite3.Connection) -> str:
    """What SQLite's quick check finds wrong with every page of the journal ("" : nothing); a damaged page that no
    query at start happens to read (the policy's memory, the id counter) is found here, before meshd serves."""
    rows = [r[0] for r in db.execute("PRAGMA quick_check(3)")]
    return "" if rows == ["ok"] else "database disk image is malformed: " + "; ".join(map(str, rows))


class Journal:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:  # private before SQLite writes a byte (its -wal and -shm files take the same mode)
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        except OSError as exc:
            raise JournalError(f"journal {path} cannot be opened: {exc.strerror}") from None
        try:
            self._db = sqlite3.connect(str(path), isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")  # the WAL never fills a small state disk
            self._db.execute(f"PRAGMA journal_size_limit={WAL_PAGES * 4096}")
            self._db.executescript(SCHEMA)
            self._db.execute("SELECT count(*) FROM jobs").fetchone()
            problem = _damage(self._db)
        except sqlite3.DatabaseError as exc:
            problem = str(exc)
        if problem:
            raise JournalError(unusable(path, problem))
        self.path = path
        self._depth = 0
        # Write transactions ended (committed or not) and records put: every change to a job record and every
        # engine event goes through one, so a view of the jobs made at one count holds until the count moves.
        # `stamps`: the count at each job's last put, so a view of one job holds while its stamp does and the
        # engine's word on it (its pending reason) is the same (daemon/listing.py caches `mesh ls` on both).
        self.writes = 0
        self.stamps: dict[str, int] = {}
        self._write_side()

    def _write_side(self) -> None:
        self._rows: dict[tuple, tuple[str, tuple]] = {}  # the open batch's writes, by row (the last one wins)
        self._defer = False  # the open batch keeps its writes in memory when they cannot be committed
        self._order = itertools.count()  # transitions are rows of their own, in order
        self.pending: dict[tuple, tuple[str, tuple]] = {}  # writes a failed commit kept (retried with the next)
        self._envs: set[str] = set()  # digests of the envs committed to the `envs` table
        self.failure = ""  # why the last commit failed ("" once one succeeded)

    @contextmanager
    def batch(self, defer: bool = False) -> Iterator[None]:
        """One transaction around everything written inside (nestable; the outermost commits). The writes are
        kept until the outermost batch ends and then committed together with any kept from before (`pending`).
        When that commit fails (a full disk: sqlite3.OperationalError, OSError), a batch that is or holds one
        opened with `defer` (an engine event: what it changed is already true in memory) keeps its writes in
        `pending` to go with the next commit (`retry`); any other batch raises and its writes are dropped."""
        if self._depth == 0:
            self._rows, self._defer = {}, False
        self._defer = self._defer or defer
        self._depth += 1
        try:
            yield
        except BaseException:
            self._depth -= 1
            if self._depth == 0:
                self.writes += 1
                self._rows = {}
            raise
        self._depth -= 1
        if self._depth == 0:
            self.writes += 1
            self._commit()

    def _commit(self) -> None:
        """Write the kept writes and the batch's in one transaction (the batch's win where both name a row)."""
        rows, self._rows = {**self.pending, **self._rows}, {}
        if not rows:
            return
        try:
            self._db.execute("BEGIN IMMEDIATE")
            for sql, args in rows.values():
                self._db.execute(sql, args)
            self._db.execute("COMMIT")
        except (sqlite3.OperationalError, OSError) as exc:
            if self._db.in_transaction:  # SQLite may have rolled back already (SQLITE_FULL)
                with suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            self.failure = str(exc) or type(exc).__name__
            if not self._defer:
                raise
            self.pending = rows
            return
        self.pending, self.failure = {}, ""
        self._envs.update(key[1] for key in rows if key[0] == "env")  # committed: not written again

    def retry(self) -> bool:
        """Commit what earlier batches could not; True when nothing is kept any more. A commit the disk still
        refuses tries again once the WAL has given its space back (a truncating checkpoint): the space a full
        disk lacks may be the WAL's own superseded pages, and then nothing else would ever free it."""
        with self.batch(defer=True):
            pass
        if self.pending and self._reclaim():
            with self.batch(defer=True):
                pass
        return not self.pending

    def _reclaim(self) -> bool:
        """Checkpoint the WAL into the journal and truncate it; True when it was (nothing else reading it)."""
        try:
            busy = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.Error:  # the journal cannot grow by the pages the checkpoint writes: the disk is full indeed
            return False
        return not busy

    def _stage(self, key: tuple, sql: str, args: tuple) -> None:
        if self._depth == 0:  # outside a batch: a batch of its own
            with self.batch():
                self._rows[key] = (sql, args)
        else:
            self._rows[key] = (sql, args)

    def next_seq(self, floor: int = 1) -> int:
        """The next job sequence number, never below `floor`; committed at once, on its own (an id is given out
        only once it is durable: a full disk raises)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute("SELECT value FROM meta WHERE key='next_seq'").fetchone()
            seq = max(int(row[0]) if row else 1, floor)
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('next_seq', ?)", (str(seq + 1),))
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                with suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            raise
        return seq

    def take_seq(self, floor: int = 1) -> int:
        """`next_seq` inside the open batch: the counter moves in the transaction that writes the records holding
        the id (a submit, an array's every task: one commit). The caller raises its own floor first (IdMark), so
        an id whose batch fails is never given again either."""
        kept = self._rows.get(("meta", "next_seq")) or self.pending.get(("meta", "next_seq"))
        row = kept[1] if kept else self._db.execute("SELECT value FROM meta WHERE key='next_seq'").fetchone()
        seq = max(int(row[0]) if row else 1, floor)
        self._stage(("meta", "next_seq"), "INSERT OR REPLACE INTO meta VALUES ('next_seq', ?)", (str(seq + 1),))
        return seq

    def applied(self) -> int:
        """(mesh) The last log entry whose actions this node carried out (0: none)."""
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key='mesh_applied'").fetchone()
        except sqlite3.DatabaseError as exc:  # a first read at start (under the etcd coordinator)
            raise JournalError(unusable(self.path, str(exc))) from None
        return int(row[0]) if row else 0

    def set_applied(self, index: int) -> None:
        """Inside the batch of the records that entry changed, so both commit or neither does."""
        self._stage(("meta", "mesh_applied"), "INSERT OR REPLACE INTO meta VALUES ('mesh_applied', ?)", (str(index),))

    def put(self, rec: JobRecord) -> None:
        """A job's record, in the open batch. An array task's env is the array's: written once (the `envs` table, by
        the digest of its text) and named by its record, not copied into each of its tasks' records."""
        self.writes += 1
        self.stamps[rec.job_id] = self.writes
        ref = ""
        if rec.array_id:
            text, ref = _env_text(rec.env)
            if ref not in self._envs and ("env", ref) not in self._rows:
                self._stage(("env", ref), "INSERT OR IGNORE INTO envs (digest, env) VALUES (?, ?)", (ref, text))
        self._stage(("job", rec.job_id), "INSERT OR REPLACE INTO jobs (job_id, seq, record, state) VALUES (?, ?, ?, ?)",
                    (rec.job_id, rec.seq, rec.to_json(ref), rec.state))

    def transition(self, job_id: str, time: float, state: str, reason: str) -> None:
        self._stage(("transition", next(self._order)),
                    "INSERT INTO transitions (job_id, time, state, reason) VALUES (?, ?, ?, ?)",
                    (job_id, time, state, reason))

    def put_memory(self, text: str) -> None:
        """The preemption layer's memory (Engine.memory, as its policy encodes it: Lazer's deferral queues and
        observations), written in the same transaction as the event that changed it."""
        self._stage(("meta", "policy_memory"), "INSERT OR REPLACE INTO meta VALUES ('policy_memory', ?)", (text,))

    def load_memory(self) -> str | None:
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key='policy_memory'").fetchone()
        except sqlite3.DatabaseError as exc:  # a first read at start: one line, as for a journal that will not open
            raise JournalError(unusable(self.path, str(exc))) from None
        return row[0] if row else None

    def put_drains(self, drains: list[dict]) -> None:
        """The drained GPUs (meshsched.drain records), in the transaction of the event that changed them."""
        self._stage(("meta", "drains"), "INSERT OR REPLACE INTO meta VALUES ('drains', ?)", (json.dumps(drains),))

    def load_drains(self) -> list[dict]:
        row = self._db.execute("SELECT value FROM meta WHERE key='drains'").fetchone()
        return json.loads(row[0]) if row else []

    def load(self) -> list[JobRecord]:
        """All job records in submission order."""
        try:
            texts = dict(self._db.execute("SELECT digest, env FROM envs"))
            envs: dict[str, dict] = {}  # an array's tasks share one env dict again, as at submit
            recs = []
            for (text,) in self._db.execute("SELECT record FROM jobs ORDER BY seq"):
                data = json.loads(text)
                if "env_ref" in data:
                    ref = data.pop("env_ref")
                    data["env"] = envs[ref] if ref in envs else envs.setdefault(ref, json.loads(texts[ref]))
                recs.append(JobRecord(**data))
        except (sqlite3.DatabaseError, ValueError, TypeError) as exc:
            raise JournalError(unusable(self.path, str(exc))) from None
        except KeyError as exc:
            raise JournalError(unusable(self.path, f"a record names an environment it lacks ({exc})")) from None
        self._envs = set(envs)
        if len(envs) < len(texts):  # the envs of arrays retention forgot entirely (a full disk: kept for later)
            with self.batch(defer=True):
                for ref in texts.keys() - envs.keys():
                    self._stage(("unenv", ref), "DELETE FROM envs WHERE digest=?", (ref,))
        return recs

    def history(self, job_id: str) -> list[tuple[float, str, str]]:
        rows = self._db.execute("SELECT time, state, reason FROM transitions WHERE job_id=? ORDER BY id", (job_id,))
        kept = [args[1:] for key, (_, args) in self.pending.items() if key[0] == "transition" and args[0] == job_id]
        return [tuple(r) for r in rows] + kept  # and those a full disk keeps in memory for now

    # ---------------------------------------------------------------- accounting and retention
    def stage(self, key: tuple, sql: str, args: tuple) -> None:
        """Another part's write to its own table (daemon/accounting.py: the `accounting` table) in the open batch,
        deferred like the batch's own (a full disk keeps it in `pending`, keyed ("ext", *key))."""
        self._stage(("ext", *key), sql, args)

    def select(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self._db.execute(sql, args).fetchall()

    def forget(self, job_id: str) -> None:
        """Retention: the job's record and its transitions leave the journal (the accounting table keeps its row)."""
        self.stamps.pop(job_id, None)
        self._stage(("job", job_id), "DELETE FROM jobs WHERE job_id=?", (job_id,))
        self._stage(("forget", job_id), "DELETE FROM transitions WHERE job_id=?", (job_id,))

    def close(self) -> None:
        self._db.close()
