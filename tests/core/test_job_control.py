"""Slurm-grade job control: dependencies, hold/release/requeue, time limits and throttled arrays.

First in the engine on a bare ClusterState (no clock: the times are passed in and the timer is the engine's
ScheduleTimer), then through meshd's API and the `mesh` command line (arrays, --wait, output patterns).
"""

from __future__ import annotations

import json

import pytest

from meshsched import events as ev
from meshsched.actions import Launch, Preempt, ScheduleTimer
from meshsched.state import Dependency, DependencyKind, JobSpec, JobState
from tests.support.engine import Harness

S = JobState
OK, ANY, NOTOK = DependencyKind.AFTEROK, DependencyKind.AFTERANY, DependencyKind.AFTERNOTOK


def submit(h: Harness, job_id: str, now: float, gpus: int = 1, iterations: int = 100, held: bool = False,
           deps: tuple = (), time_limit: float | None = None, array: str = "", limit: int = 0) -> list:
    spec = JobSpec(job_id, gpus, "m", 100 * gpus, iterations, submit_time=now, time_limit=time_limit,
                   dependencies=tuple(Dependency(k, j) for k, j in deps), array_id=array, array_limit=limit)
    return h(ev.JobSubmitted(h.sid(f"submit-{job_id}"), spec, held=held), now)


def launched(actions: list) -> list[str]:
    return [a.job_id for a in actions if isinstance(a, Launch)]


# ------------------------------------------------------------------------------------------ dependencies


def test_afterok_waits_for_a_completion_then_joins_the_queue():
    h = Harness()
    submit(h, "a", 0.0)
    out = submit(h, "b", 1.0, deps=[(OK, "a")])
    assert launched(out) == []
    assert h.job("b").state is S.PENDING and h.engine.pending_reason("b") == "Dependency"
    h.started("a", 2.0)
    h.engine.take_changed()
    out = h.finished("a", 10.0)
    assert launched(out) == ["b"]
    assert h.engine.take_changed() == ["a", "b"]  # meshd journals the jobs job control moved


@pytest.mark.parametrize("kind, ending, runs", [
    (OK, "fail", False), (OK, "cancel", False), (NOTOK, "finish", False), (NOTOK, "fail", True),
    (ANY, "fail", True), (ANY, "cancel", True), (ANY, "finish", True), (OK, "finish", True),
])  # fmt: skip
def test_each_kind_is_met_or_cancelled_never_left_waiting(kind, ending, runs):
    h = Harness()
    submit(h, "a", 0.0)
    h.started("a", 1.0)
    submit(h, "b", 1.0, deps=[(kind, "a")])
    {"fail": lambda: h.failed("a", 5.0), "finish": lambda: h.finished("a", 5.0),
     "cancel": lambda: h(ev.CancelRequested(h.sid("c"), "a"), 5.0)}[ending]()
    b = h.job("b")
    if runs:
        assert b.state is S.LOADING
    else:
        assert b.state is S.CANCELLED and b.reason == "DependencyNeverSatisfied"


def test_a_never_satisfiable_dependency_cascades_and_an_unknown_job_is_refused_at_once():
    h = Harness()
    submit(h, "a", 0.0, iterations=10)
    h.started("a", 1.0)
    submit(h, "b", 1.0, deps=[(OK, "a")])
    submit(h, "c", 1.0, deps=[(OK, "b")])
    submit(h, "d", 1.0, deps=[(NOTOK, "b")])  # b ends CANCELLED: not ok, so d runs (as in Slurm)
    h.failed("a", 2.0)
    assert [h.job(j).reason for j in "bc"] == ["DependencyNeverSatisfied"] * 2
    assert h.job("d").state is S.LOADING
    submit(h, "e", 3.0, deps=[(OK, "nope")])
    assert h.job("e").state is S.CANCELLED and h.job("e").reason == "DependencyNeverSatisfied"


def test_a_dependency_on_a_finished_job_is_met_at_submit():
    h = Harness()
    submit(h, "a", 0.0)
    h.started("a", 1.0)
    h.finished("a", 2.0)
    assert launched(submit(h, "b", 3.0, deps=[(OK, "a"), (ANY, "a")])) == ["b"]


# ------------------------------------------------------------------------------------------ hold / release


def test_hold_at_submit_and_release():
    h = Harness()
    assert launched(submit(h, "a", 0.0, held=True)) == []
    assert h.engine.pending_reason("a") == "JobHeldUser"
    out = h(ev.ReleaseRequested(h.sid("rel"), "a"), 1.0)
    assert launched(out) == ["a"]


