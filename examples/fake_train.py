"""A fake training job for meshd on fake GPUs: it trains at the speed the performance model gives, no torch.

    mesh submit examples/fake_train.py --gpus 2 --model resnet50 --batch-size 128 --iters 400 -- \
        --model resnet50 --batch-size 128 --iterations 400

Each step takes `iters_per_step` x the model's step time / `compress` of wall time (meshsched.perf: the model,
the GPU type, the placement, meshd's micro-batch x accumulation from MESH_MICRO_BATCH / MESH_ACCUM_STEPS),
times the interference ratio xi while another job trains on one of its GPUs. Progress is wall time divided
by that step time, accumulated continuously (a late wake-up is progress, not lost time; a step's surplus
carries into the next), so the job's timeline is the simulator's rate model. Loading takes the model's load
time / compress (process start-up counts toward it); a checkpoint-and-exit from meshd stops training at
once, takes the pause time / compress, saves the step and the fraction of the step done, and exits 75; the
next run resumes from there. The job uses meshsched.job for all of it (reports, directives, checkpoints).

Interference without a simulation branch in meshd: the fake GPUs are a directory (--gpu-dir or
MESH_FAKE_GPU_DIR) with one sub-directory per GPU in which every rank that trains registers itself (job,
model, micro-batch, pid). Rank 0 reads its GPUs' occupants there every --poll seconds and applies the worst xi
of `meshsched.perf.load_interference()` (measured pair, else the XGBoost prediction, else the default), as
the simulator does. The partner is whoever actually trains on the GPU right now, not whom meshd believes is
there: the emulated GPU, like a real one, needs no word from the scheduler. Ranks > 0 register their GPU and
wait for rank 0, then leave with code 0 (rank 0's code is the job's).

Each process appends two lines (start, stop) to a JSON-lines record file (--records or MESH_FAKE_RECORDS,
default <job dir>/fake-records.jsonl): job, rank, pid, restart, GPU, start / training-start / stop times,
steps, exit code, so that two runs of one job at once can be detected.
"""

from __future__ import annotations

import signal
import sys

# A SIGTERM during start-up (a preemption before the session exists) still leaves through main's `finally`.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import select  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from meshsched import job  # noqa: E402
from meshsched.job.checkpoint import State  # noqa: E402
from meshsched.loaders.profiles import load_perf_model  # noqa: E402

DEFAULT_XI = 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    e = os.environ
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="profiled model family (e.g. resnet50)")
    p.add_argument("--batch-size", type=int, required=True, help="global batch per step (split across ranks)")
    p.add_argument("--iterations", type=int, required=True, help="steps in total")
    p.add_argument("--gpu-type", default=e.get("MESH_FAKE_GPU_TYPE", "v100"), help="GPU type of the fake GPUs")
    p.add_argument("--compress", type=float, default=float(e.get("MESH_FAKE_COMPRESS", "1")),
                   help="time-compression factor C: every time is divided by it (default 1)")
    p.add_argument("--iters-per-step", type=float, default=float(e.get("MESH_FAKE_ITERS_PER_STEP", "1")),
                   help="model iterations one step stands for (default 1)")
    p.add_argument("--gpu-dir", default=e.get("MESH_FAKE_GPU_DIR", ""),
                   help="the fake GPUs' registry directory (empty: no interference)")
    p.add_argument("--records", default=e.get("MESH_FAKE_RECORDS", ""), help="JSON-lines file of per-process records")
    p.add_argument("--poll", type=float, default=0.02, help="seconds between looks at the GPUs' occupants")
    args = p.parse_args(argv)
    if args.compress <= 0 or args.iters_per_step <= 0 or args.poll <= 0 or args.iterations < 1 or args.batch_size < 1:
        p.error("--compress, --iters-per-step, --poll, --iterations and --batch-size must be positive")
    return args


