"""How fast a job runs: the iteration-time model (Castor eq. 1-3), measured colocation interference,
load/pause overheads and GPU memory; meshsched.loaders.profiles reads them from meshsched/profiles/."""

from meshsched.perf.errors import UnknownProfile
from meshsched.perf.model import DEFAULT_GPU_TYPE, PerfModel
from meshsched.perf.placement import ideal_placement

__all__ = ["DEFAULT_GPU_TYPE", "PerfModel", "UnknownProfile", "ideal_placement"]