def test_hold_a_queued_job_keeps_it_out_until_released_and_is_ignored_for_a_running_one():
    h = Harness()
    submit(h, "big", 0.0, gpus=4)
    submit(h, "a", 0.0)
    h(ev.HoldRequested(h.sid("hold"), "a"), 1.0)
    h(ev.HoldRequested(h.sid("hold"), "big"), 1.0)  # running: nothing happens
    assert h.job("big").state is S.LOADING and not h.job("big").held
    out = h.finished("big", 5.0)
    assert launched(out) == [] and h.job("a").state is S.PENDING
    assert launched(h(ev.ReleaseRequested(h.sid("rel"), "a"), 6.0)) == ["a"]


def test_a_policy_that_names_a_held_job_is_not_obeyed():
    """A policy may find a job by its state (Lazer's deferrals): held or waiting, it is not started."""
    from meshsched.policies.base import Start

    class Eager:
        def __init__(self, real):
            self.real = real

        def __getattr__(self, name):
            return getattr(self.real, name)

        def schedule(self, view, now, trigger):
            return [Start("a", (0,), "eager")]

    h = Harness()
    submit(h, "a", 0.0, held=True)
    h.engine.policy = Eager(h.engine.policy)
    out = submit(h, "b", 1.0)  # a pass, in which the policy names only the held job
    assert launched(out) == [] and h.job("a").state is S.PENDING and h.job("a").held
    assert any("ignored Start: JobHeldUser" in e.message for e in h.engine.explain("a"))


def test_cancel_of_a_held_job():
    h = Harness()
    submit(h, "a", 0.0, held=True)
    h(ev.CancelRequested(h.sid("c"), "a"), 1.0)
    assert h.job("a").state is S.CANCELLED
    assert h.engine.queue_length == 0


def test_requeue_checkpoints_and_queues_again():
    h = Harness()
    submit(h, "a", 0.0)
    h.started("a", 1.0)
    out = h(ev.RequeueRequested(h.sid("rq"), "a"), 2.0)
    assert [type(a) for a in out] == [Preempt] and h.job("a").state is S.PAUSING
    out = h.paused("a", 40.0, 3.0)
    assert launched(out) == ["a"]  # queued again and, the GPUs being free, started from its checkpoint
    assert [a.resume_from for a in out if isinstance(a, Launch)] == [40.0]


# ------------------------------------------------------------------------------------------ time limits


def test_a_time_limit_arms_the_engines_timer_and_ends_the_job_as_timeout():
    h = Harness()
    out = submit(h, "a", 0.0, time_limit=90.0)
    assert [a.at for a in out if isinstance(a, ScheduleTimer)] == [90.0]
    h.started("a", 1.0)
    out = h(ev.Tick(h.sid("tick"), h.engine.timers.key), 90.0)
    assert [type(a) for a in out] == [Preempt]  # a checkpoint first (the SDK's checkpoint-and-exit)
    assert h.job("a").state is S.PAUSING and h.job("a").reason == "TimeLimit"
    h.paused("a", 50.0, 91.0)
    assert h.job("a").state is S.TIMEOUT and h.job("a").state.is_terminal
    assert h.job("a").done_iterations == 50.0


def test_a_job_that_finishes_in_time_disarms_its_limit():
    h = Harness()
    submit(h, "a", 0.0, time_limit=90.0)
    h.started("a", 1.0)
    out = h.finished("a", 10.0)
    assert h.job("a").state is S.COMPLETED
    assert not [a for a in out if isinstance(a, ScheduleTimer)] and h.engine.timers.at is None
    # the stale timer, if it fires, does nothing
    assert h(ev.Tick(h.sid("tick"), h.engine.timers.key), 90.0) == []


def test_timeout_satisfies_afterany_and_afternotok_not_afterok():
    h = Harness()
    submit(h, "a", 0.0, time_limit=5.0)
    h.started("a", 0.5)
    submit(h, "ok", 0.0, deps=[(OK, "a")])
    submit(h, "notok", 0.0, deps=[(NOTOK, "a")])
    h(ev.Tick(h.sid("tick"), h.engine.timers.key), 5.0)
    h.paused("a", 1.0, 6.0)
    assert h.job("ok").reason == "DependencyNeverSatisfied"
    assert h.job("notok").state is S.LOADING


