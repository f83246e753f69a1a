"""Readers that convert the raw throughput data in shared/data/throughputs/ into typed measurements.

Gavel (gavel/simulation_throughputs.json, steps/s):
  * a job type "ResNet-18 (batch size 64)" = model family + per-GPU batch; A3C and CycleGAN have one fixed
    batch, recorded as batch 1 (CycleGAN: Gavel's cyclegan.py default --batch_size 1; A3C: one "unit" =
    one synchronous update of its 4 hogwild workers' 20-step rollouts).
  * scale factor sf > 1: the value is aggregate worker steps/s, so the global step takes sf / throughput
    seconds with the per-GPU batch fixed (K80 efficiencies then fall in 0.4..1.0). Consolidated = all sf
    GPUs on one node, placement (sf,); "*_unconsolidated" = spread across servers, recorded as (1,)*sf
    (the comm model depends only on GPU count and whether nodes > 1, so the exact split does not matter).
  * throughput 0 = not measured / infeasible: dropped. Multi-GPU points faster per global step than one
    GPU by more than SUPERLINEAR_TOLERANCE are physically impossible for data parallelism and marked
    excluded (they are kept in measurements_<gpu>.json, flagged, and left out of the fit).
  * colocation pairs at scale factor 1: xi = isolated / colocated throughput; [0, 0] -> None.
Pollux (pollux/<model>/placements.csv + scalability.csv, AWS g4dn.12xlarge, NVIDIA T4):
  * placement digits = GPUs on each node, local_bsz = per-GPU batch, step_time = seconds per step.
  * scalability rows give only (num_nodes, num_replicas): spread evenly over the nodes (inferred).
"""

from __future__ import annotations

import ast
import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

from meshsched.perf.placement import even_placement

GAVEL_GPU_TYPES = ("k80", "p100", "v100")
GAVEL_FAMILIES = {
    "ResNet-18": "resnet18",
    "ResNet-50": "resnet50",
    "Transformer": "transformer",
    "LM": "lm",
    "Recommendation": "recommendation",
    "A3C": "a3c",
    "CycleGAN": "cyclegan",
}
POLLUX_GPU_TYPE = "t4"
POLLUX_MODELS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
SUPERLINEAR_TOLERANCE = 1.10  # global-step rate may exceed the single-GPU rate by at most 10 % (noise)
GAVEL_FILE = Path("throughputs/gavel/simulation_throughputs.json")
POLLUX_DIR = Path("throughputs/pollux")

_BATCH_RE = re.compile(r"^(?P<family>.+?) \(batch size (?P<batch>\d+)\)$")


@dataclass(frozen=True, slots=True)
class Measurement:
    model: str
    gpu_type: str
    placement: tuple[int, ...]
    per_gpu_batch: int
    iter_time: float  # seconds per optimizer step
    excluded: bool = False  # True: kept for the record, left out of the fit (see module docstring)

    @property
    def gpus(self) -> int:
        return sum(self.placement)


@dataclass(frozen=True, slots=True)
class MeasuredPair:
    gpu_type: str
    model_a: str
    batch_a: int
    model_b: str
    batch_b: int
    xi: tuple[float, float] | None


def gavel_job(job_type: str) -> tuple[str, int]:
    """'ResNet-18 (batch size 64)' -> ('resnet18', 64); 'A3C' -> ('a3c', 1)."""
    m = _BATCH_RE.match(job_type)
    family, batch = (m["family"], int(m["batch"])) if m else (job_type, 1)
    return GAVEL_FAMILIES[family], batch


def _gavel_key(key: str) -> tuple[str, int]:
    job_type, sf = ast.literal_eval(key)
    return str(job_type), int(sf)


def read_gavel(data_dir: Path) -> tuple[list[Measurement], list[MeasuredPair]]:
    raw = json.loads((data_dir / GAVEL_FILE).read_text(encoding="utf-8"))
    measurements: list[Measurement] = []
    pairs: list[MeasuredPair] = []
    for gpu in GAVEL_GPU_TYPES:
        single: dict[tuple[str, int], float] = {}
        for spread, worker_type in ((False, gpu), (True, f"{gpu}_unconsolidated")):
            for key, entry in raw[worker_type].items():
                job_type, sf = _gavel_key(key)
                model, batch = gavel_job(job_type)
                tput = float(entry["null"])
                if tput <= 0.0 or (spread and sf == 1):  # sf=1 unconsolidated duplicates consolidated
                    continue
                t = sf / tput
                if sf == 1:
                    single[(model, batch)] = t
                placement = (1,) * sf if spread else (sf,)
                measurements.append(Measurement(model, gpu, placement, batch, t))
        # flag super-linear multi-GPU points against the single-GPU time of the same job
        for i, m in enumerate(measurements):
            if m.gpu_type == gpu and m.gpus > 1:
                t1 = single.get((m.model, m.per_gpu_batch))
                if t1 is not None and m.iter_time * SUPERLINEAR_TOLERANCE < t1:
                    measurements[i] = Measurement(m.model, gpu, m.placement, m.per_gpu_batch, m.iter_time, True)
        for key, entry in raw[gpu].items():
            job_type, sf = _gavel_key(key)
            if sf != 1:
                continue
            model_a, batch_a = gavel_job(job_type)
            iso_a = float(entry["null"])
            for other, value in entry.items():
                if other == "null":
                    continue
                other_type, other_sf = _gavel_key(other)
                if other_sf != 1:
                    continue
                model_b, batch_b = gavel_job(other_type)
                iso_b = float(raw[gpu][other]["null"])
                t_a, t_b = float(value[0]), float(value[1])
                ok = t_a > 0.0 and t_b > 0.0 and iso_a > 0.0 and iso_b > 0.0
                xi = (iso_a / t_a, iso_b / t_b) if ok else None
                pairs.append(MeasuredPair(gpu, model_a, batch_a, model_b, batch_b, xi))
    return measurements, pairs


def read_pollux(data_dir: Path) -> list[Measurement]:
    out: list[Measurement] = []
    for model in POLLUX_MODELS:
        folder = data_dir / POLLUX_DIR / model
        with (folder / "placements.csv").open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                placement = tuple(int(c) for c in row["placement"])
                out.append(
                    Measurement(model, POLLUX_GPU_TYPE, placement, int(row["local_bsz"]), float(row["step_time"]))
                )
        with (folder / "scalability.csv").open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                placement = even_placement(int(row["num_replicas"]), int(row["num_nodes"]))
                out.append(
                    Measurement(model, POLLUX_GPU_TYPE, placement, int(row["local_bsz"]), float(row["step_time"]))
                )
    return out
