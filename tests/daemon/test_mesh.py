"""The mesh: meshd processes over a real etcd on loopback (daemon/mesh.py, daemon/eventlog.py).

The end-to-end tests run 3 meshd processes on fake GPUs plus one etcd (ttl 3 s) and are marked slow; the
codec and configuration tests are quick. Without the `etcd` binary the mesh tests are skipped with the line
that says how to install it (.ci/run installs it).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from meshsched.daemon.config import ConfigError, load_config
from meshsched.daemon.etcd_local import ETCD, NO_ETCD
from meshsched.daemon.eventlog import LOGGED, Entry, LogError

from meshsched import events as ev
from meshsched.state import Dependency, DependencyKind, ExecConfig, JobSpec, NodeSpec
from tests.support.mesh import local_mesh
from tests.support.daemon import poll, remove, short_dir

needs_etcd = pytest.mark.skipif(ETCD is None, reason=NO_ETCD)
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


# ------------------------------------------------------------------ the log's codec and the configuration

def test_every_logged_event_survives_the_log():
    spec = JobSpec("n1.4", 2, "resnet50", 64, 100, submit_time=5.0, name="x", user="u", deadline=9.0,
                   dependencies=(Dependency(DependencyKind.AFTEROK, "n2.1"),), time_limit=60.0, array_id="n1.4")
    samples = [
        ev.JobSubmitted("s", spec), ev.JobStarted("s", "j"), ev.IterationReport("s", "j", 3.0, 0.5),
        ev.JobPaused("s", "j", 7.0), ev.JobFinished("s", "j"), ev.JobFailed("s", "j", "boom", requeue=True),
        ev.CancelRequested("s", "j"), ev.NodeJoined("s", NodeSpec("n2", 4, "v100", 16384, "n2.lan", 40, 251.5)), ev.NodeLost("s", "n2"),
        ev.Tick("s", 3), ev.CheckpointSaved("s", "j", 5.0), ev.RankReport("s", "j", (0.1, 0.2)),
        ev.ReconfigureApplied("s", "j", ExecConfig(micro_batch=16, accumulation=2, mps_percentage=50)),
        ev.TotalDeclared("s", "j", 40), ev.HoldRequested("s", "j"), ev.ReleaseRequested("s", "j"),
        ev.RequeueRequested("s", "j"), ev.JobSubmitted("s", spec, held=True),
        ev.DrainChanged("s", "n2", (0, 3), True, "Xid 79", "root", 7.5),
        ev.JobsForgotten("s", ("j", "n1.4")),
        ev.GpuFault("s", 3, "n1.4", "illegal memory access"),
        ev.GpuFault("s", 0),
    ]
    assert {type(e).__name__ for e in samples} == set(LOGGED)
    for event in samples:
        entry = Entry(event, "n1", 12.5, 2, {"job_id": "j"}, "n1/0001")
        assert Entry.from_json(entry.to_json()) == entry


def test_an_unreadable_entry_is_one_error():
    with pytest.raises(LogError, match="unknown event type"):
        Entry.from_json('{"e": {"type": "Evil"}, "n": "x"}')
    with pytest.raises(LogError, match="unreadable"):
        Entry.from_json("not json")
    with pytest.raises(LogError, match="cannot cross the mesh"):
        Entry(ev.ModelFitted("s", object()), "n1").to_json()


def test_coordinator_table_and_environment(tmp_path):
    cfg_file = tmp_path / "meshd.toml"
    cfg_file.write_text('fake_gpus = 2\n[coordinator]\nbackend = "etcd"\nendpoints = ["http://10.0.0.1:2379"]\n'
                        "ttl = 9\nloop_wait = 3\nretry_timeout = 3\n")
    cfg = load_config(cfg_file, env={"MESHD_COORDINATOR_PREFIX": "/m2"})
    assert (cfg.coordinator.backend, cfg.coordinator.endpoints, cfg.coordinator.ttl, cfg.coordinator.prefix) == (
        "etcd", ("http://10.0.0.1:2379",), 9, "/m2")
    assert load_config(tmp_path / "meshd.toml", env={}).node_grace == 60.0
    cfg_file.write_text('[coordinator]\nbackend = "etcd"\nendpoints = ["ftp://x"]\n')
    with pytest.raises(ConfigError, match=r"meshd.toml: coordinator.endpoints: 'ftp://x' is not http"):
        load_config(cfg_file, env={})


# ------------------------------------------------------------------ bad endpoints: one line, meshd serves

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["silent", "not-etcd"])
def test_a_bad_endpoint_is_one_line_and_meshd_keeps_serving(tmp_path, kind):
    port = _free_port()
    server = None
    if kind == "not-etcd":  # an HTTP server that is not etcd
        server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
        poll(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, what="http.server")
    state, runtime = short_dir(), short_dir()
    conf = tmp_path / "meshd.toml"
    conf.write_text(f'[coordinator]\nbackend = "etcd"\nendpoints = ["http://127.0.0.1:{port}"]\nttl = 3\n'
                    "loop_wait = 1\nretry_timeout = 1\n")
    log = tmp_path / "meshd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "meshsched.daemon.main", "--config", str(conf), "--state-dir",
                                 str(state), "--runtime-dir", str(runtime), "--fake-gpus", "2"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        from meshsched.cli.client import Client, DaemonUnavailable

        client = Client(runtime / "api.sock")

        def serving():
            try:
                return client.call("GET", "/v1/health")["status"] == "running"
            except DaemonUnavailable:
                assert proc.poll() is None, log.read_text()
                return False

        poll(serving, what="meshd serving")
        want = "does not answer" if kind == "silent" else "is not etcd"
        poll(lambda: want in log.read_text(), what=f"the line '{want}'")
        time.sleep(2.5)  # it retries every loop_wait: still one line, no traceback, still serving
        text = log.read_text()
        assert text.count(want) == 1 and "Traceback" not in text, text
        assert client.call("GET", "/v1/health")["status"] == "running"
        assert client.call("GET", "/v1/nodes")[0]["mesh"]["synced"] is False
    finally:
        proc.terminate()
        proc.wait(10)
        if server is not None:
            server.kill()
        remove(state, runtime)


# ------------------------------------------------------------------ a mesh of three

RANKS = """\
import json, os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
out = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK")}
out["sum"] = float(t.item())
open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"]), "w").write(json.dumps(out))
dist.destroy_process_group()
"""


@pytest.fixture
def mesh():
    with local_mesh(3, gpus=2, ttl=3, node_grace=4.0, cpus=(3, 5, 7)) as m:
        # every node's engine has applied the three joins (a submit through a lagging one saw 2 GPUs: CI failed)
        poll(lambda: all(sum(n["alive"] for n in m.nodes_view(node)) == 3 for node in m.members),
             what="three nodes joined, as every node sees it")
        # each node's own CPUs and memory travel in its NodeJoined entry: every node sees the same figures
        views = [{v["name"]: (v["cpus"], v["memory_gb"]) for v in m.nodes_view(node)} for node in m.members]
        assert all(view == views[0] for view in views) and [views[0][f"n{i}"][0] for i in (1, 2, 3)] == [3, 5, 7]
        yield m


def _submit(client, code_or_argv, gpus: int = 1, cwd: str = "/tmp") -> str:
    argv = code_or_argv if isinstance(code_or_argv, list) else [sys.executable, "-c", code_or_argv]
    return client.call("POST", "/v1/jobs", {"command": argv, "gpus": gpus, "cwd": cwd, "env": {}})["job_id"]


def _states(client) -> dict[str, str]:
    return {j["job_id"]: j["state"] for j in client.call("GET", "/v1/jobs")}


@pytest.mark.slow
def test_mesh_elects_one_leader_runs_a_job_across_nodes_and_survives_the_leaders_death(mesh, tmp_path):
    leader = poll(mesh.leader, what="a leader")
    views = [mesh.nodes_view(n) for n in mesh.members]
    assert all(sum(v.get("leader", False) for v in view) == 1 for view in views)  # every node names the same one
    assert {next(v["name"] for v in view if v["leader"]) for view in views} == {leader.name}
    other = next(n for n in mesh.members if n is not leader)
    client = mesh.client(other)
    # a 4-rank job needs two 2-GPU nodes: one rank set, gloo across them
    out = tmp_path / "ranks"
    out.mkdir()
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    big = _submit(client, [sys.executable, str(script), str(out)], gpus=4, cwd=str(tmp_path))
    poll(lambda: _states(client).get(big) in TERMINAL, timeout=120, what="the 4-GPU job ends")
    assert _states(client)[big] == "COMPLETED"
    import json

    ranks = [json.loads((out / f"rank{r}").read_text()) for r in range(4)]
    assert [r["RANK"] for r in ranks] == ["0", "1", "2", "3"] and {r["WORLD_SIZE"] for r in ranks} == {"4"}
    assert {r["GROUP_RANK"] for r in ranks} == {"0", "1"} and {r["sum"] for r in ranks} == {10.0}
    # each rank's log is on the node that ran it; the other nodes name that node in one line
    for rank in range(4):
        answers = {n.name: mesh.client(n).raw("GET", f"/v1/jobs/{big}/logs?rank={rank}") for n in mesh.members}
        home = [name for name, (status, _, _) in answers.items() if status == 200]
        assert len(home) == 1, answers
        assert all(f"ran on node {home[0]}" in body.decode() for status, _, body in answers.values() if status == 404)
    # kill -9 the leader: another takes over, a submit through a survivor runs, nothing is lost
    running = _submit(client, "import time; time.sleep(4)")
    poll(lambda: _states(client).get(running) == "RUNNING", what="a job running")
    mesh.kill(leader)
    after = _submit(client, "pass")
    new = poll(lambda: (ld := mesh.leader()) is not None and ld is not leader and ld, timeout=30, what="a new leader")
    assert new is not leader
    poll(lambda: all(_states(client).get(j) == "COMPLETED" for j in (running, after)), timeout=60,
         what="jobs through the failover complete")
    # the dead node is declared lost after node_grace; started again it rejoins
    poll(lambda: not next(n for n in mesh.nodes_view(other) if n["name"] == leader.name)["alive"], timeout=30,
         what="the dead node counted lost")
    mesh.launch(leader)
    mesh.wait_up(leader)
    poll(lambda: all(n["alive"] for n in mesh.nodes_view(other)), timeout=30, what="the node rejoined")
    assert _states(mesh.client(leader)) == _states(client)  # it replayed the same log


@pytest.mark.slow
def test_etcd_down_running_jobs_finish_and_submits_run_later(mesh):
    client = mesh.client(mesh.members[1])
    running = _submit(client, "import time; time.sleep(6)")
    poll(lambda: _states(client).get(running) == "RUNNING", what="a job running")
    mesh.etcd.stop()
    t0 = time.monotonic()
    meanwhile = _submit(client, "pass")  # accepted into the local journal while etcd is away
    assert _states(client)[meanwhile] == "PENDING"
    time.sleep(max(0.0, 30 - (time.monotonic() - t0)))  # etcd down for 30 s
    mesh.etcd.start()
    poll(lambda: all(_states(client).get(j) == "COMPLETED" for j in (running, meanwhile)), timeout=60,
         what="the running job and the submit made meanwhile complete")
    assert "Traceback" not in mesh.log(mesh.members[1])


RESUMING = """\
import os, sys, time
ck = os.path.join(os.environ["MESH_CHECKPOINT_DIR"], "progress")
os.makedirs(os.path.dirname(ck), exist_ok=True)
try:
    step = int(open(ck).read())
