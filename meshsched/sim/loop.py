"""The discrete-event loop: trace arrivals and world events fed through the same Engine the daemon runs."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from meshsched import events as ev
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.policies.abilities import ModelsMpsShare, PredictsInterference
from meshsched.policies.stack import PolicyStack
from meshsched.sim.durations import FixedStepEstimator, trace_timed
from meshsched.sim.rules import SimRules, SteppedStack, check_policy
from meshsched.sim.world import SimWorld
from meshsched.state import JobSpec, NodeSpec


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """`nodes` servers of `gpus_per_node` GPUs of one type; `extra` adds groups of other types (a mixed cluster).
    CPUs and host memory per server: None is `NodeSpec`'s default (the Rubick testbed's share per GPU)."""

    nodes: int
    gpus_per_node: int
    gpu_type: str
    gpu_memory_mb: int
    extra: tuple[ClusterSpec, ...] = ()
    cpus_per_node: int | None = None
    memory_gb_per_node: float | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"cluster needs at least one node with at least one GPU, got {self.nodes} x {self.gpus_per_node}")

    @property
    def groups(self) -> tuple[ClusterSpec, ...]:
        return (ClusterSpec(self.nodes, self.gpus_per_node, self.gpu_type, self.gpu_memory_mb, (),
                            self.cpus_per_node, self.memory_gb_per_node), *self.extra)

    @property
    def total_gpus(self) -> int:
        return sum(g.nodes * g.gpus_per_node for g in self.groups)

    @property
    def largest_node(self) -> int:
        return max(g.gpus_per_node for g in self.groups)

    @classmethod
    def parse(cls, text: str, gpus_per_node: int, memory_mb) -> ClusterSpec:
        """`TYPE:NODES[xGPUS],...`, e.g. `v100:16,p100:16,k80:16` or `v100:4x8,k80:8x4`; the first group is the
        reference type (trace durations become iterations at its speed). `memory_mb(type)` gives GPU memory."""
        groups = []
        for part in text.split(","):
            gpu_type, sep, size = part.strip().partition(":")
            nodes, x, per = size.partition("x")
            try:
                if not sep or not gpu_type:
                    raise ValueError
                n, g = int(nodes), int(per) if x else gpus_per_node
            except ValueError:
                raise ValueError(f"--cluster wants TYPE:NODES[xGPUS_PER_NODE],... (e.g. v100:16,p100:16,k80:16x4), "
                                 f"got {part.strip()!r}") from None
            groups.append(cls(n, g, gpu_type.strip().lower(), memory_mb(gpu_type.strip().lower())))
        if len({g.gpu_type for g in groups}) != len(groups):
            raise ValueError(f"--cluster {text!r}: give each GPU type once")
        return replace(groups[0], extra=tuple(groups[1:]))

    def describe(self) -> str:
        return " + ".join(f"{g.nodes} x {g.gpus_per_node} {g.gpu_type}" for g in self.groups)

    def node_specs(self) -> list[NodeSpec]:
        if not self.extra:
            width = len(str(self.nodes - 1))
            return [
                NodeSpec(f"node{i:0{width}d}", self.gpus_per_node, self.gpu_type, self.gpu_memory_mb,
                         cpus=self.cpus_per_node, memory_gb=self.memory_gb_per_node)
                for i in range(self.nodes)
            ]
        out = []
        for g in self.groups:
            width = len(str(g.nodes - 1))
            out += [NodeSpec(f"{g.gpu_type}-{i:0{width}d}", g.gpus_per_node, g.gpu_type, g.gpu_memory_mb,
                             cpus=g.cpus_per_node, memory_gb=g.memory_gb_per_node) for i in range(g.nodes)]
        return out


@dataclass
class SimResult:
    engine: Engine
    cluster: ClusterSpec
    events: int
    queue_times: list[float] = field(default_factory=list)  # queue length samples, where it changed
    queue_lengths: list[int] = field(default_factory=list)


def simulate(
    jobs: Sequence[JobSpec],
    policy: PolicyStack,
    perf,
    cluster: ClusterSpec,
    *,
    interference=None, mps_share=None,
    after_event: Callable[[Engine], None] | None = None,
    progress: Callable[[int], None] | None = None,
    rules: SimRules = SimRules(),
    events: Sequence[tuple[float, ev.Event]] = (), durations: Sequence[float] | None = None,
) -> SimResult:
    """Replay `jobs` (sorted by submit_time) under `policy` until nothing is left to happen.

    `after_event(engine)` runs after every event (tests pass `lambda e: e.state.validate()`);
    `progress(n_arrived)` is called every 1,000 arrivals. `interference` is the truth for jobs sharing a GPU
    (default: the predictor the policy stack was built with); `mps_share` is the truth for jobs under a
    calibration (default: the MPS-share model of the stack's calibration layer, if any).
    `rules` (meshsched.sim.rules) selects a published simulator's conventions; under a time step the policy
    gets one pass per step (ValueError for a periodic policy).
    `events`: (time, event) pairs the operator says, such as `DrainChanged` (meshsched.loaders.events), each fed
    to the engine at its time, before an arrival at the same time; a drain without a resume lasts to the end.
    `durations`: the trace's, in `jobs`' order (`Trace.durations`), for rules with `trace_durations` (sim.durations).
    Python's automatic cyclic collection is paused while it runs (young objects are collected every 262,144 events,
    everything the replay made once at the end of a replay of 65,536 events or more; what the process held before
    is frozen meanwhile, gc.freeze) and left as it was found.
    """
    jobs, engine, world, gate = _start(jobs, durations, policy, perf, cluster, interference, mps_share, rules)
    result = SimResult(engine, cluster, 0)
    for at, said in sorted(events, key=lambda pair: pair[0]):  # stable: ties keep their order
        world.push(at, said)
    if jobs:
        world.push(jobs[0].submit_time, ev.JobSubmitted(f"submit-{jobs[0].job_id}", jobs[0]))
    result.events = _replay(jobs, engine, world, gate, result, after_event, progress)
    if progress is not None:
        progress(len(jobs))
    return result


_YOUNG_EVERY = 1 << 18  # events between two collections of the young generations (`_replay`)


def _replay(jobs: Sequence[JobSpec], engine: Engine, world: SimWorld, gate: SteppedStack | None, result: SimResult,
            after_event: Callable[[Engine], None] | None, progress: Callable[[int], None] | None) -> int:
    """`simulate`'s loop: every event the world holds, each handled by the engine and its actions executed, the
    queue's length sampled where it changed; returns how many events there were."""
    count, qlen, next_arrival = 0, -1, 0
    qt, ql, queued = result.queue_times, result.queue_lengths, engine.waiting.entries  # (queued: queue_length's)
    step_at, step_events, step_limit = None, 0, 10 * len(jobs) + 1000  # time-stepped: events at one instant
    pop, push, handle, execute, take_reports = world.pop, world.push, engine.handle, world.execute, world.take_reports
    # Python's cyclic collector is paused for the replay: the engine's and the world's objects form no cycles, and
    # its full collections re-read every job, spec and log line kept, again each time they grew by a quarter (three
    # times in an SJF replay of Philly). The young generations are collected every 262,144 events instead, so a
    # cycle made on the way is still freed, and after a long replay a full collection runs before it returns: the
    # collector would otherwise run one at the caller's next allocation, and its cost is the replay's. What the
    # process held before the replay (the trace's jobs among it) is frozen meanwhile (gc.freeze): that collection
    # reads only what the replay made, and the old objects go back to the oldest generation after it.
    paused, collect_at = gc.isenabled(), _YOUNG_EVERY
    frozen = paused and not gc.get_freeze_count()  # (a caller's own frozen objects are left as they are)
    if paused:
        gc.disable()
    if frozen:
        gc.freeze()
    try:
        while (item := pop()) is not None:
            now, event = item
            count += 1
            kind = type(event)
            if kind is ev.JobSubmitted:
                world.submit(event.spec)
                next_arrival += 1
                if next_arrival < len(jobs):
                    nxt = jobs[next_arrival]
                    push(nxt.submit_time, ev.JobSubmitted(f"submit-{nxt.job_id}", nxt))
                if progress is not None and next_arrival % 1000 == 0:
                    progress(next_arrival)
            elif kind is ev.JobStarted:
                world.started(event.job_id, now)
            elif kind is ev.JobFinished:
                world.finished(event.job_id)
            if gate is not None:
                # more of this step follows: its pass comes with the last event (an operator's drain or resume comes
                # first in its step, and a resume's pass runs at once: nothing after it in the step need carry one)
                gate.hold = world.next_time() == now and kind is not ev.DrainChanged
                step_events = step_events + 1 if now == step_at else 1
                step_at = now
                if step_events > step_limit:
                    raise RuntimeError(f"time step at {now:g} s: over {step_limit} events without time advancing "
                                       f"(the policy preempts and restarts jobs in a loop: preemption is free under "
                                       f"these rules)")
            if actions := handle(event, now):
                execute(actions, now)
            if gate is not None and not gate.hold and gate.pending:
                raise RuntimeError(f"time step at {now}: its last event ({type(event).__name__}) ran no scheduling "
                                   f"pass")
            if after_event is not None:
                after_event(engine)
            while world.due and (reports := take_reports()):  # what re-rated jobs' SDKs report (calibration: more)
                for report in reports:
                    count += 1
                    execute(handle(report, now), now)
                    if after_event is not None:
                        after_event(engine)
            n = len(queued)
            if n != qlen:
                qlen = n
                qt.append(now)
                ql.append(n)
            if paused and count >= collect_at:
                gc.collect(1)
                collect_at = count + _YOUNG_EVERY
    finally:
        if paused:
            gc.enable()
            if count >= _YOUNG_EVERY // 4:  # (a short replay leaves little for the collector)
                gc.collect()
        if frozen:
            gc.unfreeze()
    return count


