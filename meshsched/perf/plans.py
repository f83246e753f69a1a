"""Execution plans (Rubick, Sec. 3-4): the plan type and its string form, the iteration-time model with its
seven fittable parameters, the GPU-memory estimator, and the best feasible plan for an allocation. Pure.

A plan is DP x TP x PP degrees, gradient-accumulation (GA) steps, gradient checkpointing (GC), a ZeRO-DP stage
and ZeRO-Offload; its string form is `dp4-tp2-pp1-ga2-gc-z2-off` (tp, pp and ga default to 1 when left out).

The iteration time (Sec. 4, Fig. 5) is built from T_fwd, T_bwd, T_comm, T_opt and T_off with fitted overlaps.
The paper defers its formulas to an appendix that is not in our copy, so the exact terms below are this
module's reading of Sec. 4.1-4.2 (every choice is listed in profiles/README.md). Per GPU, with N = d*t*p
GPUs, P parameters, global batch B, m = B/(d*a) samples per micro-batch, in seconds:

  T_fwd  = k_fwd * (B/d) * P[1e9] / (t*p)                    the batch split by DP, the layers by TP and PP
  T_bwd  = k_bwd * T_fwd;  GC adds one more T_fwd (recomputation)
  T_tp   = TP all-reduces of activations: (4, or 6 with GC) * L/p * AR((B/d) * s*h * 2 B)
  bubble = (a + p - 1) / a                                   1F1B pipeline with a micro-batches
  T_dp   = gradient all-reduce AR(2 B * P/(t*p))  (x1.5 for ZeRO-3)
  T_sync = the last micro-batch's backward and T_dp overlapped: (T_b^k_sync + T_dp^k_sync)^(1/k_sync),
           earlier micro-batches' backward added in full; with PP (> 1) the sync follows the pipeline flush:
           bubble * T_b + T_dp
  T_pp   = 2 * bubble * (B/d) * s*h * 2 B / t / bw            activations and their gradients between stages
  T_opt  = k_opt * P[1e9] / (t*p) (/ d under ZeRO)           the optimizer step on GPU
  T_off  = (T_cpu^k_off + T_pcie^k_off)^(1/k_off) with T_cpu = k_opt_off * P[1e9]/(t*p*d) / threads per GPU,
           T_pcie = 4 B * P/(t*p*d) * q / bw_host            ZeRO-Offload: CPU Adam and the host copies
           (q = the job's most GPUs on one node: they share that node's host link)
  T_iter = bubble * (T_fwd + T_re + T_tp) + T_sync + T_pp + (T_off or T_opt) + k_const * (a + p - 1)

k_const is a fixed cost per pipeline step (kernel launches, synchronisation): a micro-batches through p
stages take a + p - 1 steps, so GA and PP are not free.
AR(S) is a hierarchical all-reduce of S bytes over the slowest group of that kind: 2(q-1)/q * S over NVLink
for its q ranks on one node, plus 2 * S through the NICs of its worst node when it spans nodes (a node with
g of the job's GPUs has ceil(g / gpus_per_nic) NICs, shared by its groups). Bandwidths are environment
constants (Sec. 4.1: measured, not fitted). Ranks are laid out as Megatron does (TP fastest, then DP, then
PP) over the placement's nodes in order.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, fields
from typing import Any

from meshsched.perf.errors import UnknownProfile

GB = 1e9
FP16 = 2  # bytes per fp16 value (weights, gradients, activations)


class InvalidPlan(ValueError):
    """A plan string or plan that cannot exist (one line, says what is wrong)."""


# -- the plan --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class ExecutionPlan:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ga: int = 1
    gc: bool = False
    zero: int = 0  # ZeRO-DP stage 0 (off), 1, 2 or 3
    offload: bool = False  # ZeRO-Offload: optimizer state and step on the CPU

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "ga"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidPlan(f"{name} must be an integer >= 1, got {v!r}")
        if self.zero not in (0, 1, 2, 3):
            raise InvalidPlan(f"ZeRO stage must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.offload and self.zero == 0:
            raise InvalidPlan("ZeRO-Offload needs a ZeRO stage (z1, z2 or z3)")
        if self.zero >= 2 and self.pp > 1:
            raise InvalidPlan(f"ZeRO-{self.zero} shards gradients, which pipeline parallelism (pp{self.pp}) cannot use")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        s = f"dp{self.dp}-tp{self.tp}-pp{self.pp}-ga{self.ga}"
        return s + ("-gc" if self.gc else "") + (f"-z{self.zero}" if self.zero else "") + ("-off" if self.offload else "")

    @classmethod
    def parse(cls, text: str) -> ExecutionPlan:
        """`dp4-tp2-pp1-ga2-gc-z2-off`; tokens in any order, each at most once; tp/pp/ga default to 1."""
        tokens = [t for t in text.strip().lower().split("-")]
        if not text.strip() or "" in tokens:
            raise InvalidPlan(f"empty plan or empty token in {text!r}; expected e.g. dp4-tp2-pp1-ga2-gc-z2-off")
        seen: dict[str, object] = {}
        for tok in tokens:
            m = re.fullmatch(r"(dp|tp|pp|ga|z)(\d+)|(gc|off)", tok)
            if m is None:
                raise InvalidPlan(f"unknown token {tok!r} in plan {text!r}; tokens: dpN tpN ppN gaN zN gc off")
            key = m.group(1) or m.group(3)
            if key in seen:
                raise InvalidPlan(f"token {key!r} given twice in plan {text!r}")
            seen[key] = int(m.group(2)) if m.group(2) is not None else True
        if "dp" not in seen:
            raise InvalidPlan(f"plan {text!r} has no dpN (data-parallel degree)")
        return cls(
            dp=seen["dp"], tp=seen.get("tp", 1), pp=seen.get("pp", 1), ga=seen.get("ga", 1),  # type: ignore[arg-type]
            gc=bool(seen.get("gc", False)), zero=seen.get("z", 0), offload=bool(seen.get("off", False)),  # type: ignore[arg-type]
        )


def plan_family(plan: ExecutionPlan) -> str:
    """The plan family used by the paper's Table 2 (DP, GC, ZeRO-DP+GA, ZeRO-Offload[+GC], TP+PP, DP+TP+PP)."""
    if plan.offload:
        return "ZeRO-Offload+GC" if plan.gc else "ZeRO-Offload"
    if plan.zero:
        return "ZeRO-DP+GA"
    if plan.tp > 1 or plan.pp > 1:
        return "TP+PP" if plan.dp == 1 else "DP+TP+PP"
    return "GC" if plan.gc else "DP"


