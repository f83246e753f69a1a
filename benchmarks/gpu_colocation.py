"""GPU-only measurements behind two modelled quantities of the simulator: training memory and colocation xi.

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_colocation.py --out results/gpu [--quick]
        [--parts memory,accum,coloc] [--modes timeslice,mps,mps50]

Needs a CUDA GPU and plain PyTorch (the models are written out in benchmarks/gpu_models.py; torchvision is not used). All
inputs are synthetic tensors already on the GPU (no data loading), fp32, cudnn.benchmark on, PyTorch's
default TF32 settings (recorded in the JSON). Writes one JSON per part into --out.

1. memory (memory.json): per model family and micro-batch b (powers of two), torch.cuda.max_memory_allocated
   and max_memory_reserved over a few full training steps (forward, backward, optimizer step with the
   optimizer of meshsched/perf/assumptions.py CHECKPOINTS), a least-squares fit peak = static + per_sample*b,
   and meshsched/perf/memory.py's assumed values beside them. Also the CUDA context size (device memory in
   use after the first CUDA call of a fresh process, from cudaMemGetInfo).
   Models: cifar10/resnet18 (CIFAR ResNet-18, 32x32), imagenet/resnet50 (ResNet-50, 224x224), lm (2-layer
   LSTM 200/200, vocab 33,278, bptt 35), transformer (base, d=512, 6+6 layers, 30 tokens, vocabs 7,853/5,893
   as Multi30k de-en), recommendation (VAE-CF 20,108-600-200).
2. accum (accum.json): Castor Algorithm 2's cost: for resnet18 (B=256) and transformer (B=128) one global step
   of per-GPU batch B done as micro-batch b x B/b accumulation steps, b = B, B/2, ...: time per global step
   and peak memory.
3. coloc (coloc_<mode>.json): interference xi = step_time(shared) / step_time(alone) on one GPU for pairs of
   (model, batch) from the Gavel colocation tables. Two long-lived worker processes each build their job,
   warm up, then run steps back to back; steps that complete inside a common time window are timed (each
   step ends with torch.cuda.synchronize). Modes: 'timeslice' (the driver's default time slicing), 'mps' (an
   MPS daemon started here, clients at 100% threads), 'mps50' (MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
   per client). Under MPS the alone times are measured under MPS too; xi is given against both the plain
   exclusive alone time and the alone time in the same mode.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

MIB = 1024 * 1024

# (family name used in memory.py, builder key, optimizer, micro-batches full, micro-batches quick)
MEMORY_SWEEP = {
    "resnet18": ([16, 32, 64, 128, 256, 512, 1024], [16, 32, 64]),
    "resnet50": ([8, 16, 32, 64, 128, 256], [4, 8, 16]),
    "lm": ([5, 10, 20, 40, 80, 160, 320], [5, 10, 20]),
    "transformer": ([16, 32, 64, 128, 256, 512], [8, 16, 32]),
    "recommendation": ([256, 512, 1024, 2048, 4096, 8192, 16384], [64, 128, 256]),
}
ALIASES = {"resnet18": "cifar10", "resnet50": "imagenet"}  # memory.py lists both names with the same values

PAIRS = [
    (("resnet18", 128), ("lm", 20)),
    (("resnet50", 32), ("transformer", 64)),
    (("resnet18", 128), ("resnet18", 128)),
    (("resnet50", 64), ("resnet50", 64)),
    (("lm", 20), ("transformer", 64)),
    (("recommendation", 1024), ("resnet18", 128)),
]
PAIRS_QUICK = [(("resnet18", 32), ("lm", 10)), (("resnet18", 32), ("resnet18", 32))]

ACCUM = {"resnet18": 256, "transformer": 128}
ACCUM_QUICK = {"resnet18": 32, "transformer": 16}



def _build(model: str, batch: int, device):
    """(module, optimizer, step(accumulation), parameter count, optimizer name): see gpu_models.build."""
    from gpu_models import build  # imports torch: only after main() has checked that it is there

    return build(model, batch, device)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


# -- 1. memory --------------------------------------------------------------------------------------------


def _fit(bs: list[int], ys: list[float]) -> tuple[float, float]:
    n = len(bs)
    mb, my = sum(bs) / n, sum(ys) / n
    sxx = sum((b - mb) ** 2 for b in bs)
    slope = sum((b - mb) * (y - my) for b, y in zip(bs, ys)) / sxx if sxx else 0.0
    return my - slope * mb, slope


def _assumed(model: str) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    try:
        from meshsched.perf import memory as mem
        from meshsched.perf.assumptions import CHECKPOINTS
    except Exception as e:  # noqa: BLE001 - the script also runs outside the repo
        return {"error": repr(e)}
    fam = ALIASES.get(model, model)
    ck = {c.model: c for c in CHECKPOINTS}.get(model)
    return {
        "family": fam,
        "context_mb": mem.CONTEXT_MB,
        "static_mb": mem._STATIC.get(model),  # noqa: SLF001
        "per_sample_mb": mem.ACTIVATION_MB_PER_SAMPLE.get(model),
        "params_millions": ck.params_millions if ck else None,
        "optimizer": ck.optimizer if ck else None,
    }


def _oom_types():
    import torch

    return (torch.cuda.OutOfMemoryError, RuntimeError)


def run_memory(device, quick: bool) -> dict:
    import torch

    out: dict = {"models": {}}
    for model, (full, small) in MEMORY_SWEEP.items():
        rows = []
        for b in small if quick else full:
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base_alloc = torch.cuda.memory_allocated()
            try:
                net, opt, step, n_params, opt_name = _build(model, b, device)
                for _ in range(3):
                    step()
                _sync(device)
                row = {"batch": b}
                if device.type == "cuda":
                    row["peak_allocated_mb"] = (torch.cuda.max_memory_allocated() - base_alloc) / MIB
                    row["peak_reserved_mb"] = torch.cuda.max_memory_reserved() / MIB
                    row["steady_allocated_mb"] = (torch.cuda.memory_allocated() - base_alloc) / MIB
                    # peak of later steps alone: without cudnn.benchmark's algorithm search in the first step
                    torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                n = 2 if quick else 5
                for _ in range(n):
                    step()
                _sync(device)
                row["step_s"] = (time.perf_counter() - t0) / n
                if device.type == "cuda":
                    row["steady_peak_allocated_mb"] = (torch.cuda.max_memory_allocated() - base_alloc) / MIB
                row["params"] = n_params
                row["optimizer"] = opt_name
                del net, opt, step
            except _oom_types() as e:  # noqa: PERF203
                row = {"batch": b, "error": str(e).splitlines()[0][:200]}
            rows.append(row)
            print(f"memory {model} b={b}: {row}", flush=True)
        ok = [r for r in rows if "steady_peak_allocated_mb" in r]
        fit = {}
        if len(ok) >= 2:
            for key in ("peak_allocated_mb", "peak_reserved_mb", "steady_peak_allocated_mb"):
                # fit on the larger half too: small b are dominated by workspaces and allocator rounding
                s_all, k_all = _fit([r["batch"] for r in ok], [r[key] for r in ok])
                big = ok[len(ok) // 2 :] if len(ok) >= 4 else ok
                s_big, k_big = _fit([r["batch"] for r in big], [r[key] for r in big])
                fit[key] = {"static_mb": s_all, "per_sample_mb": k_all, "static_mb_large_b": s_big, "per_sample_mb_large_b": k_big}
        n_params = next((r["params"] for r in rows if "params" in r), None)
        from gpu_models import CHECKPOINT

        copies = CHECKPOINT[model].state_copies
        out["models"][model] = {
            "rows": rows,
            "fit": fit,
            "params": n_params,
            "weights_grads_state_mb": n_params * 4 * (2 + copies) / MIB if n_params else None,
            "assumed": _assumed(model),
        }
    return out


def cuda_context_mb() -> dict:
    """Device memory a fresh process holds after its first CUDA call, and after a cuBLAS + cuDNN call."""
    code = (
        "import torch,json;torch.cuda.init();f0,t=torch.cuda.mem_get_info();x=torch.zeros(1,device='cuda');"
        "f1,_=torch.cuda.mem_get_info();a=torch.randn(256,256,device='cuda');(a@a).sum().item();"
        "c=torch.nn.Conv2d(3,8,3).cuda();c(torch.randn(1,3,8,8,device='cuda')).sum().backward();torch.cuda.synchronize();"
        "f2,_=torch.cuda.mem_get_info();print(json.dumps({'total_mb':t/2**20,'used_before_context_mb':(t-f0)/2**20,"
        "'after_first_tensor_mb':(t-f1)/2**20,'after_cublas_cudnn_mb':(t-f2)/2**20}))"
    )
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
        return json.loads(r.stdout.strip().splitlines()[-1])
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)}


# -- 2. accumulation --------------------------------------------------------------------------------------


def run_accum(device, quick: bool) -> dict:
    import torch

    out = {}
    for model, B in (ACCUM_QUICK if quick else ACCUM).items():
        rows = []
        b = B
        while b >= (4 if quick else 8):
            accum = B // b
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            net, opt, step, _, _ = _build(model, b, device)
            for _ in range(3):
                step(accum)
            _sync(device)
            n = 2 if quick else max(5, min(40, 40 // accum))
            t0 = time.perf_counter()
            for _ in range(n):
                step(accum)
            _sync(device)
            row = {"micro_batch": b, "accum": accum, "global_step_s": (time.perf_counter() - t0) / n, "steps_timed": n}
            if device.type == "cuda":
                row["peak_allocated_mb"] = (torch.cuda.max_memory_allocated() - base) / MIB
                row["peak_reserved_mb"] = torch.cuda.max_memory_reserved() / MIB
            del net, opt, step
            rows.append(row)
            print(f"accum {model} B={B}: {row}", flush=True)
            b //= 2
        t_full = rows[0]["global_step_s"]
        for r in rows:
            r["slowdown_vs_b_eq_B"] = r["global_step_s"] / t_full
        out[model] = {"global_batch": B, "rows": rows}
    return out


# -- 3. colocation ----------------------------------------------------------------------------------------


def _worker(conn, device_name: str) -> None:
    """Long-lived job process: 'prepare' (build + warm up), 'go' (time steps in a window), 'free', 'exit'."""
    import torch

    device = torch.device(device_name)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.zeros(1, device=device)
    conn.send({"ok": True, "pid": os.getpid()})
    state = None
    while True:
        msg = conn.recv()
        op = msg["op"]
        try:
            if op == "exit":
                conn.send({"ok": True})
                return
            if op == "free":
                state = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                conn.send({"ok": True})
            elif op == "prepare":
                state = None
                net, opt, step, _, _ = _build(msg["model"], msg["batch"], device)
                t_end = time.monotonic() + msg["warmup_s"]
                n = 0
                while n < msg["warmup_steps"] or time.monotonic() < t_end:
                    step()
                    _sync(device)
                    n += 1
                state = (net, opt, step)
                conn.send({"ok": True, "warmup_steps": n})
            elif op == "go":
                step = state[2]
                start, stop, tail = msg["start_at"], msg["start_at"] + msg["window_s"], msg["tail_s"]
                while time.monotonic() < start:  # keep the GPU as busy as in the window until it opens
                    step()
                    _sync(device)
                ends = [time.monotonic()]
                while ends[-1] < stop + tail or len(ends) < 3:
                    step()
                    _sync(device)
                    ends.append(time.monotonic())
                d = [b - a for a, b in zip(ends, ends[1:]) if a >= start and b <= stop]
                if not d:  # a step longer than the window: take the steps timed after it opened
                    d = [b - a for a, b in zip(ends, ends[1:])]
                d_sorted = sorted(d)
                conn.send(
                    {
                        "ok": True,
                        "steps": len(d),
                        "mean_step_s": sum(d) / len(d),
                        "median_step_s": d_sorted[len(d) // 2],
                        "min_step_s": d_sorted[0],
                        "max_step_s": d_sorted[-1],
                    }
                )
        except Exception as e:  # noqa: BLE001 - reported to the parent
            state = None
            conn.send({"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})


class _Pool:
    def __init__(self, device_name: str, env: dict | None):
        ctx = mp.get_context("spawn")
        saved = dict(os.environ)
        if env:
            os.environ.update(env)
        try:
            self.conns, self.procs = [], []
            for _ in range(2):
                a, b = ctx.Pipe()
                p = ctx.Process(target=_worker, args=(b, device_name), daemon=True)
                p.start()
                self.conns.append(a)
                self.procs.append(p)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        for c in self.conns:
            self._recv(c, 180)

    @staticmethod
    def _recv(conn, timeout: float) -> dict:
        if not conn.poll(timeout):
            raise TimeoutError("worker did not answer")
        r = conn.recv()
        if not r.get("ok"):
            raise RuntimeError(r.get("error"))
        return r

    def run(self, jobs: list[tuple[str, int]], window_s: float, warmup_s: float) -> list[dict]:
        conns = self.conns[: len(jobs)]
        for c, (m, b) in zip(conns, jobs):
            c.send({"op": "prepare", "model": m, "batch": b, "warmup_s": warmup_s, "warmup_steps": 5})
        try:
            for c in conns:
                self._recv(c, 300)
            start = time.monotonic() + 0.5
            for c in conns:
                c.send({"op": "go", "start_at": start, "window_s": window_s, "tail_s": 0.5})
            res = [self._recv(c, window_s + 300) for c in conns]
        finally:
            for c in conns:
                c.send({"op": "free"})
            for c in conns:
                try:
                    self._recv(c, 60)
                except Exception:  # noqa: BLE001, S110
                    pass
        return res

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send({"op": "exit"})
                c.poll(10)
            except Exception:  # noqa: BLE001, S110
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.terminate()


def _mps_start(tmp: Path) -> tuple[dict | None, str]:
    exe = shutil.which("nvidia-cuda-mps-control")
    if not exe:
        return None, "nvidia-cuda-mps-control not found"
    pipe, log = tmp / "mps_pipe", tmp / "mps_log"
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}
    r = subprocess.run([exe, "-d"], env={**os.environ, **env}, capture_output=True, text=True, timeout=30, check=False)
    if r.returncode != 0:
        return None, f"mps -d rc={r.returncode}: {r.stdout} {r.stderr}"
    time.sleep(1.0)
    return env, "started"


def _mps_stop(env: dict) -> str:
    exe = shutil.which("nvidia-cuda-mps-control")
    r = subprocess.run([exe], input="quit\n", env={**os.environ, **env}, capture_output=True, text=True, timeout=30, check=False)
    time.sleep(1.0)
    log = Path(env["CUDA_MPS_LOG_DIRECTORY"]) / "control.log"
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    return f"quit rc={r.returncode}; control.log tail: {tail}"


def run_coloc(device_name: str, mode: str, quick: bool, alone_ref: dict | None) -> dict:
    pairs = PAIRS_QUICK if quick else PAIRS
    window, warm = (2.0, 1.0) if quick else (6.0, 2.0)
    out: dict = {"mode": mode, "window_s": window, "warmup_s": warm, "alone": {}, "pairs": []}
    env, mps_env = None, None
    if mode in ("mps", "mps50"):
        tmp = Path("/tmp") / f"meshsched_mps_{os.getpid()}_{mode}"
        mps_env, msg = _mps_start(tmp)
        out["mps"] = msg
        if mps_env is None:
            out["error"] = msg
            return out
        env = dict(mps_env)
        if mode == "mps50":
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = "50"
    try:
        pool = _Pool(device_name, env)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"workers failed to start: {e!r}"
        if mps_env:
            out["mps_stop"] = _mps_stop(mps_env)
        return out
    try:
        configs = sorted({j for p in pairs for j in p})
        for m, b in configs:
            try:
                r = pool.run([(m, b)], window, warm)[0]
            except Exception as e:  # noqa: BLE001
                r = {"error": repr(e)}
            out["alone"][f"{m}:{b}"] = r
            print(f"coloc[{mode}] alone {m} b={b}: {r}", flush=True)
        for (ma, ba), (mb, bb) in pairs:
            row: dict = {"a": [ma, ba], "b": [mb, bb]}
            try:
                ra, rb = pool.run([(ma, ba), (mb, bb)], window, warm)
                row["shared_a"], row["shared_b"] = ra, rb
                for side, (m, b), r in (("a", (ma, ba), ra), ("b", (mb, bb), rb)):
                    al = out["alone"].get(f"{m}:{b}", {})
                    if "mean_step_s" in al:
                        row[f"xi_{side}_vs_alone_same_mode"] = r["mean_step_s"] / al["mean_step_s"]
                    ref = (alone_ref or {}).get(f"{m}:{b}", {})
                    if "mean_step_s" in ref:
                        row[f"xi_{side}_vs_exclusive"] = r["mean_step_s"] / ref["mean_step_s"]
            except Exception as e:  # noqa: BLE001
                row["error"] = repr(e)
            out["pairs"].append(row)
            print(f"coloc[{mode}] pair {row}", flush=True)
    finally:
        pool.close()
        if mps_env:
            out["mps_stop"] = _mps_stop(mps_env)
    return out


# -- main -------------------------------------------------------------------------------------------------


def env_info(device) -> dict:
    import torch

    info = {
        "date": _dt.date.today().isoformat(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": sys.version.split()[0],
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "cudnn_benchmark": True,
        "mps_control_binary": shutil.which("nvidia-cuda-mps-control"),
    }
    if device.type == "cuda":  # in a child process, so that this one holds no CUDA context (MPS runs)
        code = (
            "import torch,json;p=torch.cuda.get_device_properties(0);print(json.dumps({'device_name':"
            "torch.cuda.get_device_name(0),'total_memory_mb':p.total_memory/2**20,'sm_count':p.multi_processor_count}))"
        )
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
            info.update(json.loads(r.stdout.strip().splitlines()[-1]))
        except Exception as e:  # noqa: BLE001
            info["device_error"] = repr(e)
        try:
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_mode", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=30, check=False,
            ).stdout.strip()
        except Exception as e:  # noqa: BLE001
            info["nvidia_smi"] = repr(e)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for the JSON results")
    ap.add_argument("--quick", action="store_true", help="small batches and short windows (a smoke run)")
    ap.add_argument("--parts", default="memory,accum,coloc", help="comma list of memory, accum, coloc")
    ap.add_argument("--modes", default="timeslice,mps,mps50", help="colocation modes: timeslice, mps, mps50")
    ap.add_argument("--json", action="store_true",
                    help="progress to stderr, then every result written (file name -> its JSON) as one object on stdout")
    ap.add_argument("--allow-cpu", action="store_true", help=argparse.SUPPRESS)  # logic test without a GPU
    a = ap.parse_args(argv)
    if not a.json:
        return _run(a, {})
    written: dict[str, dict] = {}
    with contextlib.redirect_stdout(sys.stderr):
        rc = _run(a, written)
    if rc == 0:
        print(json.dumps(written, sort_keys=True))
    return rc


def _run(a: argparse.Namespace, written: dict[str, dict]) -> int:
    try:
        import torch
    except ImportError:
        print("gpu_colocation: PyTorch is not installed; this benchmark needs torch with CUDA.", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() and not a.allow_cpu:
        print("gpu_colocation: no CUDA GPU is available here (torch.cuda.is_available() is False); "
              "run it on a machine with an NVIDIA GPU.", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True
    a.out.mkdir(parents=True, exist_ok=True)
    parts = a.parts.split(",")
    info = env_info(device)
    print(json.dumps(info), flush=True)

    def dump(name: str, body: dict) -> None:
        written[name] = {"env": info, "quick": a.quick, **body}
        (a.out / name).write_text(json.dumps(written[name], indent=1, sort_keys=True))

    t0 = time.time()
    if "memory" in parts:
        body = run_memory(device, a.quick)
        if device.type == "cuda":
            body["cuda_context"] = cuda_context_mb()
        dump("memory.json", body)
        print(f"memory done {time.time() - t0:.0f}s", flush=True)
    if "accum" in parts:
        dump("accum.json", run_accum(device, a.quick))
        print(f"accum done {time.time() - t0:.0f}s", flush=True)
    if "coloc" in parts:
        if device.type == "cuda":  # release this process's cached blocks before the workers start
            torch.cuda.empty_cache()
        ref = None
        prev = a.out / "coloc_timeslice.json"
        for mode in a.modes.split(","):
            if mode != "timeslice" and device.type != "cuda":
                continue
            if ref is None and prev.exists():
                ref = json.loads(prev.read_text()).get("alone")
            res = run_coloc(device.type, mode, a.quick, ref if mode != "timeslice" else None)
            res["parent_had_cuda_context"] = bool(device.type == "cuda" and torch.cuda.is_initialized())
            if mode == "timeslice":
                ref = res["alone"]
            dump(f"coloc_{mode}.json", res)
            print(f"coloc {mode} done {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