def process_start() -> float:
    """This process's start (epoch seconds), from /proc: start-up before main() counts as loading."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rfind(")") + 2:].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


class Records:
    """Appends one JSON line per call (a single O_APPEND write: lines of concurrent processes never mix)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, **fields) -> None:
        if not self.path:
            return
        line = (json.dumps(fields, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


class Registry:
    """The fake GPUs' occupants: DIR/gpu<N>/<job>.<rank>.<pid> holding {"job", "model", "micro_batch"}."""

    def __init__(self, root: str) -> None:
        self.root = Path(root) if root else None
        self._mine: Path | None = None
        self._cache: dict[str, dict] = {}  # entry name -> its content (an entry never changes)

    def register(self, gpu: str, entry: dict, rank: int) -> None:
        if self.root is None:
            return
        d = self.root / f"gpu{gpu}"
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{entry['job']}.{rank}.{os.getpid()}"
        tmp = d / f".{path.name}.tmp"
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, path)
        self._mine = path

    def leave(self) -> None:
        if self._mine is not None:
            self._mine.unlink(missing_ok=True)
            self._mine = None

    def partners(self, job_id: str) -> tuple[frozenset[str], dict[str, dict]]:
        """(my GPUs, {partner job: its entry}) for the jobs training on any GPU that `job_id` trains on."""
        if self.root is None:
            return frozenset(), {}
        try:
            gpus = os.listdir(self.root)
        except FileNotFoundError:
            return frozenset(), {}
        mine, found = set(), {}
        for g in gpus:
            try:
                names = os.listdir(self.root / g)
            except OSError:
                continue
            jobs = {}
            for name in names:
                if name.startswith("."):
                    continue
                jobs.setdefault(name.split(".", 1)[0], name)
            if job_id in jobs:
                mine.add(g)
                for other, name in jobs.items():
                    if other != job_id:
                        found[other] = (g, name)
        out = {}
        for other, (g, name) in found.items():
            entry = self._cache.get(name)
            if entry is None:
                try:
                    entry = self._cache[name] = json.loads((self.root / g / name).read_text())
                except (OSError, ValueError):
                    continue
            if _alive(int(name.rsplit(".", 1)[1])):
                out[other] = entry
        return frozenset(mine), out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Progress(State):
    """The fraction of the current step done when the job checkpointed (JSON: no torch needed)."""

    def __init__(self) -> None:
        super().__init__("fake_progress")
        self.fraction = 0.0

    def state_dict(self) -> dict:
        return {"fraction": self.fraction}

    def load_state_dict(self, state: dict) -> None:
        self.fraction = float(state["fraction"])

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.state_dict()))

    def load(self, path: Path) -> None:
        self.load_state_dict(json.loads(path.read_text()))


class Interference:
    """xi of this job next to its partners, from meshsched.perf (loaded on first need: it imports XGBoost)."""

    def __init__(self, model: str, gpu_type: str) -> None:
        self.model, self.gpu_type = model, gpu_type
        self._model = None

    def worst(self, micro: int, partners: dict[str, dict]) -> float:
        if not partners:
            return 1.0
        if self._model is None:
            from meshsched.loaders.profiles import load_interference

            self._model = load_interference()
        worst = 1.0
        for p in partners.values():
            x = self._model.xi(self.model, micro, p["model"], int(p["micro_batch"]), self.gpu_type)
            worst = max(worst, x[0] if x is not None else DEFAULT_XI)
        return worst