def test_a_begin_time_keeps_the_job_out_until_the_engines_timer_says_so():
    h = Harness()
    spec = JobSpec("a", 1, "m", 100, 100, submit_time=0.0, begin_time=50.0)
    out = h(ev.JobSubmitted(h.sid("submit"), spec), 0.0)
    assert launched(out) == [] and h.engine.pending_reason("a") == "BeginTime"
    assert [a.at for a in out if isinstance(a, ScheduleTimer)] == [50.0]
    assert launched(h(ev.Tick(h.sid("tick"), h.engine.timers.key), 50.0)) == ["a"]
    spec = JobSpec("b", 1, "m", 100, 100, submit_time=60.0, begin_time=10.0)  # already past: queued at once
    assert launched(h(ev.JobSubmitted(h.sid("submit"), spec), 60.0)) == ["b"]


# ------------------------------------------------------------------------------------------ arrays


def test_a_throttled_array_runs_at_most_n_tasks_at_once_in_task_order():
    h = Harness(nodes=(("n0", 8),))
    started = []
    for t in range(6):
        started += launched(submit(h, f"7_{t}", 0.0, array="7", limit=2))
    assert started == ["7_0", "7_1"]
    assert h.engine.pending_reason("7_2") == "JobArrayTaskLimit"
    h.started("7_0", 1.0)
    assert launched(h.finished("7_0", 2.0)) == ["7_2"]
    h(ev.CancelRequested(h.sid("c"), "7_3"), 2.5)  # a waiting task cancelled: never started later
    h(ev.HoldRequested(h.sid("h"), "7_1"), 2.6)  # LOADING: not held
    h.started("7_1", 3.0)
    assert launched(h.failed("7_1", 4.0)) == ["7_4"]
    assert sorted(j for j, job in h.state.jobs.items() if job.state.holds_gpus) == ["7_2", "7_4"]


def test_plain_jobs_take_none_of_the_job_control_paths():
    """Jobs without job-control options are queued as before: nothing blocked, no timer."""
    h = Harness()
    out = submit(h, "a", 0.0)
    assert launched(out) == ["a"] and not [a for a in out if isinstance(a, ScheduleTimer)]
    assert h.engine.control.blocked == {} and h.engine.control.limits == {}


# ------------------------------------------------------------------------------------------ meshd and `mesh`

from meshsched.cli.jobs import parse_time_limit  # noqa: E402
from meshsched.daemon.control import expand_pattern, parse_array, parse_dependency  # noqa: E402

from meshsched.wire.protocol import RequestError  # noqa: E402
from tests.support.daemon import poll  # noqa: E402

SLEEPS = "import os, sys, time\nprint('task', os.environ.get('MESH_ARRAY_TASK_ID'), flush=True)\n" \
         "time.sleep(float(sys.argv[1]))\nsys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)\n"


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(SLEEPS)
    return str(path)


def states(d, ids) -> list[str]:
    return [d.records[i].state for i in ids]


def test_formats():
    assert parse_array("0-299") == (tuple(range(300)), 0)
    assert parse_array("1,3,5-7%2") == ((1, 3, 5, 6, 7), 2)
    assert parse_array("0-15:4") == ((0, 4, 8, 12), 0)
    for bad in ("", "5-1", "a-b", "0-3%0", "0-3%x", "-1", "0-20000"):
        with pytest.raises(RequestError):
            parse_array(bad)
    assert parse_dependency("afterok:3:4,afterany:5_1") == (
        (OK, "3"), (OK, "4"), (ANY, "5_1"))
    for bad in ("after:3", "afterok", "afterok:", "3"):
        with pytest.raises(RequestError):
            parse_dependency(bad)
    assert [parse_time_limit(t) for t in ("90", "1:30", "1:30:00", "2-3", "1-0:01", "1-00:00:05")] == [
        5400, 90, 5400, 2 * 86400 + 3 * 3600, 86400 + 60, 86405]
    for bad in ("", "x", "1:2:3:4", "0", "-5", "1-"):
        with pytest.raises(SystemExit):
            parse_time_limit(bad)
    assert expand_pattern("o-%A_%a-%j.%u.%x.%%", job_id="7_2", array_id="7", task=2, user="ann", name="t") == \
        "o-7_2-7_2.ann.t.%"
    assert expand_pattern("%A-%a", job_id="9", array_id="", task=None, user="u", name="n") == "9-"
    with pytest.raises(RequestError):
        expand_pattern("%q", job_id="1", array_id="", task=None, user="u", name="n")