# -- what the model needs to know ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model type: parameter count, the job's global batch, and the transformer shape TP/PP traffic needs."""

    name: str
    params: int
    global_batch: int
    hidden: int
    layers: int
    seq_len: int


@dataclass(frozen=True, slots=True)
class Environment:
    """Cluster constants (measured per cluster, not fitted): effective bandwidths in GB/s, GPU memory in GB."""

    nvlink_gbs: float  # collective bandwidth among the GPUs of one node
    internode_gbs: float  # one NIC
    pcie_gbs: float  # one node's host link (GPU <-> CPU memory), shared by its GPUs
    gpu_memory_gb: float
    gpus_per_nic: int = 2
    memory_overhead_gb: float = 2.0  # CUDA context, workspaces, allocator slack per GPU


@dataclass(frozen=True, slots=True)
class Resources:
    """An allocation: GPUs on each node (in order), and CPU threads per GPU (what CPU Adam under ZeRO-Offload uses)."""

    placement: tuple[int, ...]
    cpus_per_gpu: float = 4.0

    def __post_init__(self) -> None:
        if not self.placement or any(g < 1 for g in self.placement):
            raise InvalidPlan(f"placement must list >= 1 GPU on each node, got {self.placement}")
        if not self.cpus_per_gpu > 0:
            raise InvalidPlan(f"cpus_per_gpu must be > 0, got {self.cpus_per_gpu}")

    @property
    def gpus(self) -> int:
        return sum(self.placement)

    @classmethod
    def parse(cls, digits: str, cpus_per_gpu: float = 4.0) -> Resources:
        """A placement digit string as in the measurements ('233' = 2, 3 and 3 GPUs on three nodes)."""
        if not digits.isdigit():
            raise InvalidPlan(f"placement {digits!r} must be digits, one per node (e.g. 44 = two nodes of 4 GPUs)")
        return cls(tuple(int(c) for c in digits), cpus_per_gpu)


