"""A hand-checkable performance model for engine, policy and simulator tests."""

from __future__ import annotations

from meshsched.perf import UnknownProfile


class LinearPerf:
    """Step time = per_gpu_batch * 0.01 s, +10% per extra node; load 10 s, pause 5 s; pairs slow both by 1.5x."""

    gpu_types = ("fake",)

    def __init__(self, load: float = 10.0, pause: float = 5.0) -> None:
        self.load, self.pause = load, pause

    def models(self, gpu_type: str, gpus: int = 1) -> tuple[str, ...]:
        return ("m",)

    def profiled_batches(self, model: str, gpu_type: str) -> tuple[int, ...]:
        return (100,)

    def iteration_time(self, model, gpu_type, placement, per_gpu_batch, accumulation=1) -> float:
        if model != "m":
            raise UnknownProfile(f"unknown model {model!r}")
        return per_gpu_batch * 0.01 * (1.0 + 0.1 * (len(placement) - 1))

    def colocation(self, model_a, batch_a, model_b, batch_b, gpu_type):
        return (1.5, 1.5)

    def load_time(self, model: str) -> float:
        return self.load

    def pause_time(self, model: str) -> float:
        return self.pause

    def gpu_memory_mb(self, gpu_type: str) -> int:
        return 16384


def launch(job_id, gpus, resume_from=0.0, restart=0, per_gpu_batch=100):
    """The Launch the engine sends for a job of the harnesses (global batch 100 per GPU, default ExecConfig)."""
    from meshsched.actions import Launch
    from meshsched.state import ExecConfig

    return Launch(job_id, gpus, resume_from, restart, ExecConfig(per_gpu_batch))
