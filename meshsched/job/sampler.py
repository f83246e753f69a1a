"""The elastic sampler: a global stream of sample positions split across ranks by per-rank local batches.

Sample position p (counted from the start of training) belongs to epoch p // N and is sample
perm(epoch)[p % N], where perm(epoch) is a seeded permutation of the N samples. A step consumes the next
`global_batch` positions; rank r takes the contiguous slice of length local_batches[r] after the slices of
ranks 0..r-1. Whatever the local batches are, and however often they change between steps, the
positions consumed are consecutive, so within an epoch every sample is seen exactly once (Gimbal's LISS
rebalancing cannot repeat or skip one). The state is one integer, `position`, checkpointed with the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported when a permutation is first drawn: `import meshsched.job` stays light
    import numpy as np


def even_split(total: int, parts: int) -> list[int]:
    """`total` split into `parts` integers that differ by at most one (larger ones first)."""
    q, r = divmod(total, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


@dataclass(slots=True)
class ElasticSampler:
    """Per-rank sample indices for each step; `advance()` after the step, `state_dict()` to checkpoint."""

    dataset_size: int
    global_batch: int
    world_size: int = 1
    seed: int = 0
    shuffle: bool = True
    position: int = 0
    local_batches: list[int] = field(default_factory=list)
    _perm: tuple[int, np.ndarray] | None = None

    def __post_init__(self) -> None:
        if self.dataset_size < 1 or self.global_batch < 1 or self.world_size < 1:
            raise ValueError("dataset_size, global_batch and world_size must be >= 1")
        if not self.local_batches:
            self.local_batches = even_split(self.global_batch, self.world_size)
        self.set_local_batches(self.local_batches)

    @property
    def epoch(self) -> int:
        return self.position // self.dataset_size

    def set_local_batches(self, batches: list[int]) -> None:
        """Rebalance (Gimbal's LISS): takes effect from the next call of `indices`; the global batch is kept."""
        batches = [int(b) for b in batches]
        if len(batches) != self.world_size or sum(batches) != self.global_batch or min(batches) < 1:
            raise ValueError(f"local batches {batches} must be {self.world_size} values >= 1 summing to "
                             f"the global batch {self.global_batch}")
        self.local_batches = batches

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            import numpy as np

            if self.shuffle:
                perm = np.random.default_rng([self.seed, epoch]).permutation(self.dataset_size)
            else:
                perm = np.arange(self.dataset_size)
            self._perm = (epoch, perm)
        return self._perm[1]

    def positions(self, rank: int) -> range:
        """The global sample positions `rank` consumes in the current step."""
        start = self.position + sum(self.local_batches[:rank])
        return range(start, start + self.local_batches[rank])

    def indices(self, rank: int) -> list[int]:
        """Dataset indices for `rank` in the current step (may straddle an epoch boundary)."""
        pos = self.positions(rank)
        out: list[int] = []
        p = pos.start
        while p < pos.stop:  # one slice per epoch touched (two at most when the step straddles a boundary)
            e, i = divmod(p, self.dataset_size)
            n = min(pos.stop - p, self.dataset_size - i)
            out.extend(self._permutation(e)[i : i + n].tolist())
            p += n
        return out

    def advance(self) -> None:
        self.position += self.global_batch

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed, "dataset_size": self.dataset_size,
                "global_batch": self.global_batch, "local_batches": list(self.local_batches)}

    def load_state_dict(self, state: dict) -> None:
        if state["dataset_size"] != self.dataset_size or state["seed"] != self.seed:
            raise ValueError("checkpointed sampler describes another dataset or seed")
        self.position = int(state["position"])
        if state["global_batch"] == self.global_batch and len(state["local_batches"]) == self.world_size:
            self.local_batches = list(state["local_batches"])
