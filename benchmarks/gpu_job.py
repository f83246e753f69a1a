"""A Gavel-family training job on a real GPU under meshd, for benchmarks/gpu_meshd.py.

    mesh submit benchmarks/gpu_job.py --gpus 1 --model resnet18 --batch-size 128 -- --model resnet18 --batch 128

Trains benchmarks/gpu_models.py's model at meshd's micro-batch (MESH_MICRO_BATCH, else --batch) and
accumulation (MESH_ACCUM_STEPS through meshsched.job), on synthetic inputs already on the device (cuda:0, else
the CPU); progress, checkpoints and checkpoint-and-exit go through meshsched.job. Prints a JSON line at start
(resumed step, micro-batch, accumulation, MPS share, CUDA_VISIBLE_DEVICES, device) and every --log-every steps
(step, wall clock, mean step time since the last line), so a driver can compare step times alone and shared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_models import build  # noqa: E402

from meshsched import job  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18", help="resnet18, resnet50, lm, transformer, recommendation")
    p.add_argument("--batch", type=int, default=128, help="per-GPU batch (meshd's micro-batch x accumulation)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=50)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    torch.backends.cudnn.benchmark = True
    sess = job.attach(total_steps=args.steps, checkpoint_every=args.checkpoint_every)
    micro = int(os.environ.get("MESH_MICRO_BATCH") or args.batch)
    net, opt, step, _, _ = build(args.model, micro, device)
    sess.track(model=net, optimizer=opt)
    start = sess.resume()
    print(json.dumps({"event": "start", "t": time.time(), "from_step": start, "micro": micro, "accum": sess.accum_steps,
                      "mps": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                      "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "device": torch.cuda.get_device_name(0) if cuda else "cpu", "pid": os.getpid()}), flush=True)
    last, n = time.perf_counter(), 0
    while sess.step < args.steps:
        with sess.forward_timer():
            step(sess.accum_steps)
            if cuda:
                torch.cuda.synchronize()
        n += 1
        if sess.end_step(samples=micro * sess.accum_steps):
            print(json.dumps({"event": "stop", "step": sess.step, "reason": sess.exit_reason}), flush=True)
            sess.exit()
        if sess.step % args.log_every == 0:
            now = time.perf_counter()
            print(json.dumps({"event": "steps", "step": sess.step, "t": time.time(), "step_s": (now - last) / n}),
                  flush=True)
            last, n = now, 0
    sess.close()
    print(json.dumps({"event": "done", "step": sess.step}), flush=True)


if __name__ == "__main__":
    main()
