"""meshd configuration: defaults < TOML file < environment (MESHD_*) < command-line flags.

Defaults (documented in docs/daemon.md):
  config file    /etc/meshsched/meshd.toml (read only when present, or the file given by --config)
  state_dir      /var/lib/meshsched as root, else $XDG_STATE_HOME/meshsched (~/.local/state/meshsched)
  runtime_dir    /run/meshsched as root, else $XDG_RUNTIME_DIR/meshsched, else /tmp/meshsched-$UID
  policy         sjf            (any stack `make_policy` accepts, e.g. srtf@360, castor+srtf, castor+gimbal, lazer)
  fake_gpus      0 = use NVML when present, else 8 fake GPUs
  gpu_type       "" = the GPU's own type: NVML's name as the profiles key it ('Tesla V100-SXM2-16GB' -> v100),
                 v100 for fake GPUs; set it to model the GPUs with another type's profiles
  node_name      the host name
  http_tcp       "" (off); "HOST:PORT" also serves the API on TCP, which then needs a token: from
                 `token_file` (a file only meshd's user can read) or $MESHD_TOKEN, never the command line
  kill_grace     10 s between SIGTERM and SIGKILL when a job is cancelled or preempted
  preempt_grace  60 s from a checkpoint-and-exit directive (jobs using meshsched.job) to SIGTERM
  systemd_scope  auto: under systemd each job runs in a transient scope (systemd-run --scope); yes | no
  self_preempt_limit / self_preempt_backoff
                 3 / 1 s: a job that exits 75 (resumable) with no preemption asked is requeued after
                 backoff * 2^(n-1) s, and fails after `limit` such exits
  log_max_mb     64: a rank's log past this size is rotated (newest half kept in rank<N>.log.1)
  node_grace     60 s (mesh only): a node whose member entry has been gone this long is lost; its jobs requeue
                 (must be > coordinator.ttl: a node cut off from etcd fences itself within ttl)
  mesh_address   node_name (mesh only): the address (host name or IP) ranks on other nodes use as MASTER_ADDR
                 when this node runs rank 0 of a job across nodes
  checkpoint_root  unset: a job's checkpoints live in its job dir; set it to storage every node mounts (a
                 mesh) and a job requeued to another node resumes from its checkpoint there
  [coordinator]  a table of its own (CoordinatorConfig; or MESHD_COORDINATOR_<KEY>): `local` (default) or `etcd`, see
                 docs/coordinator.md; snapshot_entries / snapshot_bytes: how often the mesh's leader snapshots
  node_cpus      0 = the CPUs meshd may run on (its affinity mask, else os.cpu_count()); N: the node's total
  node_memory_gb 0 = /proc/meminfo's MemTotal (GiB); X: the node's total
  reserved_cpus / reserved_memory_gb
                 0 / 0: taken off those totals for the system; what is left is what jobs may ask for
                 (`mesh nodes` shows it; a submit asking more than any node has is refused). daemon/hostres.py
  confine        auto: each job pinned to its CPUs and, where a systemd scope or a writable cgroup (v2, else v1
                 memory) allows, limited to its memory; cpus: CPUs only; no: neither. daemon/confine.py
  cgroup_root    unset: job cgroups go under meshd's own cgroup (mesh-jobs-<tag>/); a cgroup directory to use instead
  submit_users   "" (only meshd's user); "ann,bob,@gpu" or "*": those users, members of group gpu (every
                 local user) may submit, each job running as its submitter (meshd as root; daemon/users.py)
  keep_finished  86400 s (24 h): ended jobs leave `mesh ls --all`, the journal and the engine this long after they
                 ended (accounting keeps them: `mesh acct`); 0: kept forever (Slurm's MinJobAge = 0). daemon/retention.py
  keep_job_dirs  604800 s (7 days): an ended job's directory (its logs, result) is removed this long after it ended;
                 0: kept forever
  job_env_passthrough
                 "" : nothing of meshd's own environment reaches a job (a job's environment is what its submitter
                 exported, `mesh submit --export`); "HTTP_PROXY,NO_PROXY": those variables of meshd's do, under
                 what the submitter exported (meshd's secrets MESHD_TOKEN* never)
"""

from __future__ import annotations

