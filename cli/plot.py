"""PNG of a policy comparison: JCT CDFs and queue length over time (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from meshsched.sim.loop import SimResult
from meshsched.state import JobState


def plot_comparison(results: dict[str, SimResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_cdf, ax_q) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name, r in results.items():
        jct = np.sort(
            [
                (j.acct.finish_time - j.spec.submit_time) / 3600.0
                for j in r.engine.state.jobs.values()
                if j.state is JobState.COMPLETED
            ]
        )
        if jct.size:
            ax_cdf.plot(np.maximum(jct, 1e-3), np.arange(1, jct.size + 1) / jct.size, label=name)
        ax_q.step(np.asarray(r.queue_times) / 86400.0, r.queue_lengths, where="post", label=name, linewidth=0.8)
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("job completion time (hours, log scale)")
    ax_cdf.set_ylabel("fraction of jobs")
    ax_cdf.set_title("JCT CDF")
    ax_cdf.grid(alpha=0.3)
    ax_cdf.legend()
    ax_q.set_xlabel("time (days since first arrival)")
    ax_q.set_ylabel("jobs waiting")
    ax_q.set_title("queue length")
    ax_q.grid(alpha=0.3)
    ax_q.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
