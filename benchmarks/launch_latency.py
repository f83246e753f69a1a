"""meshd's launch and exit cost on fake GPUs: where a run's wall time beyond its training goes.

    .venv/bin/python benchmarks/launch_latency.py [--gpus 1,4,8] [--repeat 5] [--pauses 5] [--json]

One real `meshd --fake-gpus 8` (benchmarks/parity.py's) runs examples/fake_train.py jobs one at a time (2
steps of resnet50 at C = 75,000, as in the parity benchmark). Per job size, the medians of (milliseconds):

    launch -> rank 0 process   meshd launches -> the first rank's process exists (supervisor start-up, its
                               imports, spawning; /proc start times: 10 ms resolution)
    launch -> last rank        ... the last rank's process exists (ranks are spawned one after another)
    launch -> training         ... rank 0 trains (every rank's interpreter, imports, meshsched.job, the
                               model's load time / C, here 0.3 ms)
    rank 0 done -> last rank   rank 0 wrote its stop record -> the last rank wrote its own
    rank 0 done -> result      ... the supervisor wrote result.json (every process of the job is gone)
    result -> meshd            ... meshd marked the job ended (supervisor exit, meshd noticing, the /proc scan)
    overhead                   launch -> meshd's end, less rank 0's training time: what every run costs

Then (--pauses, on a second meshd with one fake GPU under srtf) the pause latency: a long 1-GPU job at the
SDK's default report interval is preempted by a short one; PAUSING -> PREEMPTED in meshd's history
(directive delivered, checkpoint, exit, meshd noticing), median in ms.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parity import FAKE_TRAIN, GPU_TYPE, Meshd  # noqa: E402

C = 75000
PHASES = ("launch -> rank 0 process", "launch -> last rank", "launch -> training", "rank 0 done -> last rank",
          "rank 0 done -> result", "result -> meshd", "overhead")


def run_job(m: Meshd, root: Path, gpus: int, name: str, iterations: int = 2, wait: bool = True,
            interval: str = "0.05") -> dict:
    env = {"MESH_FAKE_GPU_DIR": str(root / "fakegpus"), "MESH_FAKE_RECORDS": str(root / "records.jsonl"),
           "MESH_REPORT_INTERVAL": interval, "MESH_FAKE_COMPRESS": str(C), "MESH_FAKE_ITERS_PER_STEP": str(C),
           "MESH_FAKE_GPU_TYPE": GPU_TYPE}
    if not interval:
        del env["MESH_REPORT_INTERVAL"]  # the SDK's default
    cmd = [sys.executable, str(FAKE_TRAIN), "--model", "resnet50", "--batch-size", "128", "--iterations",
           str(iterations)]
    body = {"command": cmd, "cwd": str(root), "gpus": gpus, "model": "resnet50", "batch_size": 128,
            "iterations": iterations, "name": name, "env": env}
    job_id = m.client.call("POST", "/v1/jobs", body)["job_id"]
    if not wait:
        return m.client.call("GET", f"/v1/jobs/{job_id}")
    while (x := m.client.call("GET", f"/v1/jobs/{job_id}"))["state"] not in ("COMPLETED", "FAILED", "CANCELLED"):
        time.sleep(0.02)
    if x["state"] != "COMPLETED":
        raise SystemExit(f"launch_latency: job {name} ended {x['state']} (see {root})")
    return x


def phases(x: dict, records: list[dict], job_dir: Path) -> dict[str, float]:
    mine = [r for r in records if r["job"] == x["job_id"]]
    starts = [r["start"] for r in mine if r["event"] == "start"]
    stops = [r for r in mine if r["event"] == "stop"]
    r0 = next(r for r in stops if r["rank"] == 0)
    result = (job_dir / "result.json").stat().st_mtime
    launch, end = x["start_time"], x["end_time"]
    ms = {PHASES[0]: min(starts) - launch, PHASES[1]: max(starts) - launch, PHASES[2]: r0["train_start"] - launch,
          PHASES[3]: max(r["stop"] for r in stops) - r0["stop"], PHASES[4]: result - r0["stop"],
          PHASES[5]: end - result, PHASES[6]: end - launch - (r0["stop"] - r0["train_start"])}
    return {k: round(v * 1000, 1) for k, v in ms.items()}


def pause_latencies(root: Path, repeat: int) -> list[float]:
    """PAUSING -> PREEMPTED (ms) of a long job preempted by a short one (srtf, one fake GPU, default interval)."""
    root.mkdir()
    m = Meshd(root, "srtf", 1)
    out = []
    try:
        for i in range(repeat):
            long = run_job(m, root, 1, f"long-{i}", iterations=100000, wait=False, interval="")
            while m.client.call("GET", f"/v1/jobs/{long['job_id']}")["state"] != "RUNNING":
                time.sleep(0.02)
            time.sleep(0.5)  # trained a while
            run_job(m, root, 1, f"short-{i}", interval="")
            m.client.call("POST", f"/v1/jobs/{long['job_id']}/cancel", {})
            history = m.client.call("GET", f"/v1/jobs/{long['job_id']}")["history"]
            out += [(b[0] - a[0]) * 1000 for a, b in zip(history, history[1:]) if a[1] == "PAUSING"][:1]
    finally:
        m.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", default="1,4,8", help="job sizes (fake GPUs; the node has 8)")
    p.add_argument("--repeat", type=int, default=5, help="jobs per size")
    p.add_argument("--pauses", type=int, default=5, help="preemptions to time (0: none)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    sizes = [int(g) for g in args.gpus.split(",")]
    root = Path(tempfile.mkdtemp(prefix="launchlat-"))
    m = Meshd(root, "sjf", 8)
    jobs: list[tuple[int, dict]] = []
    try:
        for g in sizes:
            for i in range(args.repeat):
                jobs.append((g, run_job(m, root, g, f"g{g}-{i}")))
                time.sleep(0.2)  # the previous job's processes are gone: no overlap
    finally:
        m.close()
    records = [json.loads(line) for line in (root / "records.jsonl").read_text().splitlines()]
    out = {"load_average": Path("/proc/loadavg").read_text().split()[:3], "repeat": args.repeat, "sizes": {}}
    for g in sizes:
        rows = [phases(x, records, root / "state" / "jobs" / x["job_id"]) for gg, x in jobs if gg == g]
        out["sizes"][g] = {k: statistics.median(r[k] for r in rows) for k in PHASES} | {
            "overhead_all": [r[PHASES[6]] for r in rows]}
    if args.pauses:
        pauses = pause_latencies(root / "pause", args.pauses)
        out["pause_ms"] = {"median": statistics.median(pauses), "all": [round(x, 1) for x in pauses]}
    shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(out))
        return
    print(f"medians of {args.repeat} jobs per size, ms (load average {' '.join(out['load_average'])})")
    print(f"{'phase':28}" + "".join(f"{g:>9} GPU" for g in sizes))
    for k in PHASES:
        print(f"{k:28}" + "".join(f"{out['sizes'][g][k]:>13,.1f}" for g in sizes))
    if args.pauses:
        print(f"pause latency (preemption at the default report interval -> PREEMPTED): median "
              f"{out['pause_ms']['median']:,.1f} ms of {args.pauses}")


if __name__ == "__main__":
    main()
