"""meshd on a real GPU: NVML inventory and readings, a CUDA job through the `mesh` CLI, checkpoint-and-exit
and resume, and a Castor pair colocated under real MPS thread limits, kept across a kill -9 of meshd.

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_meshd.py [--out DIR] [--json] [--steps-scale 1.0]

Needs meshsched installed (`mesh`, `meshd` on PATH, else `python -m`), a CUDA GPU, NVML and, for the second
part, nvidia-cuda-mps-control. Each part starts its own meshd in a fresh directory and stops it at the end.
The jobs are benchmarks/gpu_job.py (a Gavel-family model of benchmarks/gpu_models.py, synthetic inputs on
the GPU, meshsched.job for progress and checkpoints).

1. nvml (policy sjf, MPS off): `mesh nodes --json` (backend, type, memory), one resnet18 job: submit ->
   RUNNING, GPU readings in `mesh top --json` while it trains, `mesh requeue` (checkpoint-and-exit), the
   resumed step, COMPLETED, its step time; then examples/train.py (DDP, nccl on the GPU) to COMPLETED.
2. mps (policy castor, use_mps, gpu_type v100: the profiles cover no Hopper GPU, so Castor judges the pair
   with V100's): resnet18 b128 alone, then lm b20; both on GPU 0 (the pair's micro-batch and MPS shares as
   meshd set them, and as the ranks saw them), step times alone and shared, `nvidia-smi` compute apps, kill -9
   of meshd and a new meshd: both jobs RUNNING with the same execution settings; cancel; MPS quits.
3. gimbal (policy sjf-ffs+gimbal, use_mps, gpu_type v100): the same pair submitted together; LGRR squeezes one
   job of the shared GPU to a lower MPS thread percentage, its rank restarts under it; both step times after
   (compare with part 2's, shared at 100 %).
Every check is recorded as passed or failed with what was seen; the script exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = str(ROOT / "benchmarks" / "gpu_job.py")


def tool(name: str, module: str) -> list[str]:
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", module]


EXTRA: list[str] = []
MIN_STEPS = [0]  # --min-steps
MODELS = [("resnet18", 128), ("lm", 20)]  # --models: the first job's, its partner's
LOG_EVERY = [10]  # --log-every
MESH, MESHD = tool("mesh", "meshsched.cli.main"), tool("meshd", "meshsched.daemon.main")


class Run:
    """One meshd in its own directory, and the checks made against it."""

    def __init__(self, name: str, work: Path, env: dict[str, str], args: list[str], checks: list[dict]) -> None:
        self.name, self.dir, self.checks = name, work / name, checks
        self.dir.mkdir(parents=True)
        self.env = dict(os.environ, MESH_API_SOCKET=str(self.dir / "run" / "api.sock"), **env)
        # jobs run as from a shell with this venv active: their .py scripts on its python3 (mesh submit --export)
        self.env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), self.env.get("PATH", "")])
        self.args = [*MESHD, "--state-dir", str(self.dir / "state"), "--runtime-dir", str(self.dir / "run"), *args,
                     *EXTRA]
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.dir / f"meshd{self.starts}.log", "wb")
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        sock = Path(self.env["MESH_API_SOCKET"])
        if self.starts > 1:
            time.sleep(0.5)  # the killed meshd's socket file may still be there
        wait(lambda: sock.exists() and self.mesh("nodes", "--json", check=False) is not None, 60, "meshd up")

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def mesh(self, *args: str, check: bool = True):
        out = subprocess.run([*MESH, *args], env=self.env, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            if check:
                raise RuntimeError(f"mesh {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
            return None
        return json.loads(out.stdout) if "--json" in args else out.stdout

    def submit(self, model: str, batch: int, steps: int, declared: tuple[str, int] | None = None) -> str:
        """gpu_job.py training `model` at `batch`; meshd is told `declared` (model, batch) when given."""
        said, said_batch = declared or (model, batch)
        job = self.mesh("submit", JOB, "--gpus", "1", "--model", said, "--batch-size", str(said_batch),
                        "--iters", str(steps), "--json", "--",  # --iters: the length is known at the first pass
                        "--model", model, "--batch", str(batch), "--steps", str(steps),
                        "--log-every", str(LOG_EVERY[0]))
        return job["job_id"]

    def show(self, job: str) -> dict:
        return self.mesh("show", job, "--json")

    def lines(self, job: str) -> list[dict]:
        log = self.dir / "state" / "jobs" / job / "logs" / "rank0.log"
        out = []
        for line in (log.read_text(errors="replace").splitlines() if log.exists() else []):
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

    def check(self, what: str, ok: bool, seen) -> bool:
        self.checks.append({"part": self.name, "check": what, "ok": bool(ok), "seen": seen})
        print(f"[{'ok' if ok else 'FAILED'}] {self.name}: {what}: {seen}", flush=True)
        return ok


def wait(pred, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = pred()
        except (RuntimeError, OSError, ValueError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def state(run: Run, job: str) -> str:
    return run.show(job)["state"]


def step_times(lines: list[dict], after: float = 0.0, before: float = float("inf")) -> list[float]:
    return [x["step_s"] for x in lines if x.get("event") == "steps" and after <= x["t"] <= before]


def smi(*query: str) -> str:
    try:
        return subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi: {exc}"


def part_nvml(work: Path, checks: list[dict], scale: float) -> dict:
    run = Run("nvml", work, {}, ["--policy", "sjf"], checks)
    fig: dict = {}
    run.start()
    try:
        node = run.mesh("nodes", "--json")[0]
        run.check("NVML backend", node.get("backend") == "nvml", {k: node.get(k) for k in ("backend", "total_gpus")})
        gpu0 = node["gpus"][0]
        fig["gpu"] = {k: gpu0.get(k) for k in ("name", "uuid", "memory_total_mb")}
        t0 = time.time()
        job = run.submit(*MODELS[0], max(MIN_STEPS[0] or 60, int(3000 * scale)))
        wait(lambda: state(run, job) == "RUNNING", 60, "RUNNING")
        fig["submit_to_running_s"] = time.time() - t0
        first = wait(lambda: [x for x in run.lines(job) if x.get("event") == "steps"], 120, "first steps")
        fig["submit_to_first_steps_s"] = first[0]["t"] - t0
        start = next(x for x in run.lines(job) if x.get("event") == "start")
        run.check("rank sees the GPU by UUID, on CUDA", start["cuda_visible"] == gpu0["uuid"] and start["device"] != "cpu",
                  {"cuda_visible": start["cuda_visible"], "device": start["device"]})
        top = run.mesh("top", "--once", "--json")["nodes"][0]["gpus"][0]
        time.sleep(2)
        top = max(top, run.mesh("top", "--once", "--json")["nodes"][0]["gpus"][0], key=lambda g: g["utilization"])
        run.check("NVML readings while training", top["memory_used_mb"] > 0 and top["utilization"] > 0,
                  {k: top[k] for k in ("utilization", "memory_used_mb", "temperature")})
        time.sleep(3)
        t1 = time.time()
        run.mesh("requeue", job)
        wait(lambda: any(x.get("event") == "stop" for x in run.lines(job)), 60, "checkpoint-and-exit")
        stop = next(x for x in run.lines(job) if x.get("event") == "stop")
        fig["requeue_to_paused_s"] = wait(lambda: [s for s in run.show(job)["history"]
                                                    if s[0] > t1 and s[1] in ("PENDING", "LOADING")], 60, "paused")[0][0] - t1
        wait(lambda: len([x for x in run.lines(job) if x.get("event") == "start"]) == 2, 120, "restarted")
        resumed = [x for x in run.lines(job) if x.get("event") == "start"][1]["from_step"]
        run.check("resumed from its checkpoint", 0 < resumed <= stop["step"], {"stopped_at": stop["step"], "resumed": resumed})
        wait(lambda: state(run, job) in ("COMPLETED", "FAILED"), 600, "end")
        run.check("COMPLETED", state(run, job) == "COMPLETED", state(run, job))
        fig["step_s_alone_median"] = statistics.median(step_times(run.lines(job))[1:] or [0])
        ddp = run.mesh("submit", str(ROOT / "examples" / "train.py"), "--gpus", "1", "--json", "--", "--steps", "40")["job_id"]
        wait(lambda: state(run, ddp) in ("COMPLETED", "FAILED"), 120, "examples/train.py ends")
        log = (run.dir / "state" / "jobs" / ddp / "logs" / "rank0.log").read_text(errors="replace")
        head = next((x for x in log.splitlines() if x.startswith("training:")), log[-300:])
        run.check("examples/train.py COMPLETED with nccl on CUDA", state(run, ddp) == "COMPLETED"
                  and "backend=nccl" in head and "device=cuda" in head, head)
    finally:
        run.stop()
    return fig


def part_mps(work: Path, checks: list[dict], scale: float) -> dict:
    if not shutil.which("nvidia-cuda-mps-control"):
        checks.append({"part": "mps", "check": "nvidia-cuda-mps-control on PATH", "ok": False, "seen": None})
        return {}
    run = Run("mps", work, {"MESHD_USE_MPS": "true", "MESHD_GPU_TYPE": "v100"}, ["--policy", "castor"], checks)
    fig: dict = {}
    run.start()
    try:
        a = run.submit(*MODELS[0], max(MIN_STEPS[0] or 200, int(8000 * scale)))
        wait(lambda: len(step_times(run.lines(a))) >= 4, 120, "a trains alone")
        t_b = time.time()
        b = run.submit(*MODELS[1], max(MIN_STEPS[0] or 100, int(8000 * scale)))
        wait(lambda: state(run, b) == "RUNNING", 60, "b RUNNING")
        ja, jb = run.show(a), run.show(b)
        run.check("Castor pairs b with a on GPU 0", ja["assigned"] == jb["assigned"] and b in ja.get("partners", []),
                  {"a": ja["assigned"], "b": jb["assigned"], "a_partners": ja.get("partners")})
        wait(lambda: len(step_times(run.lines(b))) >= 3, 120, "b trains")
        sb = next(x for x in run.lines(b) if x.get("event") == "start")
        run.check("b's rank got meshd's micro-batch and MPS share",
                  sb["micro"] == jb["exec"]["micro_batch"] and sb["mps"] == str(jb["exec"]["mps_percentage"]),
                  {"exec": jb["exec"], "rank_saw": {k: sb[k] for k in ("micro", "accum", "mps", "cuda_visible")}})
        fig["exec"] = {"a": ja["exec"], "b": jb["exec"]}
        fig["compute_apps"] = smi("--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader")
        run.check("MPS server holds the GPU", "mps-server" in fig["compute_apps"], fig["compute_apps"])
        time.sleep(10)
        t_shared = time.time()
        alone_a = step_times(run.lines(a), before=t_b)[1:]
        shared_a = step_times(run.lines(a), after=t_b + 8)
        shared_b = step_times(run.lines(b))[1:]
        fig["step_s"] = {"a_alone": statistics.median(alone_a or [0]), "a_shared": statistics.median(shared_a or [0]),
                         "b_shared": statistics.median(shared_b or [0])}
        run.kill9()
        run.start()
        ja2, jb2 = run.show(a), run.show(b)
        run.check("after kill -9 and restart both still RUNNING with their ExecConfig",
                  ja2["state"] == jb2["state"] == "RUNNING" and ja2["exec"] == ja["exec"] and jb2["exec"] == jb["exec"],
                  {"a": [ja2["state"], ja2["exec"]], "b": [jb2["state"], jb2["exec"]]})
        n_before = len(step_times(run.lines(a)))
        wait(lambda: len(step_times(run.lines(a))) > n_before + 2, 60, "a trains on after the restart")
        run.check("a trains on after the restart", True, len(step_times(run.lines(a))) - n_before)
        fig["shared_seconds_measured"] = time.time() - t_shared
        run.mesh("cancel", a, b)
        wait(lambda: state(run, a) == state(run, b) == "CANCELLED", 60, "cancelled")
        run.check("both CANCELLED", True, "CANCELLED")
    finally:
        run.stop()
    time.sleep(2)
    left = smi("--query-compute-apps=pid,process_name", "--format=csv,noheader")
    mps_left = subprocess.run(["pgrep", "-fa", "nvidia-cuda-mps"], capture_output=True, text=True).stdout.strip()
    run.check("nothing left on the GPU, MPS quit", not left and not mps_left, {"apps": left, "mps": mps_left})
    return fig


def part_gimbal(work: Path, checks: list[dict], scale: float) -> dict:
    """Gimbal's LGRR squeezes one job of a shared GPU to a lower MPS thread percentage (sjf-ffs+gimbal on V100
    profiles squeezes resnet18 b128 next to lm b20 to 60 % in the simulator): the ranks restart under it and
    their real step times show what the limit does on this GPU."""
    if not shutil.which("nvidia-cuda-mps-control"):
        return {}
    env = {"MESHD_USE_MPS": "true", "MESHD_GPU_TYPE": "v100", "MESH_REPORT_INTERVAL": "0.05"}
    run = Run("gimbal", work, env, ["--policy", "sjf-ffs+gimbal"], checks)
    fig: dict = {}
    run.start()
    try:
        # Both at once: Gimbal calibrates the pair when b starts, on predictions (once a job reports, a change
        # must beat the measurement noise, STRAGGLER_TOLERANCE, and this pair's predicted gain is 2-6 %).
        t_b = time.time()
        a = run.submit(*MODELS[0], max(MIN_STEPS[0] or 200, int(20000 * scale)))
        b = run.submit(*MODELS[1], max(MIN_STEPS[0] or 200, int(20000 * scale)))

        def squeezed():
            for j in (a, b):
                row = run.show(j)
                if row["exec"]["mps_percentage"] < 100 and row["state"] == "RUNNING":
                    return j, row
            return None

        sq, row = wait(squeezed, 120, "a job squeezed")
        share = row["exec"]["mps_percentage"]
        t_sq = time.time()
        starts = wait(lambda: [x for x in run.lines(sq) if x.get("event") == "start" and x["mps"] == str(share)],
                      60, "the squeezed job relaunched under its share")
        run.check("LGRR squeezed one job; its rank runs under CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", bool(starts),
                  {"job": "a" if sq == a else "b", "share": share, "partners": row.get("partners")})
        t_run = starts[0].get("t", t_sq)
        wait(lambda: len(step_times(run.lines(sq), after=t_run)) >= 6, 120, "the squeezed job trains")
        time.sleep(5)
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        fig["squeezed"], fig["share"] = "a" if sq == a else "b", share
        fig["step_s"] = {"a_after_squeeze": med(step_times(run.lines(a), after=t_run)[1:]),
                         "b_after_squeeze": med(step_times(run.lines(b), after=t_run)[1:])}
        fig["submit_to_squeeze_s"] = t_sq - t_b
        run.mesh("cancel", a, b)
        wait(lambda: state(run, a) == state(run, b) == "CANCELLED", 60, "cancelled")
    finally:
        run.stop()
    return fig


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="write gpu_meshd.json and the meshd/job logs here")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--steps-scale", type=float, default=1.0, help="scale the jobs' steps (smaller: quicker)")
    p.add_argument("--parts", default="nvml,mps,gimbal")
    p.add_argument("--models", default="resnet18:128,lm:20", help="MODEL:BATCH of the first job and its partner")
    p.add_argument("--log-every", type=int, default=10, help="the jobs' steps per log line")
    p.add_argument("--min-steps", type=int, default=0, help="each job's fewest steps (default 60/200/100)")
    p.add_argument("--meshd-args", default="", help="more meshd flags (a rehearsal without a GPU: --fake-gpus 1)")
    args = p.parse_args()
    EXTRA[:] = args.meshd_args.split()
    MIN_STEPS[0] = args.min_steps
    LOG_EVERY[0] = args.log_every
    MODELS[:] = [(m.split(":")[0], int(m.split(":")[1])) for m in args.models.split(",")]
    work = Path(tempfile.mkdtemp(prefix="gpu-meshd-"))
    checks: list[dict] = []
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "smi": smi("-L"),
                    "driver": smi("--query-gpu=driver_version,compute_mode", "--format=csv,noheader"),
                    "mps_control": shutil.which("nvidia-cuda-mps-control"), "checks": checks}
    for part, fn in (("nvml", part_nvml), ("mps", part_mps), ("gimbal", part_gimbal)):
        if part not in args.parts.split(","):
            continue
        t0 = time.time()
        try:
            result[part] = fn(work, checks, args.steps_scale)
        except Exception as exc:  # a part that breaks is a failed check, and the next part still runs
            checks.append({"part": part, "check": "ran to the end", "ok": False, "seen": f"{type(exc).__name__}: {exc}"})
            print(f"[FAILED] {part}: {type(exc).__name__}: {exc}", flush=True)
        result.setdefault(part, {})["wall_s"] = time.time() - t0
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_meshd.json").write_text(json.dumps(result, indent=1))
        subprocess.run(["tar", "czf", str(args.out / "logs.tgz"), "-C", str(work), "."], check=False)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{'part':6} {'check':70} ok")
        for c in checks:
            print(f"{c['part']:6} {c['check'][:70]:70} {'yes' if c['ok'] else 'NO'}")
        for part in ("nvml", "mps", "gimbal"):
            print(part, json.dumps({k: v for k, v in result.get(part, {}).items() if k != "compute_apps"}))
    return 0 if checks and all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
