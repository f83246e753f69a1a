"""NVIDIA MPS behind one interface: one control daemon per GPU (own pipe and log directories), or none.

`RealMps` starts `nvidia-cuda-mps-control -d` per GPU with CUDA_VISIBLE_DEVICES, CUDA_MPS_PIPE_DIRECTORY
and CUDA_MPS_LOG_DIRECTORY of that GPU, gives each worker the environment of its GPU's server (pipe dir,
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), sends `terminate_client` before any
signal, and `quit` on close for each GPU with no client left (a daemon still serving a job is adopted by the
next meshd). `NoMps` is used when MPS is off in the config (the default).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Protocol

CONTROL = "nvidia-cuda-mps-control"
CONTROL_TIMEOUT = 20.0  # seconds for one command to the control daemon


class MpsManager(Protocol):
    kind: str

    async def start(self) -> None: ...

    def client_env(self, gpu: int, share: int, mem_limit_mb: int | None = None) -> dict[str, str]: ...

    async def terminate_client(self, gpu: int, client_pid: int) -> None: ...

    async def alive(self, gpu: int) -> bool: ...

    async def revive(self, gpu: int) -> None: ...

    async def close(self) -> None: ...


class NoMps:
    kind = "none"

    async def start(self) -> None:
        return None

    def client_env(self, gpu: int, share: int, mem_limit_mb: int | None = None) -> dict[str, str]:
        return {}

    async def terminate_client(self, gpu: int, client_pid: int) -> None:
        return None

    async def alive(self, gpu: int) -> bool:
        return True

    async def revive(self, gpu: int) -> None:
        return None

    async def close(self) -> None:
        return None


class RealMps:
    """One MPS control daemon per GPU index in `gpus`, under `root`/gpu<N>/{pipe,log}."""

    kind = "mps"

    def __init__(self, root: Path, gpus: list[int], control: str = CONTROL,
                 cuda_ids: dict[int, str] | None = None) -> None:
        self.root = root
        self.gpus = gpus
        self.control = control
        self.cuda_ids = cuda_ids or {}  # GPU index -> CUDA_VISIBLE_DEVICES of its daemon (GpuInfo.cuda_id)
        self._started: list[int] = []

    def pipe_dir(self, gpu: int) -> Path:
        return self.root / f"gpu{gpu}" / "pipe"

    def log_dir(self, gpu: int) -> Path:
        return self.root / f"gpu{gpu}" / "log"

    def _env(self, gpu: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            CUDA_VISIBLE_DEVICES=self.cuda_ids.get(gpu, str(gpu)),
            CUDA_MPS_PIPE_DIRECTORY=str(self.pipe_dir(gpu)),
            CUDA_MPS_LOG_DIRECTORY=str(self.log_dir(gpu)),
        )
        return env

    async def _control(self, gpu: int, *args: str, stdin: str | None = None) -> str:
        daemon = "-d" in args  # forks a daemon that keeps what it inherited open: wait for the exit, not for EOF
        out_file = self.log_dir(gpu) / "meshd-control.out"
        with open(out_file, "wb") if daemon else contextlib.nullcontext() as out_fh:
            proc = await asyncio.create_subprocess_exec(
                self.control, *args, env=self._env(gpu),
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=out_fh if daemon else asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )
        try:  # a control daemon that does not answer must not hang meshd
            if daemon:
                await asyncio.wait_for(proc.wait(), CONTROL_TIMEOUT)
                out = out_file.read_bytes()
            else:
                out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None),
                                                CONTROL_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise RuntimeError(f"{self.control} {' '.join(args)} (GPU {gpu}) did not answer in "
                               f"{CONTROL_TIMEOUT:.0f} s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"{self.control} {' '.join(args)} (GPU {gpu}) exited {proc.returncode}: {out.decode()}")
        return out.decode()

    async def start(self) -> None:
        """Start each GPU's control daemon, or adopt the one a previous meshd left serving its jobs' ranks."""
        for gpu in self.gpus:
            self.pipe_dir(gpu).mkdir(parents=True, exist_ok=True)
            self.log_dir(gpu).mkdir(parents=True, exist_ok=True)
            if not await self._answers(gpu):
                await self._control(gpu, "-d")
            self._started.append(gpu)

    async def _answers(self, gpu: int) -> bool:
        """Whether a control daemon already listens on this GPU's pipe (a meshd restarted under live jobs)."""
        if not (self.pipe_dir(gpu) / "control").exists():
            return False
        try:
            await self._control(gpu, stdin="get_server_list\n")
        except (RuntimeError, OSError):  # a stale socket of a daemon that is gone
            return False
        return True

    async def _clients(self, gpu: int) -> list[str]:
        pids = []
        for server in (await self._control(gpu, stdin="get_server_list\n")).split():
            if server.isdigit():
                pids += [c for c in (await self._control(gpu, stdin=f"get_client_list {server}\n")).split() if c.isdigit()]
        return pids

    def client_env(self, gpu: int, share: int, mem_limit_mb: int | None = None) -> dict[str, str]:
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(gpu)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(gpu)),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, min(100, share))),
        }
        if mem_limit_mb:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mem_limit_mb}M"
        return env

    async def terminate_client(self, gpu: int, client_pid: int) -> None:
        servers = (await self._control(gpu, stdin="get_server_list\n")).split()
        for server in servers:
            if server.isdigit():
                await self._control(gpu, stdin=f"terminate_client {server} {client_pid}\n")

    async def alive(self, gpu: int) -> bool:
        """Whether the GPU's control daemon still answers (no: it died, and every client on the GPU with it)."""
        return await self._answers(gpu)

    async def revive(self, gpu: int) -> None:
        """Start the GPU's control daemon again after it died (meshd does so before placing a job there)."""
        if not await self._answers(gpu):
            await self._control(gpu, "-d")
        if gpu not in self._started:
            self._started.append(gpu)

    async def close(self) -> None:
        """Quit each control daemon that serves no client; one still serving a job's ranks (meshd stops, its jobs
        run on) is left for the next meshd to adopt: `quit` would refuse the job's next rank."""
        for gpu in reversed(self._started):
            try:
                if not await self._clients(gpu):
                    await self._control(gpu, stdin="quit\n")
            except (RuntimeError, OSError):
                pass
        self._started.clear()


def open_mps(config, gpus) -> MpsManager:
    """Real MPS when use_mps is on (with fake GPUs too: a stand-in control tool on PATH, as the tests do); else none."""
    if config.use_mps:
        inv = gpus.inventory()
        return RealMps(config.runtime_dir / "mps", [g.index for g in inv], cuda_ids={g.index: g.cuda_id for g in inv})
    return NoMps()
