"""Rubick's real path in meshd (issue 14): `mesh submit --plan --cpus --mem --tenant`, refusals of jobs that could
never run (one line, nothing queued), MESH_PLAN in the job and the SDK, and a 2-rank job reconfigured from data
parallel to accumulation + activation checkpointing and back whose losses match an uninterrupted run."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshsched.job import MeshEnv, Session
from meshsched.wire.protocol import RequestError, SubmitRequest
from tests.support.daemon import PY, kill_sessions, remove, short_dir, start_meshd

TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "train.py")

# -- the request and the SDK (no daemon) ---------------------------------------------------------------------


def _req(**kw) -> SubmitRequest:
    return SubmitRequest.from_json({"command": ["x"], "cwd": "/tmp", **kw})


def test_submit_request_takes_plan_resources_and_tenant_in_canonical_form():
    req = _req(gpus=2, plan="gc-ga2-dp2", cpus=8, memory_gb=64, tenant="teamA")
    assert (req.plan, req.cpus, req.memory_gb, req.tenant) == ("dp2-tp1-pp1-ga2-gc", 8, 64.0, "teamA")
    plain = _req()
    assert (plain.plan, plain.cpus, plain.memory_gb, plain.tenant) == (None, None, None, "default")


@pytest.mark.parametrize("body,why", [
    ({"gpus": 2, "plan": "dp2-xx"}, "unknown token 'xx'"),
    ({"gpus": 2, "plan": "dp4"}, "uses 4 GPU(s)"),
    ({"plan": "dp1-off"}, "needs a ZeRO stage"),
    ({"cpus": 0}, "cpus must be an integer >= 1"),
    ({"cpus": 1.5}, "cpus must be an integer"),
    ({"memory_gb": -1}, "memory_gb must be a number of GB > 0"),
    ({"memory_gb": "lots"}, "memory_gb"),
    ({"tenant": " "}, "tenant must not be empty"),
    ({"tenant": "a\nb"}, "control characters"),
])  # fmt: skip
def test_bad_plan_and_resource_fields_are_one_line_errors(body, why):
    with pytest.raises(RequestError) as err:
        _req(**body)
    assert why in str(err.value) and "\n" not in str(err.value)


def test_the_sdk_reads_mesh_plan_and_takes_its_accumulation():
    env = MeshEnv.read({"MESH_PLAN": "dp2-ga4-gc", "WORLD_SIZE": "2", "MESH_ACCUM_STEPS": "1"})
    assert env.plan == "dp2-tp1-pp1-ga4-gc"
    plan = env.execution_plan()
    assert (plan.dp, plan.ga, plan.gc, plan.zero) == (2, 4, True, 0)
    sess = Session(env, handle_sigterm=False, rng=False)
    assert sess.plan == plan and sess.accum_steps == 4  # the plan's gaN: the same global batch, in 4 micro-batches
    assert Session(env, accum_steps=2, handle_sigterm=False, rng=False).accum_steps == 2  # the script's own wins
    none = MeshEnv.read({"MESH_ACCUM_STEPS": "3"})
    assert none.plan is None and none.execution_plan() is None
    assert Session(none, handle_sigterm=False, rng=False).accum_steps == 3
    with pytest.raises(ValueError, match="MESH_PLAN='dp2-zz'"):
        MeshEnv.read({"MESH_PLAN": "dp2-zz"})


# -- bad input at `mesh submit`, through a real meshd ----------------------------------------------------------


@pytest.fixture
def rubick_meshd(tmp_path):
    runtime = short_dir()
    proc, client = start_meshd(tmp_path / "state", runtime, "--fake-gpus", "4", "--policy", "rubick:quotas=teamA=2",
                               "--node-name", "rb", "--node-cpus", "48", "--node-memory-gb", "800",  # the paper's
                               env=dict(os.environ, MESHD_SYSTEMD_SCOPE="no"))  # share per GPU, whatever runs CI
    yield client, runtime
    pids = [j["supervisor_pid"] for j in client.call("GET", "/v1/jobs?all=1")]
    proc.terminate()
    proc.wait(10)
    kill_sessions(pids)
    remove(runtime)


def _mesh(runtime: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MESH_API_SOCKET=str(runtime / "api.sock"))
    return subprocess.run([PY, "-m", "meshsched.cli.main", *args], env=env, capture_output=True, text=True, timeout=60)


REFUSED = [
    (["--model", "llama7", "--gpus", "1", "--plan", "dp1"], "needs ~183 GB per GPU; a GPU has 80 GB (out of memory)"),
    (["--model", "gpt2", "--gpus", "2", "--plan", "dp2-ga3"], "does not split into dp2 x ga3"),
    (["--model", "gpt2", "--gpus", "4", "--guaranteed", "--tenant", "teamB"], "tenant teamB's quota, which is 0"),
    (["--model", "gpt2", "--gpus", "4", "--guaranteed", "--tenant", "teamA"], "tenant teamA's quota, which is 2"),
    (["--model", "gpt2", "--cpus", "1000"], "asks for 1000 CPUs"),
    (["--model", "gpt2", "--mem", "100000G"], "asks for 100000 GB of memory"),
    (["--model", "gpt2", "--gpus", "2", "--plan", "dp2-tp2"], "uses 4 GPU(s) (dp x tp x pp) but the job asks for 2"),
    (["--model", "gpt2", "--mem", "lots"], "--mem 'lots': give host memory in GB"),
    (["--model", "gpt2", "--cpus", "0"], "--cpus must be at least 1"),
]


def test_mesh_submit_refuses_what_could_never_run_in_one_line_and_queues_nothing(rubick_meshd, tmp_path):
    client, runtime = rubick_meshd
    script = tmp_path / "job.py"
    script.write_text("pass\n")
    for args, why in REFUSED:
        for array in ([], ["--array", "0-1"]):  # the plain path and job control's (arrays, dependencies, ...)
            r = _mesh(runtime, "submit", str(script), *args, *array)
            assert r.returncode != 0 and r.stdout == "", (args, r)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("mesh: error: ") and why in lines[0], (args, r.stderr)
    assert client.call("GET", "/v1/jobs?all=1") == []  # nothing queued, nothing journaled
    # what can run is taken, with what it asked for on its record
    r = _mesh(runtime, "submit", str(script), "--model", "gpt2", "--gpus", "2", "--plan", "dp2-ga2-gc",
              "--cpus", "8", "--mem", "64", "--tenant", "teamA", "--guaranteed", "--json")
    assert r.returncode == 0, r.stderr
    (job,) = client.call("GET", "/v1/jobs?all=1")
    assert (job["plan"], job["cpus"], job["memory_gb"], job["tenant"], job["guaranteed"]) == (
        "dp2-tp1-pp1-ga2-gc", 8, 64.0, "teamA", True)
    assert job["job_id"] == "1"  # the refused ones took no id
    shown = _mesh(runtime, "show", "1").stdout
    running = (job["exec"] or {}).get("plan")  # Rubick may choose another plan for what it allocates
    asked = "plan asked" if running and running != job["plan"] else "plan"
    for line in (f"{asked}: dp2-tp1-pp1-ga2-gc", "cpus: 8", "memory (GB): 64.0", "tenant: teamA"):
        assert line in shown, shown


def test_a_small_node_refuses_what_its_real_cpus_and_memory_cannot_hold_and_mesh_nodes_shows_them(tmp_path):
    """The node's figures as meshd accounts them (here configured: 6 CPUs less 2 reserved, 32 GB less 8) are what
    a submit is checked against and what `mesh nodes` shows."""
    runtime = short_dir()
    env = dict(os.environ, MESHD_SYSTEMD_SCOPE="no", MESHD_NODE_CPUS="6", MESHD_RESERVED_CPUS="2")
    proc, client = start_meshd(tmp_path / "state", runtime, "--fake-gpus", "2", "--policy", "rubick",
                               "--node-memory-gb", "32", "--reserved-memory-gb", "8", env=env)
    try:
        script = tmp_path / "job.py"
        script.write_text("pass\n")
        for args, why in ((["--cpus", "5"], "asks for 5 CPUs over 1 GPU(s) (5 per GPU); no node has that many for "
                                            "its share (the most a node has is 4)"),
                          (["--mem", "25"], "asks for 25 GB of memory over 1 GPU(s)"),
                          (["--gpus", "2", "--cpus", "6"], "the most a node has is 4")):
            r = _mesh(runtime, "submit", str(script), "--model", "gpt2", *args)
            lines = r.stderr.strip().splitlines()
            assert r.returncode != 0 and len(lines) == 1 and why in lines[0], (args, r.stderr)
        assert client.call("GET", "/v1/jobs?all=1") == []
        r = _mesh(runtime, "submit", str(script), "--model", "gpt2", "--cpus", "4", "--mem", "24", "--hold")
        assert r.returncode == 0, r.stderr  # all the node has for jobs is taken
        (node,) = json.loads(_mesh(runtime, "nodes", "--json").stdout)
        assert (node["cpus"], node["memory_gb"], node["total_gpus"]) == (4, 24.0, 2)
        table = _mesh(runtime, "nodes").stdout.splitlines()
        assert table[0].split()[5:7] == ["CPUS", "MEM(GB)"] and table[1].split()[5:7] == ["4", "24"]
    finally:
        pids = [j["supervisor_pid"] for j in client.call("GET", "/v1/jobs?all=1")]
        proc.terminate()
        proc.wait(10)
        kill_sessions(pids)
        remove(runtime)


# -- the plan reaches the job, and a reconfiguration between plans keeps the losses --------------------------

LOSS = re.compile(r"^step (\d+)/\d+ loss ([0-9.eE+-]+)$", re.M)
STEPS = 30
ARGS = ["--steps", str(STEPS), "--log-every", "1", "--checkpoint-every", "1000", "--batch-size", "64",
        "--dataset-size", "512"]
TOLERANCE = 1e-5  # relative; the measured difference is ~1e-7 (float32 sums in another order)


def _losses(text: str) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for s, v in LOSS.findall(text):
        out.setdefault(int(s), []).append(float(v))
    return out


async def _uninterrupted(tmp: Path) -> dict[int, list[float]]:
    """The same script, 2 ranks on gloo outside meshd, no plan: plain data parallel."""
    from meshsched.daemon.launcher import free_port

    port = str(free_port())
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MESH_")}
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   OMP_NUM_THREADS="1")
        with open(tmp / f"ref{rank}.log", "w") as out:
            procs.append(await asyncio.create_subprocess_exec(sys.executable, TRAIN, *ARGS, env=env, stdout=out,
                                                              stderr=subprocess.STDOUT))
    assert [await asyncio.wait_for(p.wait(), 120) for p in procs] == [0, 0]
    return _losses((tmp / "ref0.log").read_text())


def _run_of(log: str, plan: str) -> str:
    """The part of rank 0's log from the run that trained with `plan` on."""
    at = log.rfind(f"plan={plan} ")
    return log[at:] if at >= 0 else ""