import math
import os
import socket
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DEFAULT_CONFIG_FILE = Path("/etc/meshsched/meshd.toml")
ENV_PREFIX = "MESHD_"


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and its source."""


COORDINATOR_BACKENDS = ("local", "etcd")  # meshsched.daemon.coordinator_backends opens each


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """The `[coordinator]` keys of meshd's configuration (docs/coordinator.md)."""

    backend: str = "local"  # local | etcd
    endpoints: tuple[str, ...] = ("http://127.0.0.1:2379",)
    ttl: int = 30  # seconds a leader key / member entry outlives its last keepalive
    loop_wait: float = 10.0  # seconds between keepalives (and between leader-loop rounds)
    retry_timeout: float = 10.0  # seconds one store operation may retry before it gives up
    prefix: str = "/meshsched"  # every key of this mesh lives under it
    snapshot_entries: int = 1000  # the leader writes a snapshot every so many log entries (0: not by count)
    snapshot_bytes: int = 8 * 2**20  # ... or every so many bytes of log entries (0: not by size); both 0: never
    fence: bool = True  # a node etcd cannot see stops its ranks before it may be declared lost (docs/coordinator.md)

    def validate(self) -> CoordinatorConfig:
        if self.backend not in COORDINATOR_BACKENDS:
            raise ConfigError(f"coordinator.backend must be one of {', '.join(COORDINATOR_BACKENDS)}, "
                              f"got {self.backend!r}")
        check_timing(self.ttl, self.loop_wait, self.retry_timeout)
        if not self.endpoints:
            raise ConfigError("coordinator.endpoints is empty")
        for url in self.endpoints:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
                raise ConfigError(f"coordinator.endpoints: {url!r} is not http(s)://HOST:PORT")
        if not self.prefix.startswith("/") or self.prefix.endswith("/") or "//" in self.prefix:
            raise ConfigError(f"coordinator.prefix must look like /name, got {self.prefix!r}")
        for key in ("snapshot_entries", "snapshot_bytes"):
            if getattr(self, key) < 0:
                raise ConfigError(f"coordinator.{key} must be >= 0 (0: off), got {getattr(self, key)}")
        return self

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str) -> CoordinatorConfig:
        """Parse a `[coordinator]` table (TOML or environment strings); errors name the source and key."""
        cfg = cls()
        known = {f for f in cls.__dataclass_fields__}
        parsed: dict[str, Any] = {}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"{source}: unknown coordinator key {key!r}; known: {', '.join(sorted(known))}")
            try:
                if key == "endpoints":
                    items = value.split(",") if isinstance(value, str) else list(value)
                    parsed[key] = tuple(str(u).strip().rstrip("/") for u in items if str(u).strip())
                elif key in ("ttl", "snapshot_entries", "snapshot_bytes"):
                    if isinstance(value, bool) or float(value) != int(float(value)):
                        raise ValueError
                    parsed[key] = int(float(value))
                elif key in ("loop_wait", "retry_timeout"):
                    if isinstance(value, bool):
                        raise ValueError
                    parsed[key] = float(value)
                elif key == "fence":
                    parsed[key] = parse_switch(value)
                else:
                    parsed[key] = str(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{source}: coordinator.{key} has a bad value {value!r}") from None
        try:
            return replace(cfg, **parsed).validate()
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None


def parse_switch(value: Any) -> bool:
    """A boolean key: TOML true/false, or the strings an environment variable gives (true/false, yes/no, 1/0)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off", ""):
        return False
    raise ValueError(value)


def check_timing(ttl: float, loop_wait: float, retry_timeout: float) -> None:
    """Patroni's rule: a leader that keeps alive every loop_wait, each try retried for retry_timeout, must
    renew its lease before it expires even when one keepalive round fails."""
    if ttl < 2 or loop_wait <= 0 or retry_timeout <= 0:
        raise ConfigError(f"coordinator: need ttl >= 2 s and positive loop_wait, retry_timeout (got ttl={ttl:g}, "
                          f"loop_wait={loop_wait:g}, retry_timeout={retry_timeout:g})")
    if loop_wait + 2 * retry_timeout > ttl:
        raise ConfigError(f"coordinator: loop_wait + 2 * retry_timeout must be <= ttl, got {loop_wait:g} + "
                          f"2 * {retry_timeout:g} = {loop_wait + 2 * retry_timeout:g} > {ttl:g}")



def default_state_dir(env: Mapping[str, str]) -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/meshsched")
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".local" / "state")
    return Path(base) / "meshsched"


def default_runtime_dir(env: Mapping[str, str]) -> Path:
    if os.geteuid() == 0:
        return Path("/run/meshsched")
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "meshsched"
    return Path(f"/tmp/meshsched-{os.getuid()}")


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    state_dir: Path
    runtime_dir: Path
    policy: str = "sjf"
    fake_gpus: int = 0
    gpu_type: str = ""
    gpu_memory_mb: int = 16384
    node_name: str = ""
    http_tcp: str = ""
    token: str = ""
    token_file: Path | None = None  # read at load time into `token`; must not be readable by others
    kill_grace: float = 10.0
    preempt_grace: float = 60.0  # checkpoint-and-exit directive -> SIGTERM, for jobs that speak meshsched.job
    use_mps: bool = False
    systemd_scope: str = "auto"  # each job in a transient systemd scope: auto (under systemd) | yes | no
    self_preempt_limit: int = 3  # exits with code 75 that no preemption asked for, before the job fails
    self_preempt_backoff: float = 1.0  # seconds before the first such requeue; doubles each time
    log_max_mb: float = 64.0  # per rank log; past it the newest half moves to rank<N>.log.1
    node_grace: float = 60.0  # (mesh) seconds a node may be gone before its jobs are requeued elsewhere
    mesh_address: str = ""  # (mesh) where other nodes' ranks reach this node's rank 0 (default: node_name)
    checkpoint_root: Path | None = None  # jobs' checkpoints in <root>/<job id> (default: the job's own dir)
    coordinator: CoordinatorConfig | None = None  # None: the embedded local coordinator
    node_cpus: int = 0  # the node's CPU total (0: read from the machine at startup, daemon/hostres.py)
    node_memory_gb: float = 0.0  # the node's memory total in GB (0: /proc/meminfo's MemTotal)
    reserved_cpus: int = 0  # kept for the system: jobs get the total less this
    reserved_memory_gb: float = 0.0
    confine: str = "auto"  # pin jobs to their CPUs and limit their memory where possible | cpus | no
    cgroup_root: Path | None = None  # where job cgroups are made (default: under meshd's own cgroup)
    submit_users: str = ""  # other local users who may submit ("a,b" or "*": every one); meshd must be root
    job_env_passthrough: str = ""  # variables of meshd's environment every job gets ("A,B"; "": none)
    keep_finished: float = 86400.0  # seconds an ended job stays in the journal and listings (0: forever)
    keep_job_dirs: float = 604800.0  # seconds an ended job's directory stays (0: forever)

    @property
    def mps_one_user(self) -> bool:
        """Jobs of several users share GPUs through MPS, which serves one user per GPU at a time: the sharing
        policies pair only jobs of the same user (PolicyHandle.one_user_per_gpu)."""
        return self.use_mps and bool(self.submit_users)

    @property
    def submit_names(self) -> tuple[str, ...]:
        """`submit_users` as its names, @groups and *, in order."""
        return tuple(u.strip() for u in self.submit_users.split(",") if u.strip())

    @property
    def passthrough_names(self) -> tuple[str, ...]:
        """`job_env_passthrough` as its variable names, in order."""
        return tuple(n.strip() for n in self.job_env_passthrough.split(",") if n.strip())

    def may_submit(self, user: str) -> bool:
        """Whether a local user other than meshd's own may use the API (`submit_users`: names, @group, *)."""
        allowed = set(self.submit_names)
        if "*" in allowed or user in allowed:
            return True
        groups = {g[1:] for g in allowed if g.startswith("@")}
        if not groups:
            return False
        import grp
        import pwd

        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            return False
        names = set()
        for gid in os.getgrouplist(user, pw.pw_gid):
            try:
                names.add(grp.getgrgid(gid).gr_name)
            except KeyError:
                pass
        return bool(groups & names)

    @property
    def api_socket(self) -> Path:
        return self.runtime_dir / "api.sock"

    @property
    def job_socket(self) -> Path:
        return self.runtime_dir / "job.sock"

    @property
    def journal_path(self) -> Path:
        return self.state_dir / "journal.sqlite"

    @property
    def jobs_dir(self) -> Path:
        return self.state_dir / "jobs"

    def validate(self) -> DaemonConfig:
        from meshsched.policies.registry import UnknownPolicy, parse_policy

        try:
            parse_policy(self.policy)  # checked without building it: models are loaded once, by NodeDaemon.start
        except UnknownPolicy as exc:
            raise ConfigError(f"policy: {exc}") from None
        if self.fake_gpus < 0:
            raise ConfigError("fake_gpus must be >= 0")
        if not (math.isfinite(self.log_max_mb) and self.log_max_mb > 0):
            raise ConfigError(f"log_max_mb must be a finite number > 0, got {self.log_max_mb!r}")
        for key in ("kill_grace", "preempt_grace", "self_preempt_backoff", "node_grace", "node_cpus", "reserved_cpus",
                    "node_memory_gb", "reserved_memory_gb", "keep_finished", "keep_job_dirs"):
            value = getattr(self, key)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{key} must be a finite number >= 0, got {value!r}")
        if self.coordinator is not None and self.coordinator.backend == "etcd" and self.node_grace <= self.coordinator.ttl:
            raise ConfigError(f"node_grace must be > coordinator.ttl (a node fences itself within ttl; the leader must "
                              f"not declare it lost before), got {self.node_grace:g} <= {self.coordinator.ttl:g}")
        if self.self_preempt_limit < 0:
            raise ConfigError("self_preempt_limit must be >= 0")
        if self.systemd_scope not in ("auto", "yes", "no"):
            raise ConfigError(f"systemd_scope must be auto, yes or no, got {self.systemd_scope!r}")
        if self.confine not in ("auto", "cpus", "no"):
            raise ConfigError(f"confine must be auto, cpus or no, got {self.confine!r}")
        unknown = next((name for name in self.submit_names if not _is_local(name)), None)
        if unknown is not None:
            what = "group" if unknown.startswith("@") else "user"
            raise ConfigError(f"submit_users: {unknown} is no local {what} (give names from /etc/passwd, @GROUP or *)")
        bad = next((n for n in self.passthrough_names if "=" in n or "\0" in n or not n.isprintable()), None)
        if bad is not None:
            raise ConfigError(f"job_env_passthrough: {bad!r} is no variable name (give names: HTTP_PROXY,NO_PROXY)")
        if self.submit_users and os.geteuid() != 0:
            raise ConfigError("submit_users needs meshd to run as root (it starts each job as its submitter)")
        if self.http_tcp and not self.token:
            raise ConfigError("http_tcp needs a token (the TCP API is authenticated)")
        if len(str(self.api_socket)) > 100:
            raise ConfigError(f"runtime_dir {self.runtime_dir} is too long for a Unix socket path")
        return self


def _is_local(name: str) -> bool:
    """Whether a `submit_users` entry names this machine's users: *, a user, or @ a group."""
    import grp
    import pwd

    try:
        if name == "*":
            return True
        if name.startswith("@"):
            grp.getgrnam(name[1:])
        else:
            pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _coerce(name: str, kind: Any, value: Any, source: str) -> Any:
    try:
        if kind in ("Path", Path, "Path | None"):
            return Path(str(value)).expanduser()
        if kind in ("int", int):
            if isinstance(value, bool):
                raise ValueError
            return int(value)
        if kind in ("float", float):
            return float(value)
        if kind in ("bool", bool):
            return parse_switch(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {name} must be {kind}, got {value!r}") from None


def load_config(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> DaemonConfig:
    """Build the configuration. `path` None means DEFAULT_CONFIG_FILE when it exists."""
    env = os.environ if env is None else env
    cfg = DaemonConfig(state_dir=default_state_dir(env), runtime_dir=default_runtime_dir(env))
    kinds = {f.name: f.type for f in fields(DaemonConfig)}
    layers: list[tuple[str, Mapping[str, Any]]] = []
    coordinator: list[tuple[str, Mapping[str, Any]]] = []  # [coordinator] keys, by source
    file = path if path is not None else (Path(env["MESHD_CONFIG"]) if env.get("MESHD_CONFIG") else None)
    if file is None and DEFAULT_CONFIG_FILE.exists():
        file = DEFAULT_CONFIG_FILE
    if file is not None:
        try:
            with open(file, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file {file} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: {exc}") from None
        if isinstance(data.get("coordinator"), dict):
            coordinator.append((str(file), data.pop("coordinator")))
        data = data.get("meshd", data)
        if isinstance(data.get("coordinator"), dict):
            coordinator.append((str(file), data.pop("coordinator")))
        layers.append((str(file), data))
    from_env = {k[len(ENV_PREFIX) :].lower(): v for k, v in env.items() if k.startswith(ENV_PREFIX)}
    coordinator.append(("environment", {k[len("coordinator_"):]: from_env.pop(k) for k in list(from_env)
                                        if k.startswith("coordinator_")}))
    layers.append(("environment", from_env))
    layers.append(("command line", {k: v for k, v in (overrides or {}).items() if v is not None}))
    for source, layer in layers:
        values = {}
        for key, value in layer.items():
            if key in ("config", "coordinator") and source == "environment":
                continue
            if key not in kinds:
                raise ConfigError(f"{source}: unknown key {key!r}; known: {', '.join(sorted(kinds))}")
            values[key] = _coerce(key, kinds[key], value, source)
        cfg = replace(cfg, **values)
    if not cfg.node_name:
        cfg = replace(cfg, node_name=socket.gethostname().split(".")[0] or "localhost")
    if cfg.token_file is not None:
        cfg = replace(cfg, token=read_token_file(cfg.token_file))
    merged: dict[str, Any] = {}
    for source, table in coordinator:
        merged.update(table)
    if merged:
        cfg = replace(cfg, coordinator=CoordinatorConfig.from_mapping(merged, ", ".join(s for s, t in coordinator if t)))
    return cfg.validate()


def read_token_file(path: Path) -> str:
    """The bearer token in `path` (first line); refused when group or others may read the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(f"token_file {path}: {exc.strerror}") from None
    with open(fd) as fh:
        if stat.S_IMODE(os.fstat(fh.fileno()).st_mode) & 0o077:
            raise ConfigError(f"token_file {path} is readable by others; `chmod 600 {path}`")
        token = fh.readline().strip()
    if not token:
        raise ConfigError(f"token_file {path} is empty")
    return token
