"""meshsched.job's per-step overhead on a 50 ms training step (2 ranks, DDP on gloo, CPU).

    python benchmarks/sdk_overhead.py [--steps 200] [--step-ms 50] [--world 2] [--repeat 3]

Each rank runs the same DDP step (a small MLP forward/backward padded with sleep to --step-ms) with and
without the SDK, in alternating blocks. With the SDK every step also takes its indices from the elastic
sampler, times its forward pass, and calls `end_step()` (records a report for the background reporter and
all-reduces the exit/directive flags); reports go to a stand-in job socket in this process, as under meshd.
Prints, from rank 0: the SDK calls' own time per step (measured around them) and the difference of mean
step times (A/B), both as a percentage of the step. Target: under 1 %. Checkpoint writes are reported
separately (their cost is paid once every `checkpoint_every` steps, by rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import socketserver
import statistics
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path

from meshsched.wire.protocol import MESSAGE_TYPES, FrameDecoder, encode_frame


class _JobSocket(socketserver.BaseRequestHandler):
    """Answers every frame with `ok`, like meshd's job socket."""

    def handle(self) -> None:
        decoder = FrameDecoder(MESSAGE_TYPES)
        while data := self.request.recv(65536):
            for msg in decoder.feed(data):
                self.request.sendall(encode_frame({"type": "ok", "seq": msg.get("seq")}))


def _rank(rank: int, args: argparse.Namespace, init: str, sock: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from meshsched import job

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.world), MESH_JOB_ID="bench", MESH_SOCKET=sock)
    os.environ.pop("MESH_CHECKPOINT_DIR", None)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.world)
    n, batch = 4096, 64
    x, y = torch.randn(n, 64), torch.randn(n, 1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = job.ElasticSampler(n, batch, world_size=args.world)
    sess = job.attach(sampler=sampler, rng=False)
    budget = args.step_ms / 1000.0
    local = batch // args.world

    def step(use_sdk: bool, k: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        sdk = 0.0
        if use_sdk:
            s0 = time.perf_counter()
            mbs = sess.micro_batches()
            sdk += time.perf_counter() - s0
        else:
            start = (k * batch + rank * local) % (n - local)
            mbs = [job.MicroBatch(list(range(start, start + local)), 1.0, True)]
        for mb in mbs:
            with nullcontext() if mb.sync else ddp.no_sync():
                with sess.forward_timer() if use_sdk else nullcontext():
                    loss = nn.functional.mse_loss(ddp(x[mb.indices]), y[mb.indices])
                (loss * mb.weight).backward()
        opt.step()
        opt.zero_grad()
        rest = budget - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)
        if use_sdk:
            s0 = time.perf_counter()
            sess.end_step()
            sdk += time.perf_counter() - s0
        return time.perf_counter() - t0, sdk

    results = {"with": [], "without": [], "sdk": []}
    block = 20
    for r in range(args.repeat):
        for b in range(args.steps // block):
            for use_sdk in (b % 2 == 0, b % 2 == 1):
                for k in range(block):
                    wall, sdk = step(use_sdk, k)
                    results["with" if use_sdk else "without"].append(wall)
                    if use_sdk:
                        results["sdk"].append(sdk)
    ckpt_ms = []
    with tempfile.TemporaryDirectory() as d:
        saver = job.Checkpointer(d)
        states = [job.TorchState("model", model), job.TorchState("optimizer", opt), job.TorchState("sampler", sampler)]
        for i in range(5):
            t0 = time.perf_counter()
            saver.save(i, states)
            ckpt_ms.append((time.perf_counter() - t0) * 1000)
    reports = sess.reporter.sent if sess.reporter else 0
    sess.close()
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps({**results, "checkpoint_ms": ckpt_ms, "frames_sent": reports}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="steps per mode per repeat")
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="sdkb", dir="/tmp") as tmp:
        sock = os.path.join(tmp, "job.sock")
        server = socketserver.ThreadingUnixStreamServer(sock, _JobSocket)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        out = os.path.join(tmp, "out.json")
        mp.start_processes(_rank, args=(args, f"file://{tmp}/rdv", sock, out), nprocs=args.world,
                           start_method="spawn")
        server.shutdown()
        res = json.loads(Path(out).read_text())
    step_s = args.step_ms / 1000.0
    sdk = statistics.mean(res["sdk"])
    with_, without = statistics.mean(res["with"]), statistics.mean(res["without"])
    if args.json:
        print(json.dumps({
            "world": args.world, "step_ms": args.step_ms, "steps_per_mode": len(res["with"]),
            "report_frames": res["frames_sent"], "sdk_us_mean": round(sdk * 1e6, 1),
            "sdk_us_p50": round(statistics.median(res["sdk"]) * 1e6, 1), "sdk_us_max": round(max(res["sdk"]) * 1e6, 1),
            "sdk_share_of_step": round(sdk / step_s, 5), "step_ms_with_sdk": round(with_ * 1e3, 3),
            "step_ms_without_sdk": round(without * 1e3, 3),
            "checkpoint_ms_p50": round(statistics.median(res["checkpoint_ms"]), 2)}, indent=1))
        return
    print(f"world={args.world} step={args.step_ms:.0f} ms, {len(res['with'])} steps per mode, "
          f"{res['frames_sent']} report frames from rank 0")
    print(f"SDK calls per step (rank 0): mean {sdk * 1e6:.0f} us, p50 {statistics.median(res['sdk']) * 1e6:.0f} us, "
          f"max {max(res['sdk']) * 1e6:.0f} us = {100 * sdk / step_s:.2f} % of the step")
    print(f"A/B mean step: with SDK {with_ * 1e3:.2f} ms, without {without * 1e3:.2f} ms, "
          f"difference {100 * (with_ - without) / step_s:+.2f} % of the step")
    print(f"checkpoint save (rank 0, model+optimizer+sampler): median {statistics.median(res['checkpoint_ms']):.1f} ms")


if __name__ == "__main__":
    main()