def test_an_array_is_one_request_with_distinct_tasks_and_their_task_ids(served, mesh, script, tmp_path):
    r = mesh("submit", script, "--array", "0-5%2", "--json", "--", "0.2")
    assert r.exit_code == 0, r.output
    answer = json.loads(r.stdout)
    array, ids = answer["array_id"], answer["job_ids"]
    assert ids == [f"{array}_{t}" for t in range(6)] and answer["tasks"] == 6
    listed = mesh("ls", array).stdout
    assert "JobArrayTaskLimit" in listed  # %2: four tasks wait for a slot although GPUs are free
    poll(lambda: set(states(served, ids)) == {"COMPLETED"}, what="every task completed")
    for t, job_id in enumerate(ids):
        assert mesh("logs", job_id).stdout.strip() == f"task {t}"
    history = sorted((served.records[i].start_time, served.records[i].end_time) for i in ids)
    for k, (start, _) in enumerate(history):  # never more than two at once
        assert sum(1 for s, e in history if s <= start < e) <= 2, history
    assert len(json.loads(mesh("ls", array, "--json").stdout)) == 6


def test_cancel_an_array_cancels_every_task(served, mesh, script):
    r = mesh("submit", script, "--array", "1,3,5-7", "--", "60")
    assert r.exit_code == 0 and r.stdout.startswith("Submitted array job"), r.output
    array = r.stdout.split()[3]
    ids = [f"{array}_{t}" for t in (1, 3, 5, 6, 7)]
    poll(lambda: states(served, ids).count("RUNNING") == 4, what="four tasks running")
    r = mesh("cancel", array)
    assert r.exit_code == 0 and "cancelled 5 task(s)" in r.stdout, r.output
    poll(lambda: set(states(served, ids)) == {"CANCELLED"}, what="every task cancelled")
    r = mesh("cancel", array)
    assert r.exit_code == 3 and "5 had already ended" in r.stdout


def test_dependencies_wait_then_run_or_are_cancelled(served, mesh, script):
    first = mesh("submit", script, "--", "1").stdout.split()[-1]
    bad = mesh("submit", script, "--", "0.2", "3").stdout.split()[-1]
    ok = mesh("submit", script, "--dependency", f"afterok:{first}", "--", "0").stdout.split()[-1]
    never = mesh("submit", script, "-d", f"afterok:{bad}", "--", "0").stdout.split()[-1]
    notok = mesh("submit", script, "-d", f"afternotok:{bad},afterany:{first}", "--", "0").stdout.split()[-1]
    lines = {ln.split()[0]: ln for ln in mesh("ls").stdout.splitlines()[1:]}
    assert "(Dependency)" in lines[ok]
    poll(lambda: states(served, [first, bad, ok, never, notok]) ==
         ["COMPLETED", "FAILED", "COMPLETED", "CANCELLED", "COMPLETED"], what="the chain settled")
    assert served.records[never].reason == "DependencyNeverSatisfied"
    r = mesh("submit", script, "-d", "afterok:999", "--", "0")
    assert r.exit_code == 1 and "no job or array 999" in r.stderr and "Traceback" not in r.output


def test_a_time_limit_ends_the_job_as_timeout(served, mesh, script):
    r = mesh("submit", script, "--time", "0:01", "--", "60")
    job = r.stdout.split()[-1]
    # (the daemon's thread sets the record's state, then its end time: wait for both)
    poll(lambda: served.records[job].state == "TIMEOUT" and served.records[job].end_time is not None, timeout=20,
         what="TIMEOUT")
    rec = served.records[job]
    assert rec.reason == "TimeLimit" and 0.9 < rec.end_time - rec.start_time < 15
    assert not served.launcher.running(job)


def test_hold_release_requeue(served, mesh, script):
    held = mesh("submit", script, "--hold", "--", "30").stdout.split()[-1]
    lines = mesh("ls").stdout
    assert "(JobHeldUser)" in lines
    r = mesh("requeue", held)
    assert r.exit_code == 1 and "requeue takes a running job" in r.stderr
    assert mesh("release", held).exit_code == 0
    poll(lambda: served.records[held].state == "RUNNING", what="released job running")
    r = mesh("hold", held)
    assert r.exit_code == 1 and "cannot hold" in r.stderr and "RUNNING" in r.stderr
    pid = served.records[held].supervisor_pid
    assert mesh("requeue", held).exit_code == 0
    poll(lambda: served.records[held].state == "RUNNING" and served.records[held].supervisor_pid not in (0, pid),
         what="requeued and started again")
    assert served.records[held].restarts == 2
    assert mesh("cancel", held).exit_code == 0


