"""Accounting and retention (issue 23, points 5 and 6): a row per ended job that outlives retention, `mesh acct`
(rows, filters, CSV, --summary, privacy), retention forgetting ended jobs (journal, records, engine, job dirs), a
full disk that does not lose a row, and the config keys' one-line errors.

The scripted day drives meshd's own EngineLoop, journal and accounting with a fake clock and a recording executor
(no processes): 200 jobs of two users, GPU-hours from `--summary` against the jobs' own start and end records.
"""

from __future__ import annotations

import heapq
import json
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from meshsched import events as ev
from meshsched.actions import FitModel, Kill, Launch, Preempt, Reconfigure, ScheduleTimer
from meshsched.daemon import runs, users
from meshsched.daemon.accounting import Accounting, summary
from meshsched.daemon.config import ConfigError, load_config
from meshsched.daemon.engine_loop import EngineLoop
from meshsched.daemon.journal import JobRecord, Journal
from meshsched.daemon.mirror import job_spec
from meshsched.daemon.retention import Retention, RetentionContext
from meshsched.daemon.users import Peer
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import installed_handle
from meshsched.policies.registry import make_policy
from meshsched.state import NodeSpec

from tests.support.daemon import daemon_in_thread, make_config, poll, remove, short_dir, small_tmpfs
from tests.support.fakes import LinearPerf

DAY = 86400.0
T0 = 1_800_000_000.0  # the fake clock's midnight


class FakeDay:
    """meshd's EngineLoop over a real journal and accounting, on 8 fake GPUs, with a fake clock: a Launch starts
    the job 1 s later and it finishes `durations[job]` s after that."""

    def __init__(self, state: Path) -> None:
        self.journal = Journal(state / "journal.sqlite")
        self.engine = Engine(make_policy("fifo", installed_handle()), ProfileEstimator(LinearPerf()))
        self.records: dict[str, JobRecord] = {}
        self.events: list = []  # (time, seq, event)
        self.durations: dict[str, float] = {}
        self.n = 0
        handlers = {Launch: self._launch, Preempt: lambda a: None, Kill: lambda a: None,
                    Reconfigure: lambda a: None, ScheduleTimer: lambda a: None, FitModel: lambda a: None}
        self.loop = EngineLoop(self.engine, self.journal, self.records, None, handlers)
        self.now = T0
        self.accounting = Accounting(self.journal, lambda rec: ["n1"] if rec.assigned else [])
        self.runs = SimpleNamespace(forget_run=lambda job_id: None, launched={})
        cfg = SimpleNamespace(keep_finished=DAY, keep_job_dirs=0.0, jobs_dir=state / "jobs")
        self.retention = Retention(RetentionContext(cfg, self.records, self.engine, self.journal, self.loop,
                                                    SimpleNamespace(running=lambda j: False), self.runs,
                                                    self.accounting))
        self.loop.accounted, self.loop.forgot = self.accounting.ended, self.retention.forgot
        self.loop.handle(ev.NodeJoined("join", NodeSpec("n1", 8, "fake", 16384)), self.now)

    def _at(self, t: float, event) -> None:
        self.n += 1
        heapq.heappush(self.events, (t, self.n, event))

    def _launch(self, action: Launch) -> None:
        self._at(self.now + 1, ev.JobStarted(f"s-{action.job_id}", action.job_id))
        self._at(self.now + 1 + self.durations[action.job_id], ev.JobFinished(f"f-{action.job_id}", action.job_id))

    def submit(self, job_id: str, user: str, gpus: int, at: float, duration: float, tenant: str = "default",
               held: bool = False, dependency: list | None = None) -> None:
        rec = JobRecord(job_id=job_id, seq=int(job_id), gpus=gpus, model="m", batch_size=32 * gpus, iterations=100,
                        submit_time=at, name=f"job{job_id}", user=user, deadline=None, guaranteed=False,
                        command=["true"], cwd="/", env={}, job_dir="", tenant=tenant, held=held,
                        dependency=dependency or [])
        self.durations[job_id] = duration
        self._at(at, (rec, ev.JobSubmitted(f"sub-{job_id}", job_spec(rec), held=held)))

    def run(self, until: float = float("inf")) -> None:
        while self.events and self.events[0][0] <= until:
            self.now, _, item = heapq.heappop(self.events)
            if isinstance(item, tuple):
                rec, item = item
                self.records[rec.job_id] = rec
                with self.journal.batch():
                    self.journal.put(rec)
            self.loop.handle(item, self.now)


