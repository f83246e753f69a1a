"""meshsched.job trains with the micro-batch and accumulation meshd chose (MESH_MICRO_BATCH, MESH_ACCUM_STEPS)."""

from __future__ import annotations

import pytest

from meshsched.job import ElasticSampler, MeshEnv, Session


def test_env_reads_the_exec_config():
    env = MeshEnv.read({"MESH_MICRO_BATCH": "8", "MESH_ACCUM_STEPS": "4"})
    assert (env.micro_batch, env.accum_steps) == (8, 4)
    bare = MeshEnv.read({})
    assert (bare.micro_batch, bare.accum_steps) == (None, None)
    for bad in ("0", "-2", "two"):
        with pytest.raises(ValueError, match="MESH_ACCUM_STEPS"):
            MeshEnv.read({"MESH_ACCUM_STEPS": bad})


def test_session_defaults_to_meshds_accumulation_with_the_same_global_batch():
    sampler = ElasticSampler(64, 32, world_size=1, seed=0)
    env = MeshEnv.read({"MESH_MICRO_BATCH": "8", "MESH_ACCUM_STEPS": "4"})
    sess = Session(env, sampler, rng=False, handle_sigterm=False)
    mbs = sess.micro_batches()
    assert sess.accum_steps == 4 and [len(m.indices) for m in mbs] == [8, 8, 8, 8]
    assert sum(m.weight for m in mbs) == pytest.approx(1.0)  # the gradient is still the global batch's mean
    assert Session(env, sampler, accum_steps=2, rng=False, handle_sigterm=False).accum_steps == 2  # explicit wins
    assert Session(MeshEnv.read({}), sampler, rng=False, handle_sigterm=False).accum_steps == 1


def test_a_restart_trains_as_meshd_says_not_as_the_checkpoint_did(tmp_path):
    # Shared with accumulation 4, checkpointed; relaunched alone by meshd with accumulation 1.
    sampler = ElasticSampler(64, 32, world_size=1, seed=0)
    shared = MeshEnv.read({"MESH_CHECKPOINT_DIR": str(tmp_path), "MESH_ACCUM_STEPS": "4"})
    sess = Session(shared, sampler, rng=False, handle_sigterm=False)
    sess.end_step()
    sess.save()
    alone = MeshEnv.read({"MESH_CHECKPOINT_DIR": str(tmp_path), "MESH_ACCUM_STEPS": "1"})
    again = Session(alone, ElasticSampler(64, 32, world_size=1, seed=0), rng=False, handle_sigterm=False)
    assert again.resume() == 1 and again.accum_steps == 1
    standalone = Session(MeshEnv.read({"MESH_CHECKPOINT_DIR": str(tmp_path)}), ElasticSampler(64, 32, world_size=1, seed=0),
                         rng=False, handle_sigterm=False)
    assert standalone.resume() == 1 and standalone.accum_steps == 4  # outside meshd the checkpoint's own setting


def test_a_job_without_torch_votes_and_exits_without_importing_it(tmp_path):
    # Importing torch takes seconds: a torch-less job (examples/fake_train.py) exited 5-7 s after it had
    # checkpointed, and meshd's preemptions waited for it.
    import subprocess
    import sys

    code = ("import atexit, sys\nfrom meshsched.job import MeshEnv, Session\n"
            "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules))\n"
            f"s = Session(MeshEnv.read({{'WORLD_SIZE': '2', 'MESH_CHECKPOINT_DIR': {str(tmp_path)!r}}}), rng=False,"
            " handle_sigterm=False)\n"
            "s.request({'kind': 'checkpoint_exit'})\nassert s.end_step()\ns.exit()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 75, out.stderr
    assert out.stdout.strip() == "torch imported: False"
