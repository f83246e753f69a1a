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
    return "\n".join(lines) + "\n"