@pytest.mark.slow
async def test_a_two_rank_job_reconfigured_to_accumulation_and_checkpointing_and_back_keeps_its_losses(daemon,
                                                                                                      tmp_path):
    from meshsched.executor import dispatch
    from meshsched.policies import base as pb
    from meshsched.state import ExecConfig, JobState
    from tests.support.daemon import wait_for

    pytest.importorskip("torch")
    d = daemon
    t0 = time.monotonic()
    want = await _uninterrupted(tmp_path)  # first: the machine is small, and the gloo ranks time out when starved
    t_ref = time.monotonic() - t0
    rec = d.submit(SubmitRequest(command=[sys.executable, TRAIN, *ARGS, "--step-sleep", "0.1"], cwd="/tmp", gpus=2,
                                 batch_size=64, iterations=STEPS, plan="dp2",
                                 env={"MESH_REPORT_INTERVAL": "0.1", "OMP_NUM_THREADS": "1"}), "tester")
    log = d.config.jobs_dir / rec.job_id / "logs" / "rank0.log"
    job = d.engine.state.jobs[rec.job_id]
    text = lambda: log.read_text() if log.exists() else ""  # noqa: E731

    def last_step(run: str) -> int:
        steps = LOSS.findall(run)
        return int(steps[-1][0]) if steps else 0

    def reconfigure(x: ExecConfig) -> None:
        """What the engine does when a plan policy changes the job's ExecConfig, carried out by meshd."""
        actions: list = []
        with d.journal.batch():
            d.engine._reconfigure(pb.Reconfigure(rec.job_id, x, "test: a plan change"), time.time(), "test", actions)
            for a in actions:
                dispatch("meshd", d._handlers, a)
        assert [a.restart for a in actions] == [True]  # a plan is fixed per run: checkpoint and restart

    phases = [("dp2-tp1-pp1-ga1", None), ("dp2-tp1-pp1-ga2-gc", ExecConfig(16, 2, plan="dp2-tp1-pp1-ga2-gc")),
              ("dp2-tp1-pp1-ga1", ExecConfig(32, 1, plan="dp2-tp1-pp1-ga1"))]
    for i, (plan, x) in enumerate(phases):
        if x is not None:
            reconfigure(x)
            await wait_for(lambda: text().count(f"plan={plan} ") >= (2 if i == 2 else 1), timeout=60,
                           what=f"relaunched with plan {plan}")
            await wait_for(lambda: job.exec == x and job.exec_pending is None, what="ReconfigureApplied")
        if i < len(phases) - 1:  # train a few steps with this plan before the next change
            start = last_step(text())
            await wait_for(lambda: last_step(_run_of(text(), plan)) >= start + 4, timeout=60, what=f"steps on {plan}")
    await wait_for(lambda: job.state is JobState.COMPLETED, timeout=90, what="job completed")
    t_job = time.monotonic() - t0 - t_ref

    out = text()
    runs = [m.group(0) for m in re.finditer(r"^training: .*$", out, re.M)]
    assert len(runs) == 3, runs
    assert "plan=dp2-tp1-pp1-ga1 accumulation=1 recompute=False" in runs[0]
    assert "plan=dp2-tp1-pp1-ga2-gc accumulation=2 recompute=True" in runs[1]
    assert "plan=dp2-tp1-pp1-ga1 accumulation=1 recompute=False" in runs[2]
    resumed = [int(re.search(r"from step (\d+)", r).group(1)) for r in runs]
    assert resumed[0] == 0 and 0 < resumed[1] < resumed[2] < STEPS, resumed  # each run resumed mid-training
    assert out.count("checkpoint-and-exit requested by meshd") == 2 and f"done: {STEPS} steps" in out
    assert job.acct.preemptions == 0 and job.exec.plan == "dp2-tp1-pp1-ga1"
    got = _losses(out)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    worst = max(abs(v - want[k][0]) / max(1.0, abs(want[k][0])) for k, vs in got.items() for v in vs)
    print(f"plan changes at steps {resumed[1:]}; max relative loss difference {worst:.3g}; "
          f"reference {t_ref:.1f} s, reconfigured job {t_job:.1f} s")
    assert worst <= TOLERANCE