@dataclass(frozen=True, slots=True)
class PlanParams:
    """The seven fittable parameters of one model type (units: seconds, 1e9 parameters, samples)."""

    k_fwd: float  # s of forward per sample per 1e9 parameters on one GPU
    k_bwd: float  # backward / forward time
    k_sync: float  # overlap exponent of backward and DP gradient sync (1 = serial, large = fully hidden)
    k_opt: float  # s per 1e9 parameters of the GPU optimizer step
    k_opt_off: float  # s x threads per 1e9 parameters of the CPU optimizer step (ZeRO-Offload CPU efficiency)
    k_off: float  # overlap exponent of the CPU step and its PCIe copies
    k_const: float  # s of fixed overhead per pipeline step (a + p - 1 steps per iteration)

    def as_tuple(self) -> tuple[float, ...]:
        return tuple(getattr(self, n) for n in PARAM_NAMES)


PARAM_NAMES = tuple(f.name for f in fields(PlanParams))


@dataclass(frozen=True, slots=True)
class PlanProfile:
    """What predicting one model type needs: its spec and its fitted parameters."""

    spec: ModelSpec
    params: PlanParams


@dataclass(frozen=True, slots=True)
class IterTerms:
    """The parts of one iteration (seconds), as in the paper's Fig. 5; `total` is T_iter."""

    fwd: float
    bwd: float
    recompute: float
    tp_comm: float
    bubble: float
    dp_comm: float
    sync: float  # backward and gradient sync after their overlap (bubble applied)
    pp_comm: float
    opt: float
    cpu_opt: float
    pcie: float
    offload: float  # CPU step and PCIe copies after their overlap
    const: float
    total: float


# -- the iteration-time model ----------------------------------------------------------------------------


def _overlap(a: float, b: float, k: float) -> float:
    """(a^k + b^k)^(1/k), computed without overflow for large k; k = 1 is a + b, k -> inf is max(a, b)."""
    top = max(a, b)
    if top <= 0.0:
        return 0.0
    return top * ((a / top) ** k + (b / top) ** k) ** (1.0 / k)


@dataclass(frozen=True, slots=True)
class GroupSpan:
    """The slowest group of one kind (TP, DP or PP): nodes it spans, the inter-node bandwidth it gets (GB/s, on
    its worst node) and the most of its ranks on one node."""

    nodes: int
    internode_gbs: float
    per_node: int

    def allreduce_s(self, size_bytes: float, env: Environment) -> float:
        """All-reduce of `size_bytes`: 2(q-1)/q * S over NVLink among a node's q ranks, plus, across nodes,
        2 * S through the group's share of its worst node's NICs (hierarchical/tree: every node sends and
        receives the buffer once, whatever the node count)."""
        intra = 2 * (self.per_node - 1) / self.per_node * size_bytes / (env.nvlink_gbs * GB)
        inter = 2 * size_bytes / (self.internode_gbs * GB) if self.nodes > 1 else 0.0
        return intra + inter


