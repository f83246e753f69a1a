"""`meshd`: run the node daemon in the foreground until SIGTERM/SIGINT (uvloop when installed)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pwd
import signal
import sys
from pathlib import Path

from meshsched.daemon.config import ConfigError, DaemonConfig, load_config
from meshsched.daemon.node import NodeDaemon


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="meshd", description="meshsched node daemon (runs in the foreground)")
    p.add_argument("--config", type=Path, help="TOML file (default /etc/meshsched/meshd.toml when present)")
    p.add_argument("--state-dir", type=Path, help="journal and job directories")
    p.add_argument("--runtime-dir", type=Path, help="where the API and job sockets live")
    p.add_argument("--policy", help="policy stack, e.g. sjf (default), srtf@360, castor, castor+srtf, castor+gimbal, lazer")
    p.add_argument("--fake-gpus", type=int, help="serve N fake GPUs (default: NVML, else 8 fake)")
    p.add_argument("--node-name", help="this node's name (default: host name)")
    p.add_argument("--http-tcp", help="also serve the API on HOST:PORT (needs --token-file or MESHD_TOKEN)")
    p.add_argument("--token-file", type=Path, help="file holding the TCP API's bearer token (mode 0600)")
    p.add_argument("--token", help=argparse.SUPPRESS)  # refused: a token on the command line is visible in ps
    p.add_argument("--kill-grace", type=float, help="seconds between SIGTERM and SIGKILL for a job")
    p.add_argument("--preempt-grace", type=float,
                   help="seconds a meshsched.job script gets to checkpoint and exit before SIGTERM (default 60)")
    p.add_argument("--node-cpus", type=int, help="the node's CPUs (default: the ones meshd may run on)")
    p.add_argument("--node-memory-gb", type=float, help="the node's memory in GB (default: MemTotal)")
    p.add_argument("--reserved-cpus", type=int, help="CPUs kept for the system, not for jobs (default 0)")
    p.add_argument("--reserved-memory-gb", type=float, help="GB of memory kept for the system (default 0)")
    p.add_argument("--submit-users", metavar="USERS",
                   help="other local users who may submit (meshd as root): ann,bob, @GROUP for its members, * for all")
    p.add_argument("--confine", choices=("auto", "cpus", "no"),
                   help="pin each job to its CPUs and limit its memory where cgroups allow (auto), CPUs only, or no")
    p.add_argument("--keep-finished", type=float, metavar="SECONDS",
                   help="ended jobs leave the listings and journal this long after they ended (default 86400; 0: never)")
    p.add_argument("--keep-job-dirs", type=float, metavar="SECONDS",
                   help="ended jobs' directories are removed this long after they ended (default 604800; 0: never)")
    return p.parse_args(argv)


def multi_user_line(config: DaemonConfig) -> str | None:
    """The start-up line saying who may submit and who operates (None: one user, nothing to say)."""
    names = config.submit_names
    if not names:
        return None
    if "*" in names:
        who = "every local user"
    else:
        who = ", ".join(f"members of group {n[1:]}" if n.startswith("@") else n for n in names)
    me = pwd.getpwuid(os.geteuid()).pw_name if os.geteuid() else "root"
    operators = "root" if me == "root" else f"root, {me}"
    if config.http_tcp:
        operators += f" and holders of the TCP token ({config.http_tcp})"
    return f"multi-user: {who} may submit; operators: {operators}"


async def serve(config: DaemonConfig) -> str | None:
    """Serve until SIGTERM/SIGINT (None) or until the daemon asks to start again in place (the reason)."""
    daemon = NodeDaemon(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.leave.set)
    async with daemon:
        print(f"meshd: serving {config.api_socket} (policy {config.policy}, state {config.state_dir})",
              file=sys.stderr, flush=True)
        if multi_user_line(config):
            print(f"meshd: {multi_user_line(config)}", file=sys.stderr, flush=True)
        await daemon.leave.wait()
    if daemon.restart_reason is not None:
        print(f"meshd: restarting: {daemon.restart_reason}", file=sys.stderr, flush=True)
        return daemon.restart_reason
    print("meshd: stopped (running jobs keep running and are re-adopted on the next start)", file=sys.stderr)
    return None


def run(config: DaemonConfig) -> None:
    try:
        import uvloop
    except ImportError:
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        restart = runner(serve(config))
    except ConfigError as exc:  # found at start-up (a reserve that leaves nothing, ...): as load_config's
        config_error(exc)
    except (RuntimeError, OSError) as exc:  # another meshd holds the dirs, corrupt journal, full disk, ...
        sys.exit(f"meshd: error: {exc}")
    if restart is not None:  # the same PID, arguments and environment (systemd sees a reload: RELOADING, READY)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, sys.orig_argv)


def config_error(exc: ConfigError) -> None:
    """A configuration meshd cannot start with: one line, exit code 2 (a usage error, as argparse's; systemd's
    Restart=on-failure would only repeat it)."""
    print(f"meshd: error: {exc}", file=sys.stderr, flush=True)
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.token is not None:
        sys.exit("meshd: error: --token would show the secret to every local user (ps); "
                 "put it in a file (chmod 600) and pass --token-file FILE, or set MESHD_TOKEN")
    overrides = {k: v for k, v in vars(args).items() if k not in ("config", "token")}
    try:
        config = load_config(args.config, overrides=overrides)
    except ConfigError as exc:
        config_error(exc)
    logging.basicConfig(level=logging.INFO, format="meshd: %(message)s", stream=sys.stderr)
    run(config)


if __name__ == "__main__":
    main()
