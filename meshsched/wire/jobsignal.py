"""sbatch's `--signal [B:]SIG[@SECONDS]` as `mesh submit` sends it and meshd keeps it: SIG to the job's ranks
SECONDS before its time limit, once per run.

Slurm: `--signal=[{R|B}:]<sig_num>[@sig_time]`, sig_time 0-65535 seconds, default 60; without B: the job steps get
it, with B: only the batch shell. A meshd job has no batch shell apart from its ranks (the script runs as every
rank): without B: every rank gets SIG, with B: rank 0 only (the rank that checkpoints). R: (reservations) has no
meaning here and is refused. Stdlib only: `mesh submit` loads it only for --signal.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

DEFAULT_SECONDS = 60  # Slurm's sig_time when @SECONDS is left out
MAX_SECONDS = 65535


@dataclass(frozen=True, slots=True)
class JobSignal:
    signum: int
    seconds: int  # before the time limit
    rank0_only: bool  # B:

    @property
    def text(self) -> str:
        """The canonical form: B:SIGUSR1@60."""
        return f"{'B:' if self.rank0_only else ''}{signal.Signals(self.signum).name}@{self.seconds}"


def parse_job_signal(text: str) -> JobSignal:
    """[B:]SIG[@SECONDS] -> JobSignal; ValueError with what is wrong (a line for the user)."""
    if not isinstance(text, str):
        raise ValueError("give [B:]SIG[@SECONDS], as in USR1@90")
    body = text.strip()
    prefix, colon, rest = body.partition(":")
    rank0 = False
    if colon:
        if prefix.upper() == "R":
            raise ValueError("R: (a reservation's end) has no meaning in meshd; give [B:]SIG[@SECONDS]")
        if prefix.upper() != "B":
            raise ValueError(f"{prefix[:8]!r}: the only prefix is B: (rank 0 only); give [B:]SIG[@SECONDS]")
        rank0, body = True, rest
    name, at, seconds_text = body.partition("@")
    seconds = DEFAULT_SECONDS
    if at:
        if not seconds_text.isdigit() or int(seconds_text) > MAX_SECONDS:
            raise ValueError(f"{seconds_text[:12]!r}: SECONDS must be a whole number from 0 to {MAX_SECONDS}")
        seconds = int(seconds_text)
    return JobSignal(_signum(name.strip()), seconds, rank0)


def _signum(name: str) -> int:
    upper = name.upper()
    try:
        sig = signal.Signals(int(upper)) if upper.isdigit() else signal.Signals[upper if upper.startswith("SIG")
                                                                                  else "SIG" + upper]
    except (KeyError, ValueError):
        raise ValueError(f"{name[:16]!r} is not a signal (give a name like USR1 or a number)") from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError(f"{sig.name} cannot be caught: a warning must be a signal the job can handle")
    return int(sig)
