"""A real PyTorch DDP training script: small MLP on synthetic regression data.

Runs unmodified standalone (`python examples/train.py`), under torchrun, and under meshd
(`mesh submit examples/train.py --gpus 2 -- --steps 50`): it reads torchrun's RANK/WORLD_SIZE/MASTER_*
contract, uses nccl on GPUs and gloo on CPU (fake GPUs), resumes from MESH_CHECKPOINT_DIR (written
atomically: temp file + rename), reports progress on MESH_SOCKET when present, and on SIGTERM all
ranks stop at the same step, checkpoint, and exit 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50, help="optimizer steps in total")
    p.add_argument("--batch-size", type=int, default=64, help="global batch (split across ranks)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--hidden", type=int, default=64)
    return p.parse_args()


def setup() -> tuple[int, int, torch.device]:
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world)
    return rank, world, device


def checkpoint_path() -> Path | None:
    d = os.environ.get("MESH_CHECKPOINT_DIR")
    return Path(d) / "train.pt" if d else None


def save(path: Path, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def main() -> None:
    args = parse_args()
    rank, world, device = setup()
    stop = torch.zeros(1, device=device)
    signal.signal(signal.SIGTERM, lambda *_: stop.fill_(1.0))
    client = None
    if rank == 0 and os.environ.get("MESH_SOCKET"):
        from meshsched.daemon.jobclient import JobClient

        client = JobClient.from_env()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    start = 0
    ckpt = checkpoint_path()
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    ddp = DDP(model)
    per_rank = max(1, args.batch_size // world)
    gen = torch.Generator().manual_seed(1234 + rank)
    true_w = torch.linspace(-1, 1, 16)
    if rank == 0:
        print(f"training: world={world} backend={dist.get_backend()} device={device} from step {start}", flush=True)
    step, t0, loss = start, time.perf_counter(), torch.zeros(())
    while step < args.steps:
        x = torch.randn(per_rank, 16, generator=gen)
        y = (x @ true_w).unsqueeze(1) + 0.01 * torch.randn(per_rank, 1, generator=gen)
        loss = nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        flag = stop.clone()
        dist.all_reduce(flag)  # every rank sees a SIGTERM at the same step
        if rank == 0:
            dt = time.perf_counter() - t0
            t0 = time.perf_counter()
            if client is not None:
                client.report(step, dt)
            if ckpt is not None and (step % args.checkpoint_every == 0 or flag.item() > 0):
                save(ckpt, model, opt, step)
                if client is not None:
                    client.checkpoint(step)
            if step % 10 == 0 or step == args.steps:
                print(f"step {step}/{args.steps} loss {loss.item():.4f}", flush=True)
        if flag.item() > 0:
            if rank == 0:
                print(f"stopping at step {step} (SIGTERM); checkpoint saved", flush=True)
            break
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and step >= args.steps:
        print(f"done: {step} steps, final loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
