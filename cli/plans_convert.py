"""`mesh profiles plans-convert`: turn Morphling's A800 measurements (shared/data/throughputs/morphling/) into
profiles/plans_a800.json: model specs, the measured plans as typed rows, and the seven parameters per model
fitted on a seeded sample of them (the paper's protocol, Sec. 7.1). Writes files: lives outside the core.

Raw format (`placements/<model>/placements.csv`): exec_plan, placement (GPUs per node, one digit per node),
iter_time (s), forward/overlap_sync/optimize (ms for some models, s for others; `forward` is read into
PlanMeasurement.fwd_s for `benchmarks/plan_model.py --protocol artifact`, not written to the profile). exec_plan is `ga`, `gc`, `zero-dp`,
`zero-offload` or a 3-digit code PP,TP,DP (read from the artifact's validation scripts, which call their
3D model with (pp, tp, nodes, GPUs per node) for the same codes, e.g. 182 on 88 = PP1 TP8 DP2).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from meshsched.perf.plan_fit import fit_plan_params, sample_fit_rows
from meshsched.perf.plans import (
    PARAM_NAMES,
    Environment,
    ExecutionPlan,
    ModelSpec,
    PlanMeasurement,
    Resources,
    fits,
)

PROFILE_NAME = "plans_a800.json"
FIT_POINTS = 8  # per model: one per plan family, then random (seeded); the paper fits on >= 7
FIT_SEED = 0
CPUS_PER_GPU = 4  # assumption: the artifact's profiled ZeRO-Offload runs (profile/*/config.csv) used 4 CPU threads

# A800 SXM 80 GB (the paper's cluster, Sec. 7). Bandwidths are effective values; the raw data carries no
# bandwidth measurement, so the inter-node and host values were read off the measurements themselves
# (inferred, and the one place where all points, not just the fit sample, informed the model):
# * NVLink ~150 GB/s: the artifact's measured EnvParams B_nvlink for GPT-2/T5/LLaMA (145-161 GB/s).
# * one NIC 12.5 GB/s (100 Gb/s), one NIC per 2 GPUs: data-parallel BERT/GPT-2/T5 pay about 2.3x more
#   sync time when their smallest node share is 1-2 GPUs than when it is 3-4, and the cost barely grows
#   with the node count (2 to 8 nodes).
# * host link 10 GB/s per node: ZeRO-Offload's extra time over ZeRO-2 has a part that does not shrink when
#   one node's GPUs go from 1 to 8 (GPT-2: ~0.6 s, ~6 GB of copies per iteration).
ENV = Environment(nvlink_gbs=150.0, internode_gbs=12.5, pcie_gbs=10.0, gpu_memory_gb=80.0, gpus_per_nic=2)

# Model specs: parameter counts from the artifact's validation scripts (PARAMETER_SIZE) or the paper's
# Table 1; global batch = the artifact's local_bsz (sched/models/*.py); hidden/layers/sequence from the
# public architectures (ViT-B/16: 197 tokens; BERT-large, RoBERTa-large: 512; T5: the artifact's seq_hid).
SPECS: dict[str, ModelSpec] = {
    "vit": ModelSpec("vit", 86_000_000, 64, 768, 12, 197),
    "roberta": ModelSpec("roberta", 355_000_000, 64, 1024, 24, 512),
    "bert": ModelSpec("bert", 336_297_408, 32, 1024, 24, 512),
    "t5": ModelSpec("t5", 1_240_813_568, 16, 1024, 16, 1024),
    "gpt2": ModelSpec("gpt2", 1_557_686_400, 16, 1600, 48, 1024),
    "llama7": ModelSpec("llama7", 6_738_423_808, 8, 4096, 32, 2048),
    "llama30": ModelSpec("llama30", 33_170_309_120, 4, 5120, 40, 2048),
}
LARGE = frozenset({"t5", "gpt2", "llama7", "llama30"})  # >= 1B parameters: Table 2's "ZeRO-Offload+GC" rows


def _fewest_ga(spec: ModelSpec, dp: int, **kw: Any) -> ExecutionPlan:
    """The data-parallel plan with the fewest GA steps that fits in GPU memory (the raw data does not say)."""
    per_replica = spec.global_batch // dp
    for ga in (g for g in range(1, per_replica + 1) if per_replica % g == 0):
        plan = ExecutionPlan(dp=dp, ga=ga, **kw)
        if fits(spec, plan, ENV):
            return plan
    raise ValueError(f"{spec.name}: no GA steps make {kw} fit on dp{dp}")


def plan_of(model: str, label: str, gpus: int) -> ExecutionPlan:
    """The typed plan of one raw row."""
    spec = SPECS[model]
    if label.isdigit() and len(label) == 3:
        pp, tp, dp = (int(c) for c in label)
        # one micro-batch per iteration (inferred: the measured time falls as B/(d*t) and not with p, which
        # is what a pipeline without accumulation gives: p stages run the whole batch one after another)
        return ExecutionPlan(dp=dp, tp=tp, pp=pp, ga=1)
    kw: dict[str, Any] = {
        "ga": {},
        "gc": {"gc": True},
        "zero-dp": {"zero": 2},  # the paper's footnote 1: ZeRO-DP means ZeRO-2
        "zero-offload": {"zero": 2, "offload": True, "gc": model in LARGE},
    }.get(label)  # type: ignore[assignment]
    if kw is None:
        raise ValueError(f"{model}: unknown exec_plan {label!r}")
    return _fewest_ga(spec, gpus, **kw)


def read_model(data: Path, model: str) -> list[PlanMeasurement]:
    path = data / "throughputs" / "morphling" / "placements" / model / "placements.csv"
    rows = []
    with path.open(encoding="utf-8-sig") as f:
        raw = [r for r in csv.DictReader(f) if float(r["iter_time"]) > 0]  # 0 = not measured / infeasible
    # the forward column is in ms for some models and in s for others: a forward longer than its whole
    # iteration can only be ms (0: not measured)
    ratios = sorted(float(r["forward"] or 0) / float(r["iter_time"]) for r in raw if float(r["forward"] or 0) > 0)
    fwd_unit = 1e-3 if ratios and ratios[len(ratios) // 2] > 1 else 1.0
    for r in raw:
        res = Resources.parse(r["placement"], CPUS_PER_GPU)
        plan = plan_of(model, r["exec_plan"], res.gpus)
        if plan.gpus != res.gpus:
            raise ValueError(f"{model}: plan {r['exec_plan']} uses {plan.gpus} GPUs, placement {r['placement']} has {res.gpus}")
        fwd = float(r["forward"] or 0) * fwd_unit
        rows.append(PlanMeasurement(plan, res, float(r["iter_time"]), fwd_s=fwd if fwd > 0 else None))
    rows.sort(key=lambda m: (m.family, m.plan, m.resources.placement))
    return rows


def _encode(obj: Any, indent: int = 0) -> str:
    """JSON with one line per list of scalars (one measurement per line), keys in insertion order."""
    pad = " " * (indent + 1)
    if isinstance(obj, dict):
        body = ",\n".join(f"{pad}{json.dumps(k)}: {_encode(v, indent + 1)}" for k, v in obj.items())
        return "{\n" + body + "\n" + " " * indent + "}"
    if isinstance(obj, list) and any(isinstance(v, (list, dict)) for v in obj):
        return "[\n" + ",\n".join(pad + _encode(v, indent + 1) for v in obj) + "\n" + " " * indent + "]"
    return json.dumps(obj)


def _round(x: float) -> float:
    return float(f"{x:.6g}")


def _spec_json(s: ModelSpec) -> dict[str, Any]:
    return {"params": s.params, "global_batch": s.global_batch, "hidden": s.hidden, "layers": s.layers, "seq_len": s.seq_len}


def convert(data: Path, out: Path) -> str:
    """Write out/plans_a800.json from the raw data; returns a one-line summary per model."""
    models: dict[str, Any] = {}
    lines = []
    for name, spec in SPECS.items():
        rows = read_model(data, name)
        fit_idx = sample_fit_rows(rows, FIT_POINTS, FIT_SEED)
        params = fit_plan_params(spec, ENV, [rows[i] for i in fit_idx])
        chosen = set(fit_idx)
        models[name] = {
            "spec": _spec_json(spec),
            "params": {n: _round(getattr(params, n)) for n in PARAM_NAMES},
            "fit": {"points": len(fit_idx), "seed": FIT_SEED, "rule": "one per plan family, then random"},
            "measurements": [
                [str(r.plan), "".join(map(str, r.resources.placement)), _round(r.iter_time_s), i in chosen]
                for i, r in enumerate(rows)
            ],
        }
        lines.append(f"{name}: {len(rows)} measurements, fitted on {len(fit_idx)}")
    doc = {
        "gpu_type": "a800",
        "source": "AlibabaPAI/reconfigurable-dl-scheduler (Morphling/Rubick artifact), Apache-2.0; see README.md",
        "cpus_per_gpu_measured": CPUS_PER_GPU,
        "env": {
            "nvlink_gbs": ENV.nvlink_gbs, "internode_gbs": ENV.internode_gbs, "pcie_gbs": ENV.pcie_gbs,
            "gpu_memory_gb": ENV.gpu_memory_gb, "gpus_per_nic": ENV.gpus_per_nic,
            "memory_overhead_gb": ENV.memory_overhead_gb,
        },
        "models": models,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / PROFILE_NAME).write_text(_encode(doc) + "\n", encoding="utf-8")
    lines.append(f"wrote {out / PROFILE_NAME}")
    return "\n".join(lines)
