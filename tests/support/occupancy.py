"""What a Castor pass reads from its Occupancy arrays, keyed by job id, to compare a refreshed one with a fresh
build (tests/policies/test_occupancy.py, test_castor_latency.py)."""

from __future__ import annotations


def snapshot(occ, now):
    """Rows are an implementation detail: jobs by id, holders and hosts by job id."""
    state = occ.state
    jobs = {}
    ia = occ.remaining_iters(now)
    for job in state.jobs.values():
        r = occ.row(job.job_id)
        if r is not None:
            jobs[job.job_id] = (occ.left[r], occ.since[r], occ.rate[r], occ.solo[r], bool(occ.pausing[r]),
                                occ.groups[occ.gid[r]], ia[r])
    holders = [sorted(occ.jobs[r].job_id for r in occ.holders[g.index] if r >= 0) for g in state.gpus]
    hosts = [(h.job.job_id, h.gpus, h.nodes, occ.groups[gid], occ.type_names[c], n)
             for h, gid, c, n in zip(occ.hosts, occ.host_group, occ.host_code, occ.host_gpus)]
    assert [occ.jobs[r].job_id for r in occ.host_rows] == [h[0] for h in hosts]
    return jobs, holders, hosts, occ.free_times(now).tolist(), occ.solo_of.tolist(), occ.gpu_node.tolist()
