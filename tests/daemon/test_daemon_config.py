"""meshd configuration layering (defaults < TOML < environment < flags) and the journal."""

import os
import re
from pathlib import Path

import pytest
from meshsched.daemon.config import ConfigError, load_config
from meshsched.daemon.journal import JobRecord, Journal


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


# -- the node's CPUs and memory (daemon/hostres.py) -------------------------------------------------------------


def test_node_resources_are_the_machines_by_default(tmp_path):
    from meshsched.daemon.hostres import host_resources, machine_cpus, machine_memory_gb

    cfg = load_config(None, env={"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")})
    host = host_resources(cfg)
    assert host.cpus == machine_cpus() == len(os.sched_getaffinity(0))
    meminfo = Path("/proc/meminfo").read_text()
    kib = int(next(line for line in meminfo.splitlines() if line.startswith("MemTotal:")).split()[1])
    assert host.memory_gb == machine_memory_gb() == round(kib / 2**20, 1) and host.memory_gb > 0
    assert (host.detected_cpus, host.detected_memory_gb) == (host.cpus, host.memory_gb)


def test_node_resources_layer_like_every_key_and_the_reserve_is_taken_off(tmp_path):
    from meshsched.daemon.hostres import host_resources

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       65863516 kB\nMemFree:         1000 kB\n")  # 62.8 GiB
    f = tmp_path / "meshd.toml"
    f.write_text("[meshd]\nnode_cpus = 64\nreserved_cpus = 2\nreserved_memory_gb = 4\n")
    cfg = load_config(f, env={"MESHD_RESERVED_CPUS": "4"}, overrides={"node_memory_gb": None})
    host = host_resources(cfg, meminfo)
    assert (cfg.node_cpus, cfg.reserved_cpus, cfg.reserved_memory_gb) == (64, 4, 4.0)  # env beats the file
    assert (host.cpus, host.memory_gb, host.detected_cpus, host.detected_memory_gb) == (60, 58.8, 0, 62.8)
    cfg = load_config(f, env={}, overrides={"node_memory_gb": 16.0, "reserved_cpus": 0})  # flags beat both
    assert (host_resources(cfg, meminfo).cpus, host_resources(cfg, meminfo).memory_gb) == (64, 12.0)


@pytest.mark.parametrize("text, match", [
    ("node_cpus = -1\n", "node_cpus must be a finite number >= 0"),
    ("reserved_memory_gb = -2\n", "reserved_memory_gb must be"),
    ("node_cpus = 'lots'\n", "node_cpus must be int"),
    ("node_cpus = 4\nreserved_cpus = 4\n", "reserved_cpus 4 leaves no CPU for jobs (the node has 4)"),
    ("node_memory_gb = 8\nreserved_memory_gb = 8\n", "reserved_memory_gb 8 leaves no memory for jobs"),
])  # fmt: skip
def test_bad_node_resources_are_one_line_config_errors(tmp_path, text, match):
    from meshsched.daemon.hostres import host_resources

    f = tmp_path / "meshd.toml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(match)):
        host_resources(load_config(f, env={}))


def test_unreadable_meminfo_says_which_key_to_set(tmp_path):
    from meshsched.daemon.hostres import host_resources

    cfg = load_config(None, env={"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")})
    with pytest.raises(ConfigError, match="set node_memory_gb"):
        host_resources(cfg, tmp_path / "nope")
    (tmp_path / "odd").write_text("MemFree: 1 kB\n")
    with pytest.raises(ConfigError, match="MemTotal"):
        host_resources(cfg, tmp_path / "odd")
