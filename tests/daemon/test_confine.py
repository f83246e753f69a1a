"""Confinement (daemon/confine.py): each job's ranks run on the CPU ids meshd assigned it, disjoint between jobs
while the node's CPUs allow, kept across a meshd restart; a job past its memory limit (where a cgroup is
writable here) ends FAILED saying so; without a mechanism jobs run and meshd says limits are not enforced."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from meshsched.daemon.confine import (
    Confiner,
    Limits,
    allocated,
    format_cpus,
    job_limits,
    open_confiner,
    parse_cpus,
    pick_cpus,
    thread_env,
    usable_cpus,
)
from meshsched.daemon.node import NodeDaemon

from tests.support.daemon import (
    close_daemon,
    kill_sessions,
    make_config,
    py,
    release_cgroups,
    state,
    submit,
    wait_for,
)

# a rank that stays up and says what it was given
SHOW = "import os, time; print('omp', os.environ.get('OMP_NUM_THREADS'), flush=True); time.sleep(60)"


def allowed(pid: int) -> tuple[int, ...]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpus(line.split(":", 1)[1])
    raise AssertionError("no Cpus_allowed_list")


def test_cpu_lists_and_picks():
    assert format_cpus([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11" and parse_cpus("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    pool = tuple(range(8))
    a = pick_cpus(pool, 3, [])
    b = pick_cpus(pool, 3, [a])
    c = pick_cpus(pool, 4, [a, b])  # only 2 free: the 2 free ones, then the least used
    assert a == (0, 1, 2) and b == (3, 4, 5) and set(c) >= {6, 7} and len(c) == 4
    assert pick_cpus(pool, 20, []) == pool and pick_cpus((4,), 2, [(4,)]) == (4,)
    assert allocated(3, 10, 2, 4, 1) == 3 and allocated(None, 10, 4, 4, 2) == 5 and allocated(None, None, 1, 4, 2) == 8
    assert thread_env(4, 2, {"MKL_NUM_THREADS": "7"}) == {"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"}
    assert usable_cpus(0, 0) == tuple(sorted(os.sched_getaffinity(0)))


def test_supervisor_options():
    """--as-user and --cgroup in either order (an assignment's target was read after its pop: --cgroup was lost)."""
    from meshsched.daemon.supervisor import parse_args

    want = (Path("/j"), (5, 6, [7, 8]), "/cg/mesh-job-1-0")
    assert parse_args(["/j", "--as-user", "5:6:7,8", "--cgroup", "/cg/mesh-job-1-0"]) == want
    assert parse_args(["/j", "--cgroup", "/cg/mesh-job-1-0", "--as-user", "5:6:7,8"]) == want
    assert parse_args(["/j"]) == (Path("/j"), None, "")
    with pytest.raises(SystemExit):
        parse_args(["/j", "extra"])


def test_limits_from_the_allocation_and_systemd_properties():
    conf = Confiner(tuple(range(16)), True, "systemd")
    # 2 of a 4-GPU job's ranks here; it asked --cpus 12 --mem 40: half of each
    lim = job_limits(conf, (12, 40.0, 4), (None, None), 2, (16, 64.0, 8), [])
    assert lim == Limits(tuple(range(6)), 20.0, "systemd")
    assert conf.systemd_properties(lim) == ["-p", "AllowedCPUs=0-5", "-p", f"MemoryMax={20 * 2**30}"]
    # an allocator's per-GPU figures win; nothing asked: the node's share per GPU
    assert job_limits(conf, (12, 40.0, 4), (3, 5.0), 2, (16, 64.0, 8), []).memory_gb == 10.0
    assert job_limits(conf, (None, None, 1), (None, None), 1, (16, 64.0, 8), [lim.cpus]) == Limits((6, 7), 8.0, "systemd")
    assert Confiner((0, 1), False).limits(2, 4.0, []) == Limits((), 4.0, "")


def test_no_mechanism_is_logged_once_and_said(tmp_path, caplog):
    fs = tmp_path / "cgroup"
    fs.mkdir()
    (fs / "cgroup.controllers").write_text("cpu io pids\n")  # v2 without the memory controller
    own = tmp_path / "self-cgroup"
    own.write_text("0::/meshd\n")
    with caplog.at_level(logging.INFO, logger="meshd"):
        conf = open_confiner("auto", (0, 1), False, fs=fs, proc_cgroup=own)
    assert conf.memory_by == "" and conf.pin and "no memory controller" in conf.why_not
    assert [r.message for r in caplog.records if "not enforced" in r.message] == [
        "memory limits are not enforced on this node: the cgroup v2 hierarchy has no memory controller (jobs still "
        "run, each pinned to its CPUs)"]
    assert conf.view() == {"cpus": "affinity", "memory": "not enforced", "why": conf.why_not}
    assert open_confiner("cpus", (0,), True).memory_by == "" and not open_confiner("no", (0,), True).pin
    assert open_confiner("auto", (0,), True).memory_by == "systemd"


async def test_ranks_run_on_their_disjoint_cpus(daemon):
    d = daemon
    pool = d.launcher.confiner.pool
    if len(pool) < 2:
        pytest.skip(f"one usable CPU here ({pool}): no two disjoint sets")
    one, two = (submit(d, py(SHOW), gpus=1, iters=10) for _ in range(2))
    await wait_for(lambda: all(len(d.launcher.workers(j.job_id)) == 1 for j in (one, two)), what="ranks up")
    sets = []
    for job in (one, two):
        rec = d.records[job.job_id]
        (pid,) = d.launcher.workers(job.job_id)
        assert allowed(pid) == tuple(rec.cpu_ids) and rec.cpu_ids
        sets.append(set(rec.cpu_ids))
        view = d.listings.job_view(rec)
        assert view["cpu_ids"] == rec.cpu_ids and view["memory_limit_gb"] == rec.memory_limit_gb > 0
        log = Path(rec.job_dir) / "logs" / "rank0.log"
        await wait_for(lambda: log.exists() and "omp" in log.read_text(), what="rank's output")
        assert log.read_text().split()[:2] == ["omp", str(len(rec.cpu_ids))]
    assert not sets[0] & sets[1]
    assert d.listings.node_view()["confinement"]["cpus"] == "affinity"


async def test_restart_keeps_cpu_assignments(dirs):
    cfg = make_config(*dirs)
    d1 = NodeDaemon(cfg)
    await d1.start()
    pids = []
    try:
        if len(d1.launcher.confiner.pool) < 2:
            pytest.skip("one usable CPU here: no two disjoint sets")
        first = submit(d1, py(SHOW), gpus=1, iters=10)
        await wait_for(lambda: d1.launcher.workers(first.job_id), what="rank up")
        cpus = list(d1.records[first.job_id].cpu_ids)
        pids.append(d1.records[first.job_id].supervisor_pid)
        await d1.close()  # the job keeps running; the next meshd re-adopts it
        d2 = NodeDaemon(cfg)
        await d2.start()
        try:
            assert state(d2, first.job_id) == "RUNNING" and d2.records[first.job_id].cpu_ids == cpus
            second = submit(d2, py(SHOW), gpus=1, iters=10)
            await wait_for(lambda: d2.launcher.workers(second.job_id), what="second rank up")
            (pid,) = d2.launcher.workers(second.job_id)
            assert not set(allowed(pid)) & set(cpus) and allowed(pid) == tuple(d2.records[second.job_id].cpu_ids)
        finally:
            pids += [r.supervisor_pid for r in d2.records.values()]
            await d2.close()
    finally:
        if d1.status.value != "closed":
            await d1.close()
        kill_sessions(pids)
        release_cgroups(d1)


GREEDY = "b = bytearray(400 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint('survived', flush=True)\n"


async def test_a_job_past_its_memory_limit_fails_saying_so(daemon):
    d = daemon
    conf = d.launcher.confiner
    if not conf.memory_by.startswith("cgroup"):
        pytest.skip(f"memory limits are not enforced here ({conf.memory_by or conf.why_not})")
    job = submit(d, py(GREEDY), gpus=1, iters=10, memory_gb=0.125)
    await wait_for(lambda: state(d, job.job_id) in ("FAILED", "COMPLETED"), what="job ended")
    rec = d.records[job.job_id]
    assert rec.state == "FAILED" and rec.memory_enforced_by == conf.memory_by, rec.reason
    assert rec.reason.startswith("exceeded its memory limit of 0.125 GiB"), rec.reason
    assert not list(conf.parent.glob(f"mesh-job-{job.job_id}-*"))  # its cgroup is gone with it
    fine = submit(d, py("print('ok')"), gpus=1, iters=10, memory_gb=0.125)
    await wait_for(lambda: state(d, fine.job_id) in ("FAILED", "COMPLETED"), what="small job ended")
    assert state(d, fine.job_id) == "COMPLETED", d.records[fine.job_id].reason


async def test_without_memory_confinement_jobs_run_and_it_is_said(dirs):
    d = NodeDaemon(make_config(*dirs, confine="cpus"))
    await d.start()
    try:
        job = submit(d, py("print('ok')"), gpus=1, iters=10, memory_gb=0.125)
        await wait_for(lambda: state(d, job.job_id) in ("FAILED", "COMPLETED"), what="job ended")
        rec = d.records[job.job_id]
        assert rec.state == "COMPLETED" and rec.memory_enforced_by == "" and rec.memory_limit_gb == 0.125
        assert d.listings.node_view()["confinement"] == {"cpus": "affinity", "memory": "not enforced", "why": "confine = cpus"}
    finally:
        await close_daemon(d)


def test_mesh_nodes_says_when_memory_limits_are_not_enforced(monkeypatch, capsys):
    from meshsched.cli import jobs

    node = {"name": "n1", "alive": True, "total_gpus": 1, "free_gpus": 1, "gpus": [{"name": "v100"}], "cpus": 2,
            "memory_gb": 4.0, "backend": "fake", "policy": "sjf", "queue_length": 0}
    said = dict(node, confinement={"cpus": "affinity", "memory": "not enforced", "why": "confine = cpus"})
    monkeypatch.setattr(jobs, "api_call", lambda method, path: [said, dict(node, name="n2")])
    jobs.nodes()
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "n1: memory limits not enforced (confine = cpus)" and len(lines) == 4


@pytest.mark.parametrize("kind", ["cgroup v2", "cgroup v1"])
def test_job_cgroups_get_their_limit_and_go(tmp_path, kind):
    """The files a job cgroup is set up with (a plain directory stands in for the cgroup filesystem here; the
    real v1 hierarchy of this machine is exercised by the OOM test above)."""
    root = tmp_path / "jobs"
    root.mkdir()
    if kind == "cgroup v2":
        (root / "cgroup.subtree_control").write_text("memory\n")
    conf = open_confiner("auto", (0, 1), False, cgroup_root=root)
    assert (conf.memory_by, conf.parent) == (kind, root)
    path = Path(conf.make_cgroup("7", 2, conf.limits(1, 0.5, [])))
    assert path == root / "mesh-job-7-2"
    limit = path / ("memory.max" if kind == "cgroup v2" else "memory.limit_in_bytes")
    assert limit.read_text() == str(2**29)
    limit.unlink()
    assert conf.remove("7") and not path.exists()


def test_confine_config():
    from meshsched.daemon.config import ConfigError, load_config

    assert load_config(None, env={}).confine == "auto"
    assert load_config(None, env={"MESHD_CONFINE": "cpus"}, overrides={"confine": None}).confine == "cpus"
    with pytest.raises(ConfigError, match="confine must be auto, cpus or no"):
        load_config(None, env={"MESHD_CONFINE": "bogus"})
