"""One performance model over two kinds of jobs: the data-parallel profiles (`PerfModel`, per GPU type) and the
execution-plan profiles (`PlanPerfModel`, one catalog). A workload that mixes them (Philly-shaped arrivals
where some jobs are of the plan-profile models, meshsched.sim.mixed_trace) replays under any stack: a query
about a plan-profile model goes to the plan model (whatever the GPU type: the catalog's GPUs stand in for the
cluster's), every other one to the data-parallel model.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshsched.perf.errors import UnknownProfile
from meshsched.perf.model import PerfModel
from meshsched.perf.plans import PlanPerfModel


class MixedPerfModel:
    """`PerfModel`'s surface over a `PerfModel` and a `PlanPerfModel` (`plans`), dispatched by model name."""

    def __init__(self, base: PerfModel, plans: PlanPerfModel) -> None:
        self.base = base
        self.plans = plans
        self.catalog = plans.catalog
        self.env = plans.env
        self.gpu_types = base.gpu_types
        taken = {m for t in base.gpu_types for m in base.models(t)}
        # a name in both (bert: a T4 profile and a plan profile) stays data-parallel, so a trace's job keeps its speed
        self.planned_models = tuple(sorted(m for m in self.catalog.profiles if m not in taken))

    def is_planned(self, model: str) -> bool:
        """Whether `model` is one of the execution-plan profiles (and no data-parallel profile's name)."""
        return model in self.planned_models

    def models(self, gpu_type: str, gpus: int = 1) -> tuple[str, ...]:
        return self.base.models(gpu_type, gpus)

    def profiled_batches(self, model: str, gpu_type: str) -> tuple[int, ...]:
        return self.base.profiled_batches(model, gpu_type)

    def profile(self, model: str, gpu_type: str | None = None):
        """The data-parallel profile with a GPU type; the plan profile without one (the plan model's call)."""
        if gpu_type is None:
            return self.plans.profile(model)
        if self.is_planned(model):
            raise UnknownProfile(f"{model} has an execution-plan profile, not a data-parallel one", ())
        return self.base.profile(model, gpu_type)

    def iteration_time(self, model: str, gpu_type: str, placement: tuple[int, ...], per_gpu_batch: int,
                       accumulation: int = 1) -> float:
        if self.is_planned(model):
            return self.plans.iteration_time(model, gpu_type, placement, per_gpu_batch, accumulation)
        return self.base.iteration_time(model, gpu_type, placement, per_gpu_batch, accumulation)

    def plan_iteration_time(self, model: str, exec_config, placement: tuple[int, ...]) -> float:
        return self.plans.plan_iteration_time(model, exec_config, placement)

    def colocation(self, *args, **kwargs):
        return self.base.colocation(*args, **kwargs)

    def measured_pairs(self) -> Mapping:
        return self.base.measured_pairs()

    def load_time(self, model: str) -> float:
        return self.plans.load_time(model) if self.is_planned(model) else self.base.load_time(model)

    def pause_time(self, model: str) -> float:
        return self.plans.pause_time(model) if self.is_planned(model) else self.base.pause_time(model)

    def gpu_memory_mb(self, gpu_type: str) -> int:
        return self.base.gpu_memory_mb(gpu_type)