def scripted_day(state: Path) -> FakeDay:
    """200 jobs of ann and bob over a day (deterministic: submit times, GPUs and durations from the job number)."""
    day = FakeDay(state)
    for i in range(1, 201):
        user = "ann" if i % 3 else "bob"
        day.submit(str(i), user, 1 + i % 4, T0 + i * 400, 60 + (i * 7919) % 3600, tenant="vision" if i % 2 else "nlp")
    day.run()
    return day


def hours_from_records(day: FakeDay) -> dict[str, float]:
    """GPU-seconds per user from each job's own start and end records (one run each)."""
    out: dict[str, float] = {}
    for rec in day.records.values():
        history = day.journal.history(rec.job_id)
        start = next(t for t, s, _ in history if s == "LOADING")
        end = next(t for t, s, _ in history if s == "COMPLETED")
        assert (start, end) == (rec.start_time, rec.end_time)
        out[rec.user] = out.get(rec.user, 0.0) + rec.gpus * (end - start)
    return out


@pytest.mark.slow
def test_a_day_of_200_jobs_summary_equals_their_runs_before_and_after_retention(tmp_path):
    day = scripted_day(tmp_path)
    assert all(r.state == "COMPLETED" for r in day.records.values()) and len(day.records) == 200
    want = hours_from_records(day)
    before = summary(day.accounting.rows(T0, T0 + 3 * DAY))
    assert set(before["users"]) == {"ann", "bob"} and before["total"]["jobs"] == 200
    for user, seconds in want.items():
        assert abs(before["users"][user]["gpu_seconds"] - seconds) < 1.0  # to the second
    assert set(before["tenants"]) == {"vision", "nlp"}
    # a day after the last end, retention forgets them: journal, records and engine; accounting keeps them
    day.retention.sweep(max(r.end_time for r in day.records.values()) + DAY + 1)
    assert day.records == {} and day.engine.state.jobs == {}
    assert day.journal.select("SELECT count(*) FROM jobs")[0][0] == 0
    assert day.journal.select("SELECT count(*) FROM transitions")[0][0] == 0
    assert summary(day.accounting.rows(T0, T0 + 3 * DAY)) == before
    day.journal.close()
    again = Accounting(Journal(tmp_path / "journal.sqlite"), lambda rec: [])  # a restart: the rows are durable
    assert summary(again.rows(T0, T0 + 3 * DAY)) == before
    row = again.rows(users=["bob"])[0]
    assert set(row) >= {"job_id", "user", "tenant", "name", "state", "exit_code", "submit", "start", "end", "gpus",
                        "gpu_hours", "restarts", "nodes"}
    assert row["nodes"] == ["n1"] and row["state"] == "COMPLETED"


def test_requeued_job_counts_each_run(tmp_path):
    day = FakeDay(tmp_path)
    day.submit("1", "ann", 2, T0, 1000)
    day.run(until=T0 + 101)  # launched at T0, running since T0 + 1
    day.events.clear()  # that run's end will not come: it is lost
    day.now = T0 + 101
    day.loop.handle(ev.JobFailed("lost", "1", "node lost", requeue=True), T0 + 101)  # ran 101 s, queued again
    day.run()  # relaunched at T0 + 101, ends 1001 s later
    (row,) = day.accounting.rows()
    # two launches, one restart (as `mesh show` counts; it said 2 before)
    assert row["gpu_seconds"] == pytest.approx(2 * (101 + 1001)) and row["restarts"] == 1


def test_a_dependency_on_a_forgotten_job_stays_met_in_the_record(tmp_path):
    """A held job's afterok on a job retention forgot: dropped from its record too, so a restart (which restores
    it from the record) does not cancel it as DependencyNeverSatisfied."""
    day = FakeDay(tmp_path)
    day.submit("1", "ann", 1, T0, 100)
    day.submit("2", "ann", 1, T0, 100, held=True, dependency=[["afterok", "1"]])
    day.run()
    day.retention.sweep(T0 + 2 * DAY)
    assert "1" not in day.records and day.records["2"].state == "PENDING"
    assert day.records["2"].dependency == []
    (text,) = day.journal.select("SELECT record FROM jobs WHERE job_id='2'")[0]
    assert JobRecord.from_json(text).dependency == []
    day.now = T0 + 2 * DAY
    day.loop.handle(ev.ReleaseRequested("release", "2"), day.now)
    day.run()
    assert day.records["2"].state == "COMPLETED"


