"""`ClusterState`'s change log (state.py): every change bumps `version` and notes what moved, so caches that
follow the state (policies/occupancy.py, victim_rank.py) re-read only that: a job id, `NODES` (a node joined or
was lost: the live nodes and GPUs moved, no job by it), or None (anything may have changed)."""

from __future__ import annotations

NODES: str = object()  # type: ignore[assignment]  # the log's marker for a node joining or lost (not a job id)


class ChangeLog:
    """The log's methods; the class using it has `version` (int) and `changes` (a deque of (version, what))."""

    __slots__ = ()

    def touch(self, job_id: str | None = None) -> None:
        """Bump `version`, noting the job whose GPUs or progress changed (None: anything may have changed)."""
        self.version += 1
        self.changes.append((self.version, job_id))

    def touch_nodes(self) -> None:
        """Bump `version` for a node that joined or was lost (`changes_since` names it; `changed_since` cannot)."""
        self.version += 1
        self.changes.append((self.version, NODES))

    def changed_since(self, version: int) -> set[str] | None:
        """Jobs touched after `version` (for caches that follow the state); None when the change log cannot
        tell: a change not tied to one job (a node's included), `version` bumped by hand, or older than the log."""
        got = self.changes_since(version)
        return None if got is None or got[1] else got[0]

    def changes_since(self, version: int) -> tuple[set[str], bool] | None:
        """(jobs touched after `version`, whether a node joined or was lost since); None when the log cannot tell:
        a change tied to neither (`touch()`), `version` bumped by hand, or older than the log."""
        out: set[str] = set()
        nodes = False
        want = self.version
        for v, job_id in reversed(self.changes):
            if v <= version:
                break
            if v != want or job_id is None:
                return None
            if job_id is NODES:
                nodes = True
            else:
                out.add(job_id)
            want -= 1
        return (out, nodes) if want == version else None
