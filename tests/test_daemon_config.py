"""meshd configuration layering (defaults < TOML < environment < flags) and the journal."""

import os
from pathlib import Path

import pytest

from meshsched.daemon.config import ConfigError, load_config
from meshsched.daemon.journal import Journal, JobRecord


def test_defaults_without_file(tmp_path):
    env = {"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    cfg = load_config(None, env=env)
    assert cfg.policy == "sjf" and cfg.fake_gpus == 0 and cfg.kill_grace == 10.0
    if os.geteuid() == 0:
        assert cfg.state_dir == Path("/var/lib/meshsched") and cfg.runtime_dir == Path("/run/meshsched")
    else:
        assert cfg.state_dir == tmp_path / ".local/state/meshsched"
        assert cfg.runtime_dir == tmp_path / "run/meshsched"
    assert cfg.api_socket.name == "api.sock" and cfg.node_name


def test_layers_override_in_order(tmp_path):
    f = tmp_path / "meshd.toml"
    f.write_text('[meshd]\npolicy = "fifo"\nfake_gpus = 4\nstate_dir = "/srv/s"\nkill_grace = 3\n')
    cfg = load_config(f, env={"MESHD_FAKE_GPUS": "6", "MESHD_POLICY": "srtf@60"}, overrides={"policy": "las"})
    assert cfg.fake_gpus == 6  # env beats file
    assert cfg.policy == "las"  # flag beats env
    assert cfg.state_dir == Path("/srv/s") and cfg.kill_grace == 3.0


@pytest.mark.parametrize(
    "text, env, match",
    [
        ("polcy = 'sjf'\n", {}, "unknown key 'polcy'"),
        ("policy = 'nope'\n", {}, "unknown policy"),
        ("fake_gpus = 'many'\n", {}, "fake_gpus"),
        ("http_tcp = '127.0.0.1:8080'\n", {}, "token"),
        ("", {"MESHD_USE_MPS": "maybe"}, "use_mps"),
        ("policy = [\n", {}, "meshd.toml"),
    ],
)
def test_bad_config_names_the_key(tmp_path, text, env, match):
    f = tmp_path / "meshd.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(f, env=env)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", env={})


def _rec(job_id: str, seq: int, **kw) -> JobRecord:
    base = dict(job_id=job_id, seq=seq, gpus=1, model="m", batch_size=8, iterations=10, submit_time=1.0, name="n",
                user="u", deadline=None, guaranteed=False, command=["python", "t.py"], cwd="/", env={}, job_dir="/j")
    base.update(kw)
    return JobRecord(**base)


def test_journal_survives_reopen_and_rolls_back(tmp_path):
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    assert [j.next_seq(), j.next_seq()] == [1, 2]
    with j.batch():
        j.put(_rec("2", 2, state="RUNNING", assigned=[0]))
        j.put(_rec("1", 1))
        j.transition("1", 5.0, "PENDING", "submitted")
    with pytest.raises(RuntimeError):
        with j.batch():
            j.put(_rec("3", 3))
            raise RuntimeError("crash mid-transaction")
    j.close()  # no clean shutdown needed for WAL, but reopen must see exactly the committed data
    j = Journal(path)
    recs = j.load()
    assert [r.job_id for r in recs] == ["1", "2"]
    assert recs[1].state == "RUNNING" and recs[1].assigned == [0]
    assert j.history("1") == [(5.0, "PENDING", "submitted")]
    assert j.next_seq() == 3
    j.close()