def test_full_disk_keeps_the_acct_row(tmp_path):
    with small_tmpfs(tmp_path / "state", "2m") as state:
        day = FakeDay(state)
        day.submit("1", "ann", 1, T0, 50)
        day.run(until=T0 + 10)  # running
        filler = state / "filler"
        with open(filler, "wb") as fh:  # fill the disk
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError:
                pass
        day.run()  # it finishes: its writes (and row) cannot be committed
        assert day.journal.pending and day.records["1"].state == "COMPLETED"
        assert [r["job_id"] for r in day.accounting.rows()] == ["1"]  # shown from memory meanwhile
        filler.unlink()
        assert day.journal.retry()
        day.journal.close()
        db = sqlite3.connect(state / "journal.sqlite")
        assert db.execute("SELECT job_id FROM accounting").fetchall() == [("1",)]
        db.close()


# ---------------------------------------------------------------- a real meshd: mesh acct, retention's sweep

def _on_loop(loop, fn) -> None:
    import asyncio

    async def call():
        fn()

    asyncio.run_coroutine_threadsafe(call(), loop).result(10)


def test_mesh_acct_and_retention_sweep(served_on_loop, mesh, tmp_path):
    d, loop = served_on_loop
    ids = [json.loads(mesh("submit", "--json", "--name", n, *cmd).stdout)["job_id"] for n, cmd in
           (("ok", ["/bin/true"]), ("bad", ["/bin/false"]), ("long", ["/bin/sleep", "60"]))]
    ok, bad, long = ids
    poll(lambda: d.records[ok].state == "COMPLETED" and d.records[bad].state == "FAILED", what="two jobs ended")
    poll(lambda: d.records[long].state == "RUNNING", what="the third runs")
    rows = json.loads(mesh("acct", "--json").stdout)  # in the order they ended: either may end first
    assert sorted(r["job_id"] for r in rows) == sorted([ok, bad])  # ended jobs only
    by_id = {r["job_id"]: r for r in rows}
    assert by_id[bad]["exit_code"] == 1 and by_id[bad]["state"] == "FAILED" and by_id[ok]["nodes"] == ["n1"]
    assert [r["end"] for r in rows] == sorted(r["end"] for r in rows)
    assert [r["job_id"] for r in json.loads(mesh("acct", "--json", "--state", "failed").stdout)] == [bad]
    assert json.loads(mesh("acct", "--json", "--since", "-1d", "--until", "now").stdout) == rows
    assert json.loads(mesh("acct", "--json", "--until", "-1d").stdout) == []
    assert json.loads(mesh("acct", "--json", "--user", "nobody-else").stdout) == []
    csv = mesh("acct", "--csv").stdout.splitlines()
    assert csv[0].startswith("job_id,user,tenant") and len(csv) == 3
    table = mesh("acct").stdout
    assert "GPU-HOURS" in table and "bad" in table
    total = json.loads(mesh("acct", "--summary", "--json").stdout)
    assert total["total"]["jobs"] == 2 and list(total["tenants"]) == ["default"]
    bad_since = mesh("acct", "--since", "yesterday")
    assert bad_since.exit_code == 2 and bad_since.stderr.count("\n") == 1 and "--since" in bad_since.stderr
    # retention: the two ended jobs leave ls, the journal, the engine and their dirs; the running one stays
    dirs = [Path(d.records[j].job_dir) for j in ids]
    _on_loop(loop, lambda: d.retention.sweep(time.time() + 30 * DAY))
    poll(lambda: ok not in d.records and bad not in d.records, what="ended jobs forgotten")
    assert [j["job_id"] for j in json.loads(mesh("ls", "--all", "--json").stdout)] == [long]
    assert ok not in d.engine.state.jobs and long in d.engine.state.jobs
    db = sqlite3.connect(d.config.journal_path)
    assert [r[0] for r in db.execute("SELECT job_id FROM jobs")] == [long]
    assert not db.execute("SELECT 1 FROM transitions WHERE job_id IN (?, ?)", (ok, bad)).fetchall()
    db.close()
    assert not dirs[0].exists() and not dirs[1].exists() and dirs[2].exists()
    assert json.loads(mesh("acct", "--json").stdout) == rows  # accounting keeps them
    assert mesh("show", ok).exit_code == 1


