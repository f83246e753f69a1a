"""Room for a newcomer by preemption, as Lazer's orchestrator (Algorithm 2) needs it under a sharing placement.

`queue.room_by_eviction` counts each victim's GPUs as freed. Under a placement that shares GPUs (Castor, sjf-ffs)
a GPU holds up to two jobs: preempting one of them frees the GPU only if its partner goes too (a partner still
pausing, in the deferred-run queue or not longer than the newcomer never goes), and two chosen partners free
their one GPU once, not twice. Preempting a job that frees nothing the newcomer can use throws its load away
for nothing; `room_with_partners` counts a GPU free when every job on it is chosen. With one job per GPU it
chooses exactly what `room_by_eviction` chooses.
"""

from __future__ import annotations

from meshsched.state import Job


def room_with_partners(view, plan, pool: dict[str, int], need: int, prio: tuple, ranked: list, held: set[str]
                       ) -> tuple[list[tuple[str, int]] | None, list[Job]]:
    """Strictly lower-priority jobs of `ranked` (worst first), added until their freed GPUs and `pool` (the free
    GPUs per node) make a compact spot for `need`: (the spot, the jobs chosen), or (None, the jobs tried)."""
    gpus = view.cluster_state().gpus
    left: dict[int, int] = {}  # GPU -> jobs on it not chosen yet
    chosen: list[Job] = []
    single = need <= plan.node_size
    pooled = sum(pool.values())
    for vprio, v in ranked:
        if not vprio[0] > prio[0]:
            break  # only strictly lower-priority jobs are preempted
        if v.job_id in held:
            continue
        chosen.append(v)
        touched = False
        for g in v.gpus:
            n = left.get(g)
            if n is None:
                n = len(gpus[g].jobs)
            left[g] = n = n - 1
            if n == 0:  # the GPU's last job is chosen: it comes free
                node = gpus[g].node
                if (count := pool.get(node, 0) + 1) >= need:
                    touched = True
                pool[node] = count
                pooled += 1
        if (touched if single else pooled >= need) and (spot := plan.compact(pool, need)) is not None:
            return spot, chosen
    return None, chosen
