"""PerfModel: the read-only query surface over loaded profiles (iteration time, colocation, overheads, memory)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import lru_cache
from types import MappingProxyType

from meshsched.perf.errors import UnknownProfile
from meshsched.perf.itermodel import iter_time
from meshsched.perf.schema import ColocationPair, ModelProfile, Overhead

DEFAULT_GPU_TYPE = "v100"


class PerfModel:
    """How fast a job runs, per (model, GPU type). Build it with load_perf_model()."""

    def __init__(
        self,
        profiles: Iterable[ModelProfile],
        colocation: Iterable[tuple[str, ColocationPair]],
        overheads: Iterable[Overhead],
        gpu_memory_mb: dict[str, int],
    ) -> None:
        self._profiles: dict[tuple[str, str], ModelProfile] = {(p.model, p.gpu_type): p for p in profiles}
        self._models_by_gpu: dict[str, tuple[str, ...]] = {}
        for model, gpu in self._profiles:
            self._models_by_gpu[gpu] = tuple(sorted({*self._models_by_gpu.get(gpu, ()), model}))
        self._multi_by_gpu: dict[str, tuple[str, ...]] = {
            gpu: tuple(m for m in ms if self._profiles[(m, gpu)].params.multi_gpu)
            for gpu, ms in self._models_by_gpu.items()
        }
        self._pairs: dict[tuple[str, str, int, str, int], tuple[float, float] | None] = {
            (gpu, c.model_a, c.batch_a, c.model_b, c.batch_b): c.xi for gpu, c in colocation
        }
        self._overheads: dict[str, Overhead] = {o.model: o for o in overheads}
        self._memory = dict(gpu_memory_mb)
        self.gpu_types: tuple[str, ...] = tuple(sorted(self._models_by_gpu))
        self._cached_iteration_time = lru_cache(maxsize=1 << 17)(self._iteration_time)

    # -- lookups -------------------------------------------------------------------------------------------
    def _check_gpu(self, gpu_type: str) -> None:
        if gpu_type not in self._models_by_gpu:
            raise UnknownProfile(f"unknown GPU type {gpu_type!r}", self.gpu_types)

    def _profile(self, model: str, gpu_type: str) -> ModelProfile:
        prof = self._profiles.get((model, gpu_type))
        if prof is None:
            self._check_gpu(gpu_type)
            raise UnknownProfile(f"no profile for model {model!r} on {gpu_type}", self._models_by_gpu[gpu_type])
        return prof

    def models(self, gpu_type: str, gpus: int = 1) -> tuple[str, ...]:
        """Model families usable at this GPU count (multi-GPU only where a multi-GPU fit exists), sorted."""
        self._check_gpu(gpu_type)
        return self._models_by_gpu[gpu_type] if gpus <= 1 else self._multi_by_gpu[gpu_type]

    def profiled_batches(self, model: str, gpu_type: str) -> tuple[int, ...]:
        return self._profile(model, gpu_type).profiled_batches

    def profile(self, model: str, gpu_type: str) -> ModelProfile:
        """The fitted profile itself (parameters and fit quality)."""
        return self._profile(model, gpu_type)

    # -- iteration time ------------------------------------------------------------------------------------
    def iteration_time(
        self, model: str, gpu_type: str, placement: tuple[int, ...], per_gpu_batch: int, accumulation: int = 1
    ) -> float:
        """Seconds per optimizer step (Castor eq. 3); placement = GPUs used on each node."""
        return self._cached_iteration_time(model, gpu_type, tuple(placement), per_gpu_batch, accumulation)

    def _iteration_time(
        self, model: str, gpu_type: str, placement: tuple[int, ...], per_gpu_batch: int, accumulation: int
    ) -> float:
        prof = self._profile(model, gpu_type)
        if not placement or min(placement) < 0 or sum(placement) < 1:
            raise ValueError(f"placement must list GPUs per node with a sum >= 1, got {placement}")
        if per_gpu_batch < 1 or accumulation < 1:
            raise ValueError(f"need per_gpu_batch >= 1 and accumulation >= 1, got {per_gpu_batch}, {accumulation}")
        gpus = sum(placement)
        if gpus > 1 and not prof.params.multi_gpu:
            raise UnknownProfile(
                f"model {model!r} on {gpu_type} was measured on one GPU only, not {gpus}",
                self._multi_by_gpu[gpu_type],
            )
        nodes = sum(1 for g in placement if g > 0)
        t = iter_time(prof.params, gpus, nodes, per_gpu_batch, accumulation)
        if not (t > 0.0 and math.isfinite(t)):  # guards against a corrupt profile file
            raise ValueError(f"non-positive iteration time {t} for {model} on {gpu_type} {placement}")
        return t

    # -- colocation, overheads, memory ---------------------------------------------------------------------
    def colocation(
        self, model_a: str, batch_a: int, model_b: str, batch_b: int, gpu_type: str
    ) -> tuple[float, float] | None:
        """(xi_a, xi_b) = isolated / colocated throughput as measured; None if not measured or infeasible."""
        self._profile(model_a, gpu_type)
        self._profile(model_b, gpu_type)
        return self._pairs.get((gpu_type, model_a, batch_a, model_b, batch_b))

    def measured_pairs(self) -> Mapping[tuple[str, str, int, str, int], tuple[float, float] | None]:
        """The measured colocation table, read-only: (gpu, model_a, batch_a, model_b, batch_b) -> (xi_a, xi_b),
        None for a pair measured infeasible."""
        return MappingProxyType(self._pairs)

    def _overhead(self, model: str) -> Overhead:
        o = self._overheads.get(model)
        if o is None:
            raise UnknownProfile(f"no load/pause time for model {model!r}", self._overheads)
        return o

    def load_time(self, model: str) -> float:
        """Lazer's l: seconds to start (or resume from a checkpoint) before training proceeds."""
        return self._overhead(model).load_s

    def pause_time(self, model: str) -> float:
        """Lazer's p: seconds to pause and save a checkpoint."""
        return self._overhead(model).pause_s

    def gpu_memory_mb(self, gpu_type: str) -> int:
        mem = self._memory.get(gpu_type)
        if mem is None:
            raise UnknownProfile(f"unknown GPU type {gpu_type!r}", self._memory)
        return mem