def follow(args: argparse.Namespace, env: job.MeshEnv, registry: Registry, records: Records, started: float) -> int:
    """Rank > 0: hold its GPU in the registry while rank 0 trains; leave with 0 when rank 0 has exited."""
    rank0 = _rank0_pid()
    perf = load_perf_model()
    time.sleep(max(0.0, perf.load_time(args.model) / args.compress - (time.time() - started)))
    micro = env.micro_batch or max(1, args.batch_size // env.world_size)
    registry.register(os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
                      {"job": env.job_id or "standalone", "model": args.model, "micro_batch": micro}, env.rank)
    try:
        if rank0 is not None:
            try:
                fd = os.pidfd_open(rank0)
            except ProcessLookupError:
                fd = None
            if fd is not None:
                select.select([fd], [], [])
                os.close(fd)
    finally:
        registry.leave()
        records.write(event="stop", job=env.job_id, rank=env.rank, pid=os.getpid(), restart=env.restart_count,
                      start=started, stop=time.time(), code=0, reason="rank 0 exited")
    return 0


def _rank0_pid() -> int | None:
    """Rank 0 is the sibling (a child of the same supervisor) whose environment says RANK=0."""
    ppid = os.getppid()
    try:
        children = Path(f"/proc/{ppid}/task/{ppid}/children").read_text().split()
    except OSError:
        return None
    for pid in children:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"RANK=0" in environ:
            return int(pid)
    return None


def train(args: argparse.Namespace, env: job.MeshEnv, registry: Registry, records: Records, started: float) -> int:
    perf = load_perf_model()
    progress = Progress()
    sess = job.attach(checkpoint_every=0, rng=False)
    sess.add(progress)
    first = sess.resume()
    scale = args.iters_per_step / args.compress
    placement = (env.world_size,)  # one node: meshd's fake GPUs
    per_gpu = (env.micro_batch * env.accum_steps) if env.micro_batch and env.accum_steps else \
        max(1, args.batch_size // env.world_size)

    def solo_step() -> tuple[float, int]:
        accum = max(1, min(sess.accum_steps, per_gpu))
        t = perf.iteration_time(args.model, args.gpu_type, placement, per_gpu, accum)
        return t * scale, per_gpu // accum

    time.sleep(max(0.0, perf.load_time(args.model) / args.compress - (time.time() - started)))
    step_time, micro = solo_step()
    job_id = env.job_id or "standalone"
    registry.register(os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
                      {"job": job_id, "model": args.model, "micro_batch": micro}, env.rank)
    inter = Interference(args.model, args.gpu_type)
    train_start = time.time()
    xi, seen = 1.0, None
    left = step_time * (1.0 - progress.fraction)  # solo seconds of work left in the current step
    last = time.monotonic()
    code, reason = 0, "completed"
    while sess.step < args.iterations:
        now = time.monotonic()
        left -= (now - last) / xi  # wall time since the last look was training at the rate then in force
        last = now
        if sess.exit_requested:  # checkpoint-and-exit (meshd) or SIGTERM: stop training now
            registry.leave()
            progress.fraction = min(1.0, max(0.0, 1.0 - left / step_time))
            time.sleep(perf.pause_time(args.model) / args.compress)
            sess.save()
            code, reason = job.PREEMPTED_EXIT_CODE, sess.exit_reason or "checkpoint-and-exit"
            break
        if left <= 0.0:
            carry = -left
            progress.fraction = 0.0
            if sess.end_step(samples=args.batch_size // env.world_size):
                registry.leave()
                time.sleep(perf.pause_time(args.model) / args.compress)  # end_step saved the checkpoint
                code, reason = job.PREEMPTED_EXIT_CODE, sess.exit_reason
                break
            new_step, new_micro = solo_step()  # a calibration may have changed the accumulation
            if new_micro != micro:
                registry.leave()
                micro = new_micro
                registry.register(os.environ.get("CUDA_VISIBLE_DEVICES", "0"),
                                  {"job": job_id, "model": args.model, "micro_batch": micro}, env.rank)
                seen = None
            step_time = new_step
            left = step_time - carry
            continue
        gpus, partners = registry.partners(job_id)
        key = (gpus, frozenset(partners))
        if key != seen:
            seen = key
            xi = inter.worst(micro, partners)
            now = time.monotonic()
            left -= (now - last) / xi  # loading the interference model: already at the new rate
            last = now
            continue
        time.sleep(max(0.0, min(left * xi, args.poll)))
    registry.leave()
    records.write(event="stop", job=job_id, rank=env.rank, pid=os.getpid(), restart=env.restart_count,
                  start=started, train_start=train_start, stop=time.time(), step_from=first, step_to=sess.step,
                  fraction=progress.fraction if code else 0.0, code=code, reason=reason)
    if code:
        sess.exit()  # flushes the reports (and the checkpoint notice), exits 75
    sess.close()
    return 0


def main() -> None:
    args = parse_args()
    started = process_start()
    env = job.MeshEnv.read()
    path = args.records or (str(Path(env.checkpoint_dir).parent / "fake-records.jsonl") if env.checkpoint_dir else "")
    records = Records(path)
    records.write(event="start", job=env.job_id, rank=env.rank, pid=os.getpid(), restart=env.restart_count,
                  gpu=os.environ.get("CUDA_VISIBLE_DEVICES"), start=started, model=args.model,
                  micro_batch=env.micro_batch, accum_steps=env.accum_steps)
    registry = Registry(args.gpu_dir)
    try:
        run = train if env.rank == 0 else follow
        sys.exit(run(args, env, registry, records, started))
    except SystemExit as exc:
        if exc.code not in (0, None, job.PREEMPTED_EXIT_CODE):  # stopped by a signal before it could say so
            records.write(event="stop", job=env.job_id or "standalone", rank=env.rank, pid=os.getpid(),
                          restart=env.restart_count, start=started, stop=time.time(), code=exc.code, reason="signal")
        raise
    finally:
        registry.leave()


if __name__ == "__main__":
    main()