def test_acct_shows_a_user_only_their_own_rows(tmp_path, monkeypatch):
    from meshsched.cli.client import Client

    runtime = short_dir()
    cfg = replace(make_config(tmp_path / "state", runtime), submit_users="pann,pbob")
    monkeypatch.setenv("MESH_API_SOCKET", str(cfg.api_socket))
    ann, bob = Peer(50001, "pann"), Peer(50002, "pbob")
    asking = [ann]
    monkeypatch.setattr(users, "peer", lambda request: asking[0])
    monkeypatch.setattr(runs, "owner_of", lambda uid: None)  # jobs run as this test's user
    try:
        with daemon_in_thread(cfg) as (d, _):
            client = Client()
            mine = client.call("POST", "/v1/jobs", {"command": ["/bin/true"], "cwd": "/tmp"})["job_id"]
            asking[0] = bob
            his = client.call("POST", "/v1/jobs", {"command": ["/bin/true"], "cwd": "/tmp"})["job_id"]
            poll(lambda: {d.records[mine].state, d.records[his].state} == {"COMPLETED"}, what="both ended")
            assert [r["job_id"] for r in client.call("GET", "/v1/acct")] == [his]
            assert list(client.call("GET", "/v1/acct?summary=1")["users"]) == ["pbob"]
            asking[0] = ann
            assert [r["job_id"] for r in client.call("GET", "/v1/acct?user=pbob")] == []
            assert [r["job_id"] for r in client.call("GET", "/v1/acct")] == [mine]
            asking[0] = Peer(None, "operator")
            assert sorted(r["job_id"] for r in client.call("GET", "/v1/acct")) == sorted([mine, his])
    finally:
        remove(runtime)


# ---------------------------------------------------------------- configuration

@pytest.mark.parametrize("env, word", [({"MESHD_KEEP_FINISHED": "a day"}, "keep_finished"),
                                       ({"MESHD_KEEP_JOB_DIRS": "-1"}, "keep_job_dirs"),
                                       ({"MESHD_KEEP_FINISHED": "inf"}, "keep_finished")])
def test_retention_keys_bad_values_are_one_line(tmp_path, env, word):
    with pytest.raises(ConfigError) as err:
        load_config(env={"HOME": str(tmp_path), **env})
    assert word in str(err.value) and "must be" in str(err.value) and "\n" not in str(err.value)


def test_retention_keys_from_toml_and_flags(tmp_path):
    toml = tmp_path / "meshd.toml"
    toml.write_text("keep_finished = 3600\nkeep_job_dirs = 0\n")
    cfg = load_config(toml, env={"HOME": str(tmp_path)})
    assert (cfg.keep_finished, cfg.keep_job_dirs) == (3600.0, 0.0)
    assert load_config(env={"HOME": str(tmp_path)}).keep_finished == DAY  # default: 24 h
    assert load_config(env={"HOME": str(tmp_path)}, overrides={"keep_job_dirs": 60.0}).keep_job_dirs == 60.0
    out = subprocess.run([sys.executable, "-m", "meshsched.daemon.main", "--keep-finished", "-5", "--state-dir",
                          str(tmp_path / "s")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "keep_finished" in out.stderr


def test_on_a_mesh_only_the_leader_proposes_what_retention_forgets(tmp_path):
    """Fails before: every node proposed the same JobsForgotten batch each sweep (N proposals for one forgetting)."""
    from types import SimpleNamespace

    from meshsched.daemon.retention import Retention

    proposed = []
    loop = SimpleNamespace(input=lambda e, queued=False: proposed.append(e), dispatch_queued=lambda: None,
                           sid=lambda kind: kind)
    old = SimpleNamespace(job_id="1", state="COMPLETED", end_time=T0, submit_time=T0)
    leader = [False]
    ctx = SimpleNamespace(config=SimpleNamespace(keep_finished=60.0, keep_job_dirs=0.0), records={"1": old},
                          engine=SimpleNamespace(state=SimpleNamespace(jobs={})), loop=loop,
                          proposes=lambda: leader[0])
    retention = Retention(ctx)
    retention.sweep(T0 + 3600)
    assert proposed == []  # a follower: the leader's proposal reaches it through the log
    leader[0] = True
    retention.sweep(T0 + 3600)
    assert [e.job_ids for e in proposed] == [("1",)]
