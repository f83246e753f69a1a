"""`/metrics` in the Prometheus text exposition format (version 0.0.4)."""

from __future__ import annotations

from collections import Counter


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(daemon) -> str:
    node = daemon.config.node_name
    states = Counter(r.state for r in daemon.records.values())
    running = sum(1 for j in daemon.engine.state.jobs.values() if j.state.holds_gpus)
    lines = [
        "# HELP meshd_queue_length Jobs waiting in the queue (PENDING or PREEMPTED).",
        "# TYPE meshd_queue_length gauge",
        f'meshd_queue_length{{node="{_esc(node)}"}} {daemon.engine.queue_length}',
        "# HELP meshd_running_jobs Jobs holding GPUs (LOADING, RUNNING or PAUSING).",
        "# TYPE meshd_running_jobs gauge",
        f'meshd_running_jobs{{node="{_esc(node)}"}} {running}',
        "# HELP meshd_jobs Jobs known to this daemon, by state.",
        "# TYPE meshd_jobs gauge",
    ]
    lines += [f'meshd_jobs{{state="{s}"}} {n}' for s, n in sorted(states.items())]
    lines += [
        "# HELP meshd_gpus_free GPUs holding no job.",
        "# TYPE meshd_gpus_free gauge",
        f'meshd_gpus_free{{node="{_esc(node)}"}} {daemon.engine.state.free_by_node.get(node, 0)}',
        "# HELP meshd_job_steps_per_second Last reported training throughput of a running job.",
        "# TYPE meshd_job_steps_per_second gauge",
    ]
    for job in daemon.engine.state.jobs.values():
        if job.state.holds_gpus and job.step_time > 0:
            labels = f'job="{_esc(job.job_id)}",name="{_esc(job.spec.name)}"'
            lines.append(f"meshd_job_steps_per_second{{{labels}}} {1.0 / job.step_time:.6g}")
    mesh = daemon.mesh
    lines += [
        "# HELP meshd_is_leader 1 while this daemon leads admission and preemption (always 1 on one server).",
        "# TYPE meshd_is_leader gauge",
        f'meshd_is_leader{{node="{_esc(node)}"}} {1 if mesh is None or mesh.term is not None else 0}',
        "# HELP meshd_leader_term The current leadership's term (0: not leading; 1 on one server).",
        "# TYPE meshd_leader_term gauge",
        f'meshd_leader_term{{node="{_esc(node)}"}} {1 if mesh is None else mesh.term or 0}',
        "# HELP meshd_leaderships_total Times this daemon became leader (each after the first is a failover).",
        "# TYPE meshd_leaderships_total counter",
        f'meshd_leaderships_total{{node="{_esc(node)}"}} {1 if mesh is None else mesh.leaderships}',
        "# HELP meshd_mesh_log_position Entries of the mesh's event log this daemon has applied.",
        "# TYPE meshd_mesh_log_position gauge",
        f'meshd_mesh_log_position{{node="{_esc(node)}"}} {0 if mesh is None else mesh.position}',
    ]
    return "\n".join(lines) + "\n"