except (OSError, ValueError):
    step = 0
with open(sys.argv[1], "a") as f:
    f.write(f"{step}\\n")
while step < 30:
    time.sleep(0.2)
    step += 1
    with open(ck + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(ck + ".tmp", ck)
"""


@pytest.mark.slow
def test_a_job_on_a_dead_server_resumes_from_its_checkpoint_on_another(mesh, tmp_path):
    import os
    import signal

    script, starts = tmp_path / "resume.py", tmp_path / "starts"
    script.write_text(RESUMING)
    client = mesh.client(mesh.members[0])
    job = _submit(client, [sys.executable, str(script), str(starts)], cwd=str(tmp_path))
    poll(lambda: starts.exists() and _states(client).get(job) == "RUNNING", what="the job running")
    progress = mesh.root / "checkpoints" / job / "progress"  # checkpoint_root is shared by the three nodes
    poll(lambda: progress.exists() and int(progress.read_text() or 0) >= 5, what="five steps done")
    where = next(j["node"] for j in client.call("GET", "/v1/jobs") if j["job_id"] == job)
    dead = next(n for n in mesh.members if n.name == where)
    mesh.kill(dead)  # the server dies: its meshd and the job's processes
    for pidfile in dead.state.glob(f"jobs/{job}/supervisor.pid"):
        os.killpg(int(pidfile.read_text().split()[0]), signal.SIGKILL)
    alive = next(n for n in mesh.members if n is not dead)
    poll(lambda: _states(mesh.client(alive)).get(job) == "COMPLETED", timeout=90, what="the job completes elsewhere")
    first, second = (int(x) for x in starts.read_text().split())
    assert first == 0 and second >= 5  # resumed, not started over
    assert next(j["node"] for j in mesh.client(alive).call("GET", "/v1/jobs") if j["job_id"] == job) != where


def test_progress_reports_reach_the_log_at_most_once_per_gap(tmp_path):
    """Every report is an entry each node applies: a job reporting every step must not flood the log."""
    from types import SimpleNamespace

    from meshsched.daemon.engine_loop import EngineLoop
    from meshsched.daemon.journal import JobRecord
    from meshsched.daemon.mesh_node import REPORT_GAP, ReportGate
    from meshsched.daemon.node import NodeDaemon

    from tests.support.daemon import make_config

    proposed = []
    d = NodeDaemon(make_config(tmp_path / "s", tmp_path / "r"))
    mesh = SimpleNamespace(propose=lambda event, run=None, record=None: proposed.append(event))
    d.loop = EngineLoop(None, None, d.records, None, {}, mesh=mesh)
    d.runs, d.reports = SimpleNamespace(launched={}), ReportGate()
    d.records["n1.1"] = JobRecord(job_id="n1.1", seq=1, gpus=1, model="m", batch_size=8, iterations=100,
                                  submit_time=0.0, name="x", user="u", deadline=None, guaranteed=False, command=["x"],
                                  cwd="/", env={}, job_dir=str(tmp_path / "j"))
    for step in range(1, 21):
        d.job_report("n1.1", float(step), 0.01, rank=0)
    assert [type(e).__name__ for e in proposed] == ["IterationReport"] and REPORT_GAP >= 1
    d.job_checkpoint("n1.1", 20.0)  # never thinned
    assert type(proposed[-1]).__name__ == "CheckpointSaved"


@pytest.mark.slow
def test_an_exit_that_never_reached_the_log_is_proposed_again_after_a_crash(mesh):
    """Found by benchmarks/failover.py: a job's exit waited in its node's outbox (etcd away, or a leader not yet
    elected) when that meshd was SIGKILLed; the journal had already forgotten the run, so the job stayed
    RUNNING in the mesh for ever (an acknowledged job never finished)."""
    client = mesh.client(mesh.members[0])
    job = _submit(client, "import time; time.sleep(2)")
    poll(lambda: _states(client).get(job) == "RUNNING", what="the job running")
    where = next(j["node"] for j in client.call("GET", "/v1/jobs") if j["job_id"] == job)
    node = next(n for n in mesh.members if n.name == where)
    mesh.etcd.stop()  # its exit cannot reach the log now
    poll(lambda: (node.state / "jobs" / job / "result.json").exists(), what="the job exited")
    time.sleep(0.5)
    mesh.kill(node)
    mesh.etcd.start()
    mesh.launch(node)
    mesh.wait_up(node)
    other = next(n for n in mesh.members if n is not node)
    poll(lambda: _states(mesh.client(other)).get(job) == "COMPLETED", timeout=60, what="the exit reaches the log")


@pytest.mark.slow
def test_a_cancel_that_never_reached_the_log_is_proposed_again_after_a_crash(mesh):
    """docs/coordinator.md listed it as a limit: a cancel acknowledged while etcd was away waited in the node's
    outbox; SIGKILL that meshd and the cancel was gone, the job ran to its end (COMPLETED, not CANCELLED)."""
    client = mesh.client(mesh.members[0])
    job = _submit(client, "import time; time.sleep(40)")
    poll(lambda: _states(client).get(job) == "RUNNING", what="the job running")
    node = mesh.members[1]  # the cancel goes through another node than the one that took the submit
    mesh.etcd.stop()  # the cancel cannot reach the log now
    mesh.client(node).call("POST", f"/v1/jobs/{job}/cancel")
    time.sleep(0.5)
    mesh.kill(node)
    mesh.etcd.start()
    mesh.launch(node)
    mesh.wait_up(node)
    poll(lambda: _states(client).get(job) in TERMINAL, timeout=60, what="the job ends")
    assert _states(client)[job] == "CANCELLED"