def _start(jobs: Sequence[JobSpec], durations: Sequence[float] | None, policy: PolicyStack, perf,
           cluster: ClusterSpec, interference, mps_share,
           rules: SimRules) -> tuple[Sequence[JobSpec], Engine, SimWorld, SteppedStack | None]:
    """The jobs to replay (trace-timed under `rules.trace_durations`: meshsched.sim.durations), the engine (behind
    a time-step gate under a stepped simulator's rules) and the world, every node joined at 0 before the first
    arrival; `simulate` documents the defaults of `interference` and `mps_share`. A trace-timed job's fixed step
    is both the engine's estimate and the world's truth."""
    estimator = ProfileEstimator(perf)
    jobs, steps = trace_timed(jobs, durations, rules, estimator, cluster)
    nodes = cluster.node_specs()
    check_policy(rules, policy)
    if policy.preemption is None:
        rules = replace(rules, preemptive_end_lag_s=0.0)
    gate = SteppedStack(policy) if rules.time_step_s is not None else None
    engine = Engine(gate or policy, FixedStepEstimator(estimator, steps) if steps else estimator)
    if interference is None and isinstance(policy.placement, PredictsInterference):
        interference = policy.placement.interference
    if mps_share is None and isinstance(policy.calibration, ModelsMpsShare):
        mps_share = policy.calibration.mps_share
    world = SimWorld(perf, nodes, interference, mps_share, rules, steps)
    for n in nodes:
        world.execute(engine.handle(ev.NodeJoined(f"join-{n.name}", n), 0.0), 0.0)
    return jobs, engine, world, gate
