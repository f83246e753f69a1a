"""meshsched.job sessions: env, no-op outside meshd, cooperative exit agreed across ranks, calibration."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from meshsched.job import PREEMPTED_EXIT_CODE, ElasticSampler, MeshEnv, Session, attach

ROOT = Path(__file__).resolve().parents[2]


def test_env_reads_every_mesh_variable():
    env = MeshEnv.read({"MESH_JOB_ID": "7", "MESH_SOCKET": "/s", "MESH_CHECKPOINT_DIR": "/c",
                        "MESH_RESTART_COUNT": "2", "RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                        "MESH_GRACE_PERIOD": "5", "MESH_CHECKPOINT_KEEP": "3", "MESH_REPORT_INTERVAL": "0.5"})
    assert env.under_meshd and (env.job_id, env.restart_count, env.rank, env.world_size) == ("7", 2, 1, 4)
    assert (env.grace, env.keep, env.report_interval) == (5.0, 3, 0.5)
    bare = MeshEnv.read({})
    assert not bare.under_meshd and bare.checkpoint_dir is None and bare.grace == 60.0


def test_attach_outside_meshd_is_a_no_op(monkeypatch):
    for key in ("MESH_JOB_ID", "MESH_SOCKET", "MESH_CHECKPOINT_DIR", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    before = signal.getsignal(signal.SIGTERM)
    sess = attach(rng=False)
    assert sess.reporter is None and sess.checkpointer is None
    assert signal.getsignal(signal.SIGTERM) is before
    assert sess.resume() == 0 and sess.save() is None
    assert not any(sess.end_step() for _ in range(3)) and sess.step == 3
    sess.close()


def test_directives_apply_at_the_step_boundary(tmp_path):
    env = MeshEnv.read({"MESH_CHECKPOINT_DIR": str(tmp_path), "WORLD_SIZE": "1"})
    sampler = ElasticSampler(40, 8, world_size=1)
    sess = Session(env, sampler, checkpoint_every=0, rng=False, handle_sigterm=False)
    sess.request({"kind": "calibrate", "accum_steps": 4})
    assert len(sess.micro_batches()) == 1  # not before the boundary
    assert not sess.end_step()
    assert sess.accum_steps == 4 and len(sess.micro_batches()) == 4
    sess.request({"kind": "calibrate", "accum_steps": 0})  # invalid: ignored, training goes on
    sess.request({"kind": "checkpoint_exit"})
    assert sess.end_step() and sess.accum_steps == 4
    assert "meshd" in sess.exit_reason and sess.checkpointer.latest().step == 2
    fresh = Session(env, ElasticSampler(40, 8, world_size=1), rng=False, handle_sigterm=False)
    assert fresh.resume() == 2 and fresh.accum_steps == 4 and fresh.sampler.position == 16


def _rank(rank: int, init: str, ckdir: str, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MESH_CHECKPOINT_DIR=ckdir)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    sampler = ElasticSampler(100, 10, world_size=2)
    sess = attach(sampler=sampler, checkpoint_every=100, vote_interval=0.0)  # vote every step
    log = []
    while sess.step < 50:
        log.append(sampler.indices(rank))
        if rank == 0 and sess.step == 2:
            sess.request({"kind": "calibrate", "local_batches": [3, 7]})
        if rank == 1 and sess.step == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # only rank 1 is told
        if sess.end_step():
            break
    Path(f"{out}.{rank}").write_text(json.dumps({"step": sess.step, "log": log}))
    sess.close()
    dist.barrier()
    os._exit(0)  # as in test_job_accumulate: gloo's C++ teardown aborted a rank in loaded runs


def test_two_ranks_stop_at_the_same_step_and_share_directives(tmp_path):
    pytest.importorskip("torch")
    import torch.multiprocessing as mp

    out = str(tmp_path / "out")
    mp.start_processes(_rank, args=(f"file://{tmp_path / 'rdv'}", str(tmp_path / "ck"), out), nprocs=2,
                       start_method="spawn")
    r0, r1 = (json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1))
    # SIGTERM on rank 1 during step 5: voted at the end of step 5, both stop at the end of step 6;
    # rank 0's calibration (during step 3) is voted at step 3 and applied from step 5 on both ranks
    assert r0["step"] == r1["step"] == 6
    assert [len(b) for b in r0["log"]] == [5, 5, 5, 5, 3, 3] and [len(b) for b in r1["log"]] == [5, 5, 5, 5, 7, 7]
    consumed = sorted(i for r in (r0, r1) for b in r["log"] for i in b)
    assert len(consumed) == len(set(consumed)) == 60
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000006"]


def test_sigterm_checkpoints_and_exits_resumable(tmp_path):
    code = ("import os, signal\nfrom meshsched.job import attach\n"
            "s = attach(checkpoint_every=0, rng=False)\n"
            "while not s.end_step():\n"
            "    if s.step == 6: os.kill(os.getpid(), signal.SIGTERM)\n"
            "s.exit()\n")
    env = dict(os.environ, MESH_CHECKPOINT_DIR=str(tmp_path), WORLD_SIZE="1", RANK="0")
    env.pop("MESH_JOB_ID", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env)
    assert proc.returncode == PREEMPTED_EXIT_CODE
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000007"]


def test_exit_with_a_process_group_skips_the_interpreters_teardown(tmp_path):
    """torch's teardown after a gloo group aborted a rank now and then (exit 134 instead of 75), which meshd
    reads as a failure: exit() now leaves by os._exit once the group is destroyed (an atexit handler, which
    runs only in a teardown, ran before)."""
    pytest.importorskip("torch")
    from meshsched.daemon.launcher import free_port

    marker = tmp_path / "teardown-ran"
    code = (
        "import atexit, torch.distributed as dist\n"
        "from meshsched import job\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
        "dist.init_process_group('gloo')\n"
        "sess = job.attach(rng=False)\n"
        "sess.exit()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESH_")}
    env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == PREEMPTED_EXIT_CODE, out.stderr
    assert not marker.exists()
