"""Exit codes shared by the job SDK, the per-job supervisor and meshd.

A module without imports: the supervisor and every rank load it at start, where the wire protocol (msgpack,
dataclasses) would only add start-up time before a job trains.
"""

PREEMPTED_EXIT_CODE = 75  # a rank that checkpointed and exited on request: preempted, resumable (EX_TEMPFAIL)
