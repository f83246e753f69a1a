"""What crosses a process boundary: job-socket frames and API bodies (protocol), exit codes, the job table's columns.

Nothing here is imported by the core; the package itself imports nothing, so `exitcodes` stays cheap to load."""
