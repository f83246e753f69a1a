"""A real PyTorch DDP training script on meshsched.job: small MLP on a fixed synthetic regression set.

Runs unmodified standalone (`python examples/train.py`), under torchrun, and under meshd
(`mesh submit examples/train.py --gpus 2 -- --steps 50`): it reads torchrun's RANK/WORLD_SIZE/MASTER_*
contract, uses nccl on GPUs and gloo on CPU (fake GPUs). meshsched.job does the rest: the elastic sampler
hands each rank its share of the global batch, checkpoints go atomically to MESH_CHECKPOINT_DIR and are
resumed on restart, SIGTERM or meshd's checkpoint-and-exit stops every rank at the same step (exit code
75: preempted, resumable), and progress is reported to meshd in the background.

Execution plans (MESH_PLAN, `mesh submit --plan`): data parallel (dpN = the ranks), gradient accumulation
(gaN: the SDK cuts each rank's share of the global batch into N micro-batches) and activation checkpointing
(gc: the hidden block's activations are recomputed in backward, torch.utils.checkpoint). The global batch is
the same under every plan, so a job reconfigured between plans (checkpoint, restart, resume) trains on.
Tensor/pipeline parallelism and ZeRO are not implemented here: such a plan is refused in one line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from meshsched import job


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50, help="optimizer steps in total")
    p.add_argument("--batch-size", type=int, default=64, help="global batch (split across ranks)")
    p.add_argument("--dataset-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--accum-steps", type=int, default=None,
                   help="gradient-accumulation steps (same global batch; default: meshd's choice, else 1)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step (stands in for compute)")
    p.add_argument("--log-every", type=int, default=10)
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


def dataset(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same n samples on every rank (seeded), so a sample index means the same sample everywhere."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=gen)
    y = (x @ torch.linspace(-1, 1, 16)).unsqueeze(1) + 0.01 * torch.randn(n, 1, generator=gen)
    return x, y


class Mlp(nn.Module):
    """16 -> hidden -> 1; with `recompute`, the hidden block's activations are recomputed in backward."""

    def __init__(self, hidden: int, recompute: bool = False) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 1)
        self.recompute = recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and self.training:
            return self.head(checkpoint(self.body, x, use_reentrant=False))
        return self.head(self.body(x))


def check_plan(plan, world: int) -> None:
    """The plans this script can run: dpN (N = the ranks) with gaN and gc."""
    if plan is None:
        return
    if plan.tp > 1 or plan.pp > 1 or plan.zero or plan.offload:
        raise SystemExit(f"plan {plan}: this example runs data parallel with accumulation (gaN) and activation "
                         "checkpointing (gc) only, not tensor/pipeline parallelism or ZeRO")
    if plan.dp != world:
        raise SystemExit(f"plan {plan}: dp{plan.dp} but {world} rank(s) run")


def main() -> None:
    args = parse_args()
    rank, world, device = setup()
    x, y = dataset(args.dataset_size)
    torch.manual_seed(0)
    sampler = job.ElasticSampler(args.dataset_size, args.batch_size, world_size=world, seed=0)
    sess = job.attach(sampler=sampler, checkpoint_every=args.checkpoint_every, accum_steps=args.accum_steps,
                      total_steps=args.steps)  # meshd's estimate and `mesh top` follow it: no --iters needed
    check_plan(sess.plan, world)  # MESH_PLAN; its gaN is already the session's accumulation
    model = Mlp(args.hidden, recompute=sess.plan is not None and sess.plan.gc).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    sess.track(model=model, optimizer=opt)
    start = sess.resume()
    ddp = DDP(model)
    if rank == 0:
        print(f"training: world={world} backend={dist.get_backend()} device={device} from step {start} "
              f"plan={sess.plan} accumulation={sess.accum_steps} recompute={model.recompute}", flush=True)
    loss_sum = torch.zeros((), device=device)
    while sess.step < args.steps:
        loss_sum.zero_()
        for mb in sess.micro_batches():
            with nullcontext() if mb.sync else ddp.no_sync():
                with sess.forward_timer():
                    loss = nn.functional.mse_loss(ddp(x[mb.indices].to(device)), y[mb.indices].to(device))
                (loss * mb.weight).backward()
            loss_sum += loss.detach() * mb.weight / world  # this rank's part of the global-batch mean loss
        opt.step()
        opt.zero_grad()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        dist.all_reduce(loss_sum)  # the loss of the global batch, whatever the split
        step = sess.step + 1
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            print(f"step {step}/{args.steps} loss {loss_sum.item():.8f}", flush=True)
        if sess.end_step():
            if rank == 0:
                print(f"stopping at step {sess.step} ({sess.exit_reason}); checkpoint saved", flush=True)
            sess.exit()
    sess.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"done: {sess.step} steps, final loss {loss_sum.item():.4f}", flush=True)
    # Leave without the interpreter's teardown: with torch 2.13 on CPU (gloo), it aborted a rank after "done"
    # ("terminate called without an active exception", exit 134) in 3 of 60 two-rank runs, which meshd would
    # report as a failed job. Everything is saved and the process group is destroyed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
