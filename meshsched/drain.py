"""Drain and resume (Slurm's `scontrol update state=drain` / `resume`): GPUs taken out of service while their
jobs finish.

A `DrainChanged` event drains or resumes GPUs of one node (all of them when it names none). A drained GPU
never counts as free in the cluster state (`ClusterState.set_drained`), so no placement layer starts a job on
it, and the engine refuses any start or partner that would still use one (`refuses`). The jobs running there
finish as they would have. A resume runs a scheduling pass. The engine registers `Drains.on_changed` for the
event; meshd journals `records()` (one server) or carries the event in the mesh's log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from meshsched import events as ev
from meshsched.policies.base import Trigger
from meshsched.state import ClusterState, Job

DRAINING = "DRAINING"  # drained GPUs of the node still hold jobs
DRAINED = "DRAINED"  # they hold none: the node (those GPUs) can be serviced


@dataclass(frozen=True, slots=True)
class DrainRecord:
    """What is drained on one node: its local GPU indices, why, by whom and since when."""

    node: str
    gpus: tuple[int, ...]
    reason: str
    by: str
    since: float

    def to_dict(self) -> dict:
        return asdict(self) | {"gpus": list(self.gpus)}


class Drains:
    def __init__(self, state: ClusterState, log: Callable[[float, str, Job | None, str], None]) -> None:
        self.state = state
        self._log = log
        self.records: dict[str, DrainRecord] = {}  # node -> what is drained there

    def on_changed(self, e: ev.DrainChanged, now: float, actions: list) -> Trigger | None:
        state = self.state
        node = state.nodes.get(e.node)
        if node is None:
            self._log(now, e.stimulus_id, None, f"ignored DrainChanged: unknown node {e.node}")
            return None
        local = {state.gpus[g].local_index: g for g in node.gpus}
        named = set(e.gpus) & set(local) if e.gpus else set(local)
        old = self.records.get(e.node)
        have = set(old.gpus) if old else set()
        now_drained = have | named if e.drain else have - named
        if now_drained:
            since = e.since if e.since is not None else now
            keep = old is not None and not e.drain  # a partial resume keeps the drain's reason and time
            self.records[e.node] = DrainRecord(e.node, tuple(sorted(now_drained)), old.reason if keep else e.reason,
                                               old.by if keep else e.by, old.since if keep else since)
        else:
            self.records.pop(e.node, None)
        state.set_drained({local[i] for i in named}, e.drain)
        what = "" if not e.gpus else f" GPU(s) {','.join(map(str, sorted(named)))}"
        verb = "drained" if e.drain else "resumed"
        why = f": {e.reason}" if e.drain and e.reason else ""
        self._log(now, e.stimulus_id, None, f"node {e.node}{what} {verb}{why}" + (f" (by {e.by})" if e.by else ""))
        return None if e.drain else Trigger.RELEASE

    def refuses(self, gpus: tuple[int, ...], job: Job, now: float, stimulus: str) -> bool:
        """Whether a start (or a partner) on `gpus` would use a drained GPU: then it is not carried out."""
        drained = self.state.drained
        if not drained or drained.isdisjoint(gpus):
            return False
        node = self.state.gpus[next(g for g in gpus if g in drained)].node
        job.reason = f"waiting: node {node} drained"
        self._log(now, stimulus, job, f"ignored start on GPUs {','.join(map(str, gpus))}: node {node} is drained")
        return True

    def reason_or(self, job: Job, default: str) -> str:
        """The pending reason of a job that would fit on the free GPUs if the drained ones were free."""
        state = self.state
        if not state.drained:
            return default
        idle = [g for g in state.drained if not state.gpus[g].jobs]
        if idle and state.free_gpus < job.spec.gpus <= state.free_gpus + len(idle):
            return f"waiting: node {state.gpus[min(idle)].node} drained"
        return default

    def status(self, node: str) -> dict | None:
        """The node's drain as `mesh nodes` shows it: DRAINING (jobs still run there) or DRAINED, with its GPUs,
        reason, who and since when; None when nothing there is drained."""
        rec = self.records.get(node)
        if rec is None:
            return None
        state = self.state
        busy = any(state.gpus[g].jobs for g in state.nodes[node].gpus if state.gpus[g].local_index in rec.gpus)
        whole = len(rec.gpus) == state.nodes[node].size
        return rec.to_dict() | {"state": DRAINING if busy else DRAINED, "whole": whole}

    def all_status(self) -> list[dict]:
        return [s for s in (self.status(n) for n in sorted(self.records)) if s is not None]


def restore(records: list[dict], sid: Callable[[str], str]) -> list[ev.DrainChanged]:
    """Events that rebuild journaled drains (`Drains.records`, as `DrainRecord.to_dict` wrote them)."""
    return [ev.DrainChanged(sid("drain"), str(r["node"]), tuple(int(g) for g in r["gpus"]), True, str(r["reason"]),
                            str(r["by"]), float(r["since"])) for r in records]
