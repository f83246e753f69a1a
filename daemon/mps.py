"""NVIDIA MPS behind one interface: one control daemon per GPU (own pipe and log directories), or none.

`RealMps` starts `nvidia-cuda-mps-control -d` per GPU with CUDA_VISIBLE_DEVICES, CUDA_MPS_PIPE_DIRECTORY
and CUDA_MPS_LOG_DIRECTORY of that GPU, gives each worker the environment of its GPU's server (pipe dir,
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), sends `terminate_client` before any
signal, and `quit` on close. `NoMps` is used when MPS is off in the config (the default).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Protocol

CONTROL = "nvidia-cuda-mps-control"


class MpsManager(Protocol):
    kind: str

    async def start(self) -> None: ...

    def client_env(self, gpu: int, share: int, mem_limit_mb: int | None = None) -> dict[str, str]: ...

    async def terminate_client(self, gpu: int, client_pid: int) -> None: ...

    async def close(self) -> None: ...


class NoMps:
    kind = "none"

    async def start(self) -> None:
        return None

    def client_env(self, gpu: int, share: int, mem_limit_mb: int | None = None) -> dict[str, str]:
        return {}

    async def terminate_client(self, gpu: int, client_pid: int) -> None:
        return None

    async def close(self) -> None:
        return None


class RealMps:
    """One MPS control daemon per GPU index in `gpus`, under `root`/gpu<N>/{pipe,log}."""

    kind = "mps"

    def __init__(self, root: Path, gpus: list[int], control: str = CONTROL) -> None:
        self.root = root
        self.gpus = gpus
        self.control = control
        self._started: list[int] = []

    def pipe_dir(self, gpu: int) -> Path:
        return self.root / f"gpu{gpu}" / "pipe"

    def log_dir(self, gpu: int) -> Path:
        return self.root / f"gpu{gpu}" / "log"

    def _env(self, gpu: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            CUDA_VISIBLE_DEVICES=str(gpu),
            CUDA_MPS_PIPE_DIRECTORY=str(self.pipe_dir(gpu)),
            CUDA_MPS_LOG_DIRECTORY=str(self.log_dir(gpu)),
        )
        return env

    async def _control(self, gpu: int, *args: str, stdin: str | None = None) -> str:
        proc = await asyncio.create_subprocess_exec(
            self.control, *args, env=self._env(gpu),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate(stdin.encode() if stdin is not None else None)
        if proc.returncode != 0:
            raise RuntimeError(f"{self.control} {' '.join(args)} (GPU {gpu}) exited {proc.returncode}: {out.decode()}")
        return out.decode()

    async def start(self) -> None:
        for gpu in self.gpus:
            self.pipe_dir(gpu).mkdir(parents=True, exist_ok=True)
            self.log_dir(gpu).mkdir(parents=True, exist_ok=True)
            await self._control(gpu, "-d")
            self._started.append(gpu)

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

    async def close(self) -> None:
        for gpu in reversed(self._started):
            try:
                await self._control(gpu, stdin="quit\n")
            except (RuntimeError, OSError):
                pass
        self._started.clear()


def open_mps(config, gpus) -> MpsManager:
    """Real MPS when use_mps is on (with fake GPUs too: a stand-in control tool on PATH, as the tests do); else none."""
    if config.use_mps:
        return RealMps(config.runtime_dir / "mps", [g.index for g in gpus.inventory()])
    return NoMps()