def group_spans(plan: ExecutionPlan, placement: tuple[int, ...], env: Environment) -> tuple[GroupSpan, GroupSpan, GroupSpan]:
    """(TP, DP, PP) slowest-group spans. Ranks fill the placement's nodes in order, laid out as Megatron does:
    rank r has tp rank r % t, dp rank (r // t) % d, pp rank r // (t*d). A node with q of the job's GPUs has
    ceil(q / gpus_per_nic) NICs for it, shared by its groups in proportion to their ranks there; a group's
    inter-node bandwidth is that of its worst node (Sec. 4.1: the lowest bandwidth among the GPUs involved)."""
    d, t, p = plan.dp, plan.tp, plan.pp
    node_of = [n for n, g in enumerate(placement) for _ in range(g)]
    rank = lambda s, j, i: s * t * d + j * t + i  # noqa: E731
    kinds = (
        [[rank(s, j, i) for i in range(t)] for s in range(p) for j in range(d)],
        [[rank(s, j, i) for j in range(d)] for s in range(p) for i in range(t)],
        [[rank(s, j, i) for s in range(p)] for j in range(d) for i in range(t)],
    )
    out = []
    for groups in kinds:
        spans = []
        for g in groups:
            on_node = {n: sum(1 for r in g if node_of[r] == n) for n in {node_of[r] for r in g}}
            bw = min(
                env.internode_gbs * -(-placement[n] // env.gpus_per_nic) * q / placement[n] for n, q in on_node.items()
            )
            spans.append(GroupSpan(len(on_node), bw, max(on_node.values())))
        out.append(max(spans, key=lambda x: x.allreduce_s(1.0, env)))
    return out[0], out[1], out[2]


def check_plan(spec: ModelSpec, plan: ExecutionPlan, res: Resources) -> None:
    """Raise InvalidPlan when the plan cannot run this model on this allocation (not a memory check)."""
    if plan.gpus != res.gpus:
        raise InvalidPlan(f"plan {plan} uses {plan.gpus} GPUs (dp*tp*pp) but the allocation has {res.gpus}")
    if spec.global_batch % (plan.dp * plan.ga):
        raise InvalidPlan(
            f"global batch {spec.global_batch} of {spec.name} does not split into dp{plan.dp} x ga{plan.ga} micro-batches"
        )
    if plan.pp > spec.layers:
        raise InvalidPlan(f"pp{plan.pp} exceeds the {spec.layers} layers of {spec.name}")


def iteration_terms(profile: PlanProfile, plan: ExecutionPlan, res: Resources, env: Environment,
                    fwd_s: float | None = None) -> IterTerms:
    """Every term of the iteration-time model for this plan and allocation (see the module doc). `fwd_s`: a
    measured forward time of this configuration used as T_fwd instead of k_fwd's (the Rubick artifact's
    validation protocol: it profiles the forward pass and passes it in; k_fwd is then unused)."""
    spec, k = profile.spec, profile.params
    check_plan(spec, plan, res)
    d, t, p, a = plan.dp, plan.tp, plan.pp, plan.ga
    p_b = spec.params / GB
    per_replica = spec.global_batch / d
    span_tp, span_dp, span_pp = group_spans(plan, res.placement, env)
    act = spec.seq_len * spec.hidden * FP16  # bytes of one sample's activations at one layer boundary

    fwd = k.k_fwd * per_replica * p_b / (t * p) if fwd_s is None else fwd_s
    bwd = k.k_bwd * fwd
    recompute = fwd if plan.gc else 0.0
    tp_comm = (6 if plan.gc else 4) * (spec.layers / p) * span_tp.allreduce_s(per_replica * act, env)
    bubble = (a + p - 1) / a
    dp_comm = span_dp.allreduce_s(FP16 * spec.params / (t * p), env) * (1.5 if plan.zero == 3 else 1.0)
    if p > 1:  # Megatron syncs gradients after the pipeline flush
        sync = bubble * bwd + dp_comm
    else:  # only the last micro-batch's backward overlaps the sync
        sync = bwd * (a - 1) / a + _overlap(bwd / a, dp_comm, k.k_sync)
    pp_link = span_pp.internode_gbs if span_pp.nodes > 1 else env.nvlink_gbs
    pp_comm = 2 * bubble * per_replica * act / t / (pp_link * GB) if p > 1 else 0.0
    shard = spec.params / (t * p) / (d if plan.zero else 1)
    opt = k.k_opt * shard / GB
    cpu_opt = k.k_opt_off * shard / GB / res.cpus_per_gpu if plan.offload else 0.0
    # every GPU of the job on a node copies its shard through that node's host link
    pcie = 2 * FP16 * shard * max(res.placement) / (env.pcie_gbs * GB) if plan.offload else 0.0
    offload = _overlap(cpu_opt, pcie, k.k_off) if plan.offload else 0.0
    const = k.k_const * (a + p - 1)  # a fixed cost per pipeline step (a micro-batches through p stages)
    total = bubble * (fwd + recompute + tp_comm) + sync + pp_comm + (offload if plan.offload else opt) + const
    return IterTerms(fwd, bwd, recompute, tp_comm, bubble, dp_comm, sync, pp_comm, opt, cpu_opt, pcie, offload, const, total)


def iteration_time(profile: PlanProfile, plan: ExecutionPlan, res: Resources, env: Environment) -> float:
    """Seconds per iteration (one optimizer step over the global batch)."""
    return iteration_terms(profile, plan, res, env).total


def throughput(profile: PlanProfile, plan: ExecutionPlan, res: Resources, env: Environment) -> float:
    """Samples per second: b / T_iter."""
    return profile.spec.global_batch / iteration_time(profile, plan, res, env)


# -- memory ----------------------------------------------------------------------------------------------

ACT_BYTES_PER_TOKEN_HIDDEN = 34  # per layer, fp16, without the attention-score matrix (Korthikanti et al. 2022)


def gpu_memory_gb(spec: ModelSpec, plan: ExecutionPlan, env: Environment) -> float:
    """Estimated peak GPU memory per GPU (GB): model states as in the ZeRO paper (mixed-precision Adam:
    2 B fp16 weights + 2 B fp16 gradients + 12 B fp32 optimizer state per parameter, the last two sharded by
    ZeRO, moved to the CPU by ZeRO-Offload) plus activations plus a fixed overhead."""
    d, t, p = plan.dp, plan.tp, plan.pp
    pg = spec.params / (t * p)  # parameters held by one model-parallel rank
    if plan.offload:  # fp16 weights stay (sharded under ZeRO-3) plus a gradient partition buffer
        states = (FP16 * pg / d if plan.zero == 3 else FP16 * pg) + FP16 * pg / d
    else:
        states = {0: 16 * pg, 1: 4 * pg + 12 * pg / d, 2: 2 * pg + 14 * pg / d, 3: 16 * pg / d}[plan.zero]
    micro = spec.global_batch / (d * plan.ga)
    tokens = micro * spec.seq_len * spec.hidden
    layers = spec.layers / p
    full_layer = ACT_BYTES_PER_TOKEN_HIDDEN * tokens / t
    if plan.gc:  # only each layer's input is kept, plus one layer recomputed at a time
        per_micro = layers * FP16 * tokens + full_layer
    else:
        per_micro = layers * full_layer
    in_flight = min(plan.ga, p) if p > 1 else 1  # 1F1B keeps up to p micro-batches on the first stage
    return (states + in_flight * per_micro) / GB + env.memory_overhead_gb


def host_memory_gb(spec: ModelSpec, plan: ExecutionPlan) -> float:
    """Host memory per GPU (GB) that ZeRO-Offload needs: fp32 optimizer state and fp16 gradients of its shard."""
    if not plan.offload:
        return 0.0
    return 14 * spec.params / (plan.tp * plan.pp * plan.dp) / GB


def fits(spec: ModelSpec, plan: ExecutionPlan, env: Environment) -> bool:
    return gpu_memory_gb(spec, plan, env) <= env.gpu_memory_gb


# -- choosing a plan -------------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [i for i in range(1, n + 1) if n % i == 0]


def candidate_plans(spec: ModelSpec, gpus: int) -> list[ExecutionPlan]:
    """Every valid plan for `gpus` GPUs (memory not checked), in a fixed order. TP divides the hidden size
    (Megatron splits the hidden dimension and the attention heads)."""
    out = []
    for t, p in itertools.product(_divisors(gpus), repeat=2):
        if gpus % (t * p) or p > spec.layers or spec.hidden % t:
            continue
        d = gpus // (t * p)
        if spec.global_batch % d:
            continue
        for a, gc, zero, off in itertools.product(_divisors(spec.global_batch // d), (False, True), (0, 1, 2, 3), (False, True)):
            if (off and zero == 0) or (zero >= 2 and p > 1) or (zero and d == 1 and not off):
                continue  # invalid, or ZeRO with one replica and nothing to shard (same as no ZeRO)
            out.append(ExecutionPlan(d, t, p, a, gc, zero, off))
    return out


def best_plan(
    profile: PlanProfile, res: Resources, env: Environment
) -> tuple[ExecutionPlan, float] | None:
    """The feasible plan (fits GPU memory) with the shortest predicted iteration time, or None if none fits."""
    best: tuple[float, ExecutionPlan] | None = None
    for plan in candidate_plans(profile.spec, res.gpus):
        if not fits(profile.spec, plan, env):
            continue
        t = iteration_time(profile, plan, res, env)
        if best is None or t < best[0] or (t == best[0] and plan < best[1]):
            best = (t, plan)
    return None if best is None else (best[1], best[0])


# -- measurements and the profile file (profiles/plans_a800.json) -----------------------------------------


@dataclass(frozen=True, slots=True)
class PlanMeasurement:
    """One measured iteration time of a plan on an allocation; `in_fit`: the shipped parameters were fitted on it."""

    plan: ExecutionPlan
    resources: Resources
    iter_time_s: float
    in_fit: bool = False
    fwd_s: float | None = None  # its measured forward time, where the raw data has one (not in the profile file)

    @property
    def family(self) -> str:
        return plan_family(self.plan)


@dataclass(frozen=True, slots=True)
class PlanCatalog:
    """A plan profile file: its environment, and per model type the fitted profile and the measurements."""

    gpu_type: str
    env: Environment
    profiles: dict[str, PlanProfile]
    measurements: dict[str, tuple[PlanMeasurement, ...]]

    def profile(self, model: str) -> PlanProfile:
        prof = self.profiles.get(model)
        if prof is None:
            raise UnknownProfile(f"no plan profile for model {model!r} on {self.gpu_type}", self.profiles)
        return prof


def catalog_from_json(doc: dict[str, Any]) -> PlanCatalog:
    env = Environment(**doc["env"])
    cpus = float(doc["cpus_per_gpu_measured"])
    profiles, measured = {}, {}
    for name, m in doc["models"].items():
        spec = ModelSpec(name=name, **m["spec"])
        profiles[name] = PlanProfile(spec, PlanParams(**{n: float(m["params"][n]) for n in PARAM_NAMES}))
        measured[name] = tuple(
            PlanMeasurement(ExecutionPlan.parse(plan), Resources.parse(placement, cpus), float(t), bool(fit))
            for plan, placement, t, fit in m["measurements"]
        )
    return PlanCatalog(doc["gpu_type"], env, profiles, measured)



# -- the plan model as the simulator's performance model --------------------------------------------------

RECONFIGURE_LOAD_S = 60.0  # restart with the new plan, resume from the checkpoint
RECONFIGURE_PAUSE_S = 18.0  # save the checkpoint; with the load, the 78 s the paper measures per reconfiguration


class PlanPerfModel:
    """The `PerfModel` surface the simulator and the engine's estimates use, over a `PlanCatalog`: a job under
    a plan (`ExecConfig.plan`) steps at `plan_iteration_time`; without one, at its best feasible plan on those
    GPUs. Load and pause times are fixed (`RECONFIGURE_*`). One GPU type: the catalog's."""

    def __init__(self, catalog: PlanCatalog, load_s: float = RECONFIGURE_LOAD_S,
                 pause_s: float = RECONFIGURE_PAUSE_S) -> None:
        self.catalog = catalog
        self.env = catalog.env
        self.gpu_types: tuple[str, ...] = (catalog.gpu_type,)
        self._load_s, self._pause_s = load_s, pause_s
        self._best: dict[tuple[str, tuple[int, ...]], float] = {}

    def models(self, gpu_type: str, gpus: int = 1) -> tuple[str, ...]:
        return tuple(sorted(self.catalog.profiles))

    def profile(self, model: str) -> PlanProfile:
        return self.catalog.profile(model)

    def iteration_time(self, model: str, gpu_type: str, placement: tuple[int, ...], per_gpu_batch: int,
                       accumulation: int = 1) -> float:
        """Seconds per step on the best feasible plan for these GPUs (an estimate for jobs without a plan)."""
        key = (model, tuple(sorted(placement, reverse=True)))
        if key not in self._best:
            best = best_plan(self.catalog.profile(model), Resources(key[1]), self.env)
            if best is None:
                raise UnknownProfile(f"no plan of {model} fits GPU memory on {sum(placement)} GPU(s)", ())
            self._best[key] = best[1]
        return self._best[key]

    def plan_iteration_time(self, model: str, exec_config, placement: tuple[int, ...]) -> float:
        """Seconds per step of `exec_config.plan` on `placement` with its CPUs per GPU (4 when not set)."""
        plan = ExecutionPlan.parse(exec_config.plan)
        cpus = exec_config.cpus_per_gpu or DEFAULT_CPUS_PER_GPU
        return iteration_time(self.catalog.profile(model), plan, Resources(tuple(placement), float(cpus)), self.env)

    def load_time(self, model: str) -> float:
        return self._load_s

    def pause_time(self, model: str) -> float:
        return self._pause_s

    def gpu_memory_mb(self, gpu_type: str) -> int:
        return int(self.env.gpu_memory_gb * 1024)


DEFAULT_CPUS_PER_GPU = 4  # what the Morphling measurements used (profiles/README.md)