def test_submit_wait_exits_with_the_jobs_code(served, mesh, script):
    r = mesh("submit", script, "--wait", "--", "0.3", "5")
    assert r.exit_code == 5 and "ended FAILED" in r.stderr, r.output
    r = mesh("submit", script, "--wait", "--array", "0-2", "--", "0.1")
    assert r.exit_code == 0, r.output


def test_output_and_error_patterns(served, mesh, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "talk.py"
    script.write_text("import os, sys\nprint('out', os.environ['RANK'])\nprint('err', os.environ['RANK'], "
                      "file=sys.stderr)\n")
    r = mesh("submit", str(script), "--gpus", "2", "--name", "talk", "--array", "4", "--wait",
             "-o", str(tmp_path / "o-%A-%a-%x.txt"), "-e", "e-%j.txt")
    assert r.exit_code == 0, r.output
    array = r.stdout.split()[3]
    out = (tmp_path / f"o-{array}-4-talk.txt").read_text()
    assert sorted(out.splitlines()) == ["out 0", "out 1"]
    err = (tmp_path / f"e-{array}_4.txt").read_text()  # relative to the submit's working directory
    assert sorted(err.splitlines()) == ["err 0", "err 1"]
    job_dir = served.records[f"{array}_4"].job_dir
    from pathlib import Path

    assert sorted((Path(job_dir) / "logs" / "rank1.log").read_text().splitlines()) == ["err 1", "out 1"]
    r = mesh("submit", str(script), "--wait", "-o", str(tmp_path / "no" / "such" / "%j"))
    assert r.exit_code == 1 and "cannot open" in r.stderr
    r = mesh("submit", str(script), "-o", "x-%z")
    assert r.exit_code == 1 and "%z is not known" in r.stderr


async def test_job_control_survives_a_restart(dirs):
    """Holds, dependencies (also on a job that ended before the restart) and a running job's time limit are
    journaled and rebuilt by the next meshd."""
    from meshsched.daemon.control import ControlRequest
    from meshsched.daemon.node import NodeDaemon

    from meshsched.wire.protocol import SubmitRequest
    from tests.support.daemon import kill_sessions, make_config, wait_for

    cfg = make_config(*dirs)
    d1 = NodeDaemon(cfg)
    await d1.start()
    daemons = [d1]

    def submit(d, command, **ctl) -> str:
        return d.submission.submit(SubmitRequest(command=command, cwd="/tmp"), ControlRequest(**ctl), "t")[0].job_id

    try:
        quick = submit(d1, ["sleep", "0.3"], hold=False, time_limit=600.0)
        limited = submit(d1, ["sleep", "60"], time_limit=600.0)
        held_after_quick = submit(d1, ["sleep", "60"], hold=True, dependency=((OK, quick),))
        waits = submit(d1, ["sleep", "60"], dependency=((OK, limited),))
        await wait_for(lambda: d1.records[quick].state == "COMPLETED", what="quick job completed")
        await wait_for(lambda: d1.records[limited].state == "RUNNING", what="limited job running")
        limit_at = d1.records[limited].time_limit_at
        assert limit_at is not None
        await d1.close()
        d2 = NodeDaemon(cfg)
        await d2.start()
        daemons.append(d2)
        assert d2.engine.pending_reason(held_after_quick) == "JobHeldUser"
        assert d2.engine.pending_reason(waits) == "Dependency"
        assert d2.engine.state.jobs[limited].time_limit_at == limit_at  # its original end, not 600 s from now
        d2.control.release(held_after_quick)  # its dependency ended (met) before the restart
        await wait_for(lambda: d2.records[held_after_quick].state == "RUNNING", what="released job running")
        d2.cancel(limited)
        await wait_for(lambda: d2.records[waits].state == "CANCELLED", what="dependent cancelled")
        assert d2.records[waits].reason == "DependencyNeverSatisfied"
    finally:
        pids = [r.supervisor_pid for d in daemons for r in d.records.values()]
        for d in daemons:
            await d.close()
        kill_sessions(pids)


def test_a_lost_journal_never_reuses_an_array_id(tmp_path):
    from meshsched.daemon.dirs import highest_job_dir

    for name in ("3", "12_0", "12_299", "notes"):
        (tmp_path / name).mkdir()
    assert highest_job_dir(tmp_path) == 12  # before: 3, and the next array would have taken 12_0's directory


def test_hold_and_release_an_array_by_its_id(served, mesh, script):
    blocker = mesh("submit", script, "--gpus", "4", "--", "60").stdout.split()[-1]
    r = mesh("submit", script, "--array", "0-2", "--", "0")
    array = r.stdout.split()[3]
    assert mesh("hold", array).stdout.strip() == f"hold {array}: 3 task(s)"
    assert mesh("ls", array, "--array-unfold").stdout.count("(JobHeldUser)") == 3
    mesh("cancel", blocker)
    assert mesh("release", array).exit_code == 0
    poll(lambda: set(states(served, [f"{array}_{t}" for t in range(3)])) == {"COMPLETED"}, what="released tasks ran")
    r = mesh("release", array)
    assert r.exit_code == 1 and "it is COMPLETED; only a held job that has not ended can be released" in r.stderr


def test_cancel_by_filters_and_signal_in_one_request(served, mesh, tmp_path):
    script = tmp_path / "trap.py"
    script.write_text("import signal, sys, time\nsignal.signal(signal.SIGUSR1, lambda *_: print('got USR1', "
                      "flush=True))\nprint('up', flush=True)\ntime.sleep(60)\n")
    a = mesh("submit", str(script), "--name", "keep").stdout.split()[-1]
    b = mesh("submit", str(script), "--name", "drop").stdout.split()[-1]
    c = mesh("submit", str(script), "--name", "drop", "--hold").stdout.split()[-1]
    poll(lambda: states(served, [a, b]) == ["RUNNING"] * 2 and "up" in mesh("logs", b).stdout, what="running")
    r = mesh("cancel", "--name", "drop", "--signal", "USR1")
    assert r.exit_code == 0 and f"job {b}: 1 rank(s) got signal 10" in r.stdout, r.output
    poll(lambda: "got USR1" in mesh("logs", b).stdout, what="the rank got the signal")
    assert served.records[b].state == "RUNNING"  # signalled, not cancelled
    r = mesh("cancel", "--name", "drop", "--state", "PENDING")
    assert r.exit_code == 0 and r.stdout.strip() == f"job {c}: CANCELLED"
    r = mesh("cancel", "--name", "drop")
    assert r.exit_code == 0 and r.stdout.strip() in (f"job {b}: COMPLETING", f"job {b}: CANCELLED"), r.output
    poll(lambda: states(served, [a, b, c]) == ["RUNNING", "CANCELLED", "CANCELLED"], what="only the named ones")
    r = mesh("cancel", "--name", "drop")
    assert r.exit_code == 3 and "no unfinished job matched" in r.stdout
    for bad, msg in ((["--state", "DONE"], "not a state"), (["--signal", "NOPE", a], "not a signal"), ([], "name")):
        r = mesh("cancel", *bad)
        assert r.exit_code in (1, 2) and msg in r.stderr and "Traceback" not in r.output, (bad, r.output)
    r = mesh("cancel", "--me")
    assert r.exit_code == 0 and a in r.stdout


def test_begin(served, mesh, script):
    from meshsched.cli.jobs import parse_begin

    assert parse_begin("now+90", 1000.0) == 1090.0 and parse_begin("now+2hours", 0.0) == 7200.0
    assert parse_begin("now+5m", 0.0) == 300.0
    with pytest.raises(SystemExit):
        parse_begin("soon", 0.0)
    job = mesh("submit", script, "--begin", "now+2", "--", "0").stdout.split()[-1]
    assert "(BeginTime)" in mesh("ls", job).stdout
    poll(lambda: served.records[job].state == "COMPLETED", what="started after its begin time")
    rec = served.records[job]
    assert rec.start_time >= rec.begin_time


def test_show_names_job_control_and_an_array_id_says_what_it_is(served, mesh, script):
    r = mesh("submit", script, "--array", "0-1", "--hold", "--time", "90", "-o", "/tmp/x-%j", "--", "0")
    array = r.stdout.split()[3]
    shown = mesh("show", f"{array}_1").stdout
    for line in (f"array: {array} task 1", "time_limit: 1:30:00", "held: yes", f"stdout: /tmp/x-{array}_1"):
        assert line in shown, shown
    r = mesh("show", array)
    assert r.exit_code == 1 and f"{array} is an array of 2 tasks" in r.stderr
    mesh("cancel", array)
