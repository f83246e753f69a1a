"""meshd's Slurm-style job control requests: arrays, dependencies, time limits, hold/release/requeue, --wait,
output files.

What the engine decides (who is queued, blocked, timed out) is engine state (`meshsched.jobcontrol`); this module
owns the daemon's half: parsing and checking the request fields, resolving dependency ids (an array id means every
task of it), hold/release/requeue and bulk selection, the long-poll behind `mesh submit --wait`, and the
output-file patterns (%j %A %a %u %x %%). A submit, array or not, is `daemon.submission`'s.

Array tasks are separate jobs named `ARRAY_TASK` (Slurm's JOBID_TASK): `mesh submit --array 0-2` gets array id
12 and jobs 12_0, 12_1, 12_2. Anywhere a job id is taken (ls, show, cancel, hold, release, requeue, wait,
--dependency) the array id stands for all of its tasks.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from meshsched import events as ev
from meshsched.daemon.engine_loop import EngineLoop
from meshsched.daemon.journal import TERMINAL, JobRecord, Journal
from meshsched.daemon.launcher import Launcher
from meshsched.daemon.mirror import job_spec
from meshsched.engine import Engine
from meshsched.state import DependencyKind, JobSpec, JobState
from meshsched.wire.protocol import RequestError

MAX_ARRAY_TASKS = 10_000  # tasks in one array (Slurm's MaxArraySize is 1001 by default)
MAX_PATTERN = 4096
CONTROL_FIELDS = ("array", "dependency", "time_limit", "hold", "output", "error", "begin", "signal")
PATTERN_HELP = "%j job id, %A array id, %a task id, %u user, %x job name, %% a percent sign"


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """The job-control fields of POST /v1/jobs (besides SubmitRequest's): all optional."""

    tasks: tuple[int, ...] = ()  # array task ids (empty: not an array)
    array_limit: int = 0  # at most this many tasks queued or running at once (0: no limit)
    dependency: tuple[tuple[DependencyKind, str], ...] = ()
    time_limit: float | None = None  # seconds per run
    hold: bool = False
    output: str = ""  # file patterns; "" keeps only the per-rank logs in the job directory
    error: str = ""
    begin: float | None = None  # UNIX time before which it is not queued
    signal: str = ""  # --signal [B:]SIG[@SECONDS], canonical (B:SIGUSR1@60); "": none

    @classmethod
    def split(cls, data: Any) -> tuple[ControlRequest, Any]:
        """(the job-control fields, the rest of the body for SubmitRequest)."""
        if not isinstance(data, dict) or not any(k in data for k in CONTROL_FIELDS):
            return PLAIN, data
        rest = {k: v for k, v in data.items() if k not in CONTROL_FIELDS}
        tasks, limit = parse_array(_str(data, "array")) if data.get("array") else ((), 0)
        limit_s = data.get("time_limit")
        if limit_s is not None and (isinstance(limit_s, bool) or not isinstance(limit_s, (int, float))
                                    or not math.isfinite(limit_s) or limit_s <= 0):
            raise RequestError(f"time_limit must be a number of seconds > 0, got {limit_s!r}")
        hold = data.get("hold", False)
        if not isinstance(hold, bool):
            raise RequestError("hold must be true or false")
        output, error = (_pattern(data, k) for k in ("output", "error"))
        deps = parse_dependency(_str(data, "dependency")) if data.get("dependency") else ()
        begin = data.get("begin")
        if begin is not None and (isinstance(begin, bool) or not isinstance(begin, (int, float))
                                  or not math.isfinite(begin)):
            raise RequestError(f"begin must be a finite UNIX time in seconds, got {begin!r}")
        return cls(tasks, limit, deps, None if limit_s is None else float(limit_s), hold, output, error,
                   None if begin is None else float(begin), _job_signal(data.get("signal"))), rest


PLAIN = ControlRequest()


def _job_signal(value: Any) -> str:
    """The canonical --signal of a request's `signal` ("" for none); RequestError for a bad one."""
    if value is None or value == "":
        return ""
    from meshsched.wire.jobsignal import parse_job_signal

    try:
        return parse_job_signal(value).text
    except ValueError as exc:
        raise RequestError(f"signal: {exc}") from None


@cache
def known_models() -> tuple[str, ...]:
    """The models `--model` may name: custom (no profile: the scheduler's fallback estimate), every profiled one
    (the simulator's: meshsched/profiles' iteration fits) and every execution-plan profile (plans_<gpu>.json)."""
    from importlib.resources import files

    from meshsched.loaders.profiles import load_perf_model, load_plan_catalog

    perf = load_perf_model()
    names = {"custom"} | {m for t in perf.gpu_types for m in perf.models(t)}
    for entry in files("meshsched.profiles").iterdir():
        if entry.name.startswith("plans_") and entry.name.endswith(".json"):
            names |= set(load_plan_catalog(entry.name[len("plans_"):-len(".json")]).profiles)
    return tuple(sorted(names))


def check_model(model: str) -> None:
    """RequestError (answered 400, nothing queued) for a model no profile knows, as the simulator refuses it."""
    if model not in known_models():
        raise RequestError(f"--model {model[:64]!r}: not a known model; give custom (the default) or one of "
                           f"{', '.join(m for m in known_models() if m != 'custom')}")


def _str(data: dict, key: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise RequestError(f"{key} must be a string")
    return value


def _pattern(data: dict, key: str) -> str:
    text = _str(data, key)
    if len(text) > MAX_PATTERN or "\0" in text or not text.isprintable():
        raise RequestError(f"{key} must be a printable path pattern of at most {MAX_PATTERN} characters")
    expand_pattern(text, job_id="1", array_id="", task=None, user="u", name="n")  # checks the % codes
    return text


def parse_array(text: str) -> tuple[tuple[int, ...], int]:
    """Slurm's --array: `0-299`, `1,3,5-7`, `0-15:4` (a step), with `%N` (at most N at once); -> (tasks, N)."""
    spec, pct, limit_text = text.strip().partition("%")
    limit = 0
    if pct:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise RequestError(f"--array {text!r}: %N needs a whole number N >= 1 after the %")
        limit = int(limit_text)
    tasks: set[int] = set()
    for part in spec.split(","):
        rng, colon, step_text = part.strip().partition(":")
        first, dash, last = rng.partition("-")
        try:
            lo = int(first)
            hi = int(last) if dash else lo
            step = int(step_text) if colon else 1
        except ValueError:
            raise RequestError(f"--array {text!r}: give task ids like 0-299, 1,3,5-7, 0-15:4 or 0-99%8") from None
        if lo < 0 or hi < lo or step < 1:
            raise RequestError(f"--array {text!r}: {part.strip()!r} is not an ascending range of ids >= 0")
        if (hi - lo) // step + 1 + len(tasks) > MAX_ARRAY_TASKS:
            raise RequestError(f"--array {text!r}: more than {MAX_ARRAY_TASKS} tasks in one array")
        tasks.update(range(lo, hi + 1, step))
    return tuple(sorted(tasks)), limit


def parse_dependency(text: str) -> tuple[tuple[DependencyKind, str], ...]:
    """`afterok:12[:13],afterany:14_2,afternotok:15`: every one must be met (Slurm's `,`)."""
    out = []
    for part in text.split(","):
        kind_text, _, ids = part.strip().partition(":")
        try:
            kind = DependencyKind(kind_text)
        except ValueError:
            kinds = ", ".join(k.value for k in DependencyKind)
            raise RequestError(f"--dependency {text!r}: {kind_text!r} is not one of {kinds} (as in afterok:12)") from None
        job_ids = [i for i in ids.split(":") if i]
        if kind is DependencyKind.SINGLETON:  # Slurm's: the user's other jobs of this name, no ids
            if job_ids:
                raise RequestError(f"--dependency {text!r}: singleton takes no job ids")
            out.append((kind, ""))
            continue
        if not job_ids:
            raise RequestError(f"--dependency {text!r}: {kind_text} needs job ids, as in {kind_text}:12")
        out += [(kind, i) for i in job_ids]
    return tuple(out)


def expand_pattern(pattern: str, *, job_id: str, array_id: str, task: int | None, user: str, name: str) -> str:
    """Slurm's filename patterns: %j job id, %A array id (the job id outside an array), %a task id, %u, %x."""
    codes = {"j": job_id, "A": array_id or job_id, "a": "" if task is None else str(task), "u": user, "x": name,
             "%": "%"}
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "%":
            code = pattern[i + 1 : i + 2]
            if code not in codes:
                raise RequestError(f"output pattern {pattern!r}: %{code} is not known ({PATTERN_HELP})")
            out.append(codes[code])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


@dataclass(frozen=True, slots=True)
class ControlContext:
    """What JobControl uses of its node."""

    records: dict[str, JobRecord]
    engine: Engine
    journal: Journal
    launcher: Launcher  # signals a job's ranks
    loop: EngineLoop  # input, sid


class JobControl:
    """The daemon's job-control requests (`NodeDaemon.control`)."""

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self._ended: dict[str, asyncio.Event] = {}  # job -> set when it reaches a terminal state (--wait)

    # ---------------------------------------------------------------- lookup

    def targets(self, job_id: str) -> list:
        """The records a job id names: the job, or every task of the array with that id ([] when neither)."""
        recs = self.ctx.records
        rec = recs.get(job_id)
        if rec is not None:
            return [rec]
        return [r for r in recs.values() if r.array_id == job_id]

    def resolve(self, deps: tuple[tuple[DependencyKind, str], ...]) -> list[list[str]]:
        """Dependency ids as job ids (an array id: each task); a job that ended before meshd restarted (not
        in the engine) is dropped when it satisfies the dependency, kept when it never will (the engine then
        cancels the dependent as DependencyNeverSatisfied). Unknown ids raise RequestError."""
        engine_jobs = self.ctx.engine.state.jobs
        out = []
        for kind, job_id in deps:
            if kind is DependencyKind.SINGLETON:
                out.append([kind.value, ""])
                continue
            recs = self.targets(job_id)
            if not recs:
                raise RequestError(f"--dependency {kind.value}:{job_id}: no job or array {job_id[:64]}")
            for r in recs:
                if r.job_id not in engine_jobs and r.state in TERMINAL and kind.met_by(JobState(r.state)):
                    continue
                out.append([kind.value, r.job_id])
        return out

    # ---------------------------------------------------------------- hold / release / requeue

    def hold(self, job_id: str) -> list[str]:
        return self._apply(job_id, "hold", ev.HoldRequested, lambda r: r.state in ("PENDING", "PREEMPTED") and
                           not r.held, "only a queued job that is not held already can be held")

    def release(self, job_id: str) -> list[str]:
        return self._apply(job_id, "release", ev.ReleaseRequested, lambda r: r.held and r.state not in TERMINAL,
                           "only a held job that has not ended can be released")

    def requeue(self, job_id: str) -> list[str]:
        return self._apply(job_id, "requeue", ev.RequeueRequested,
                           lambda r: r.state in ("LOADING", "RUNNING") and not r.cancelling,
                           "requeue takes a running job (a queued one is queued already; an ended one: submit again)")

    def _apply(self, job_id: str, what: str, event, applies, why: str) -> list[str]:
        """Send `event` for every job `job_id` names that `applies` to; LookupError / ValueError otherwise."""
        recs = self.targets(job_id)
        if not recs:
            raise LookupError(f"unknown job {job_id[:64]}")
        todo = [r for r in recs if applies(r)]
        if not todo:
            states = sorted({"HELD" if r.held and r.state not in TERMINAL else r.state for r in recs})
            raise ValueError(f"cannot {what} {job_id}: it is {'/'.join(states)}; {why}")
        loop = self.ctx.loop
        with self.ctx.journal.batch():
            for r in todo:
                loop.input(event(loop.sid(what), r.job_id))
        return [r.job_id for r in todo]

    # ---------------------------------------------------------------- many jobs per call

    def select(self, query: Any, who) -> list:
        """The unfinished jobs a bulk cancel names: ids (an array id: its tasks) and filters, all of which must
        hold; a user who is not an operator selects among their own jobs only. RequestError when malformed."""
        if not isinstance(query, dict):
            raise RequestError("body must be a JSON object")
        unknown = set(query) - {"job_ids", "state", "name", "user", "mine", "signal"}
        if unknown:
            raise RequestError(f"unknown field(s): {', '.join(sorted(unknown))}")
        ids = query.get("job_ids") or []
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise RequestError("job_ids must be a list of strings")
        states = {s.strip().upper() for s in _str(query, "state").split(",") if s.strip()}
        bad = states - {s.value for s in JobState if not s.is_terminal}
        if bad:
            known = ", ".join(s.value for s in JobState if not s.is_terminal)
            raise RequestError(f"--state {','.join(sorted(bad))}: not a state a job can be cancelled in ({known})")
        name, user = _str(query, "name"), _str(query, "user")
        if query.get("mine"):
            user = who.name
        if not (ids or states or name or user):
            raise RequestError("name jobs: ids, or a filter (--state, --name, --user, --me)")
        if user and user != who.name and not who.operator:  # said, not answered with "no job matched"
            raise LookupError(f"--user {user[:64]}: their jobs are not yours to cancel (only an operator may)")
        if ids:
            recs = []
            for job_id in ids:
                found = self.targets(job_id)
                if not found:
                    raise LookupError(f"unknown job {job_id[:64]}")
                recs += found
        else:
            recs = list(self.ctx.records.values())
        return [r for r in recs if r.state not in TERMINAL and (not states or r.state in states)
                and (not name or r.name == name) and (not user or r.user == user)
                and (who.operator or r.uid == who.uid)]

    def signal(self, recs: list, signum: int) -> list[dict]:
        """Send `signum` to the ranks of each running job (the others are left alone)."""
        launcher = self.ctx.launcher
        return [{"job_id": r.job_id, "state": r.state, "signalled": launcher.signal_workers(r.job_id, signum)}
                for r in recs]

    # ---------------------------------------------------------------- records and --wait

    def ended(self, rec, job, old: str) -> None:
        """A job's record was mirrored from the engine (`EngineLoop`): wake the waiters of a job that ended."""
        if rec.state in TERMINAL and old not in TERMINAL:
            waiter = self._ended.pop(rec.job_id, None)
            if waiter is not None:
                waiter.set()

    async def wait(self, recs: list, timeout: float) -> bool:
        """Wait until every record has ended or `timeout` passed; True if they all ended."""
        pending = [self._ended.setdefault(r.job_id, asyncio.Event()) for r in recs if r.state not in TERMINAL]
        if not pending:
            return True
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in pending)), timeout)
        except TimeoutError:
            return False
        return True

    def recovered(self, rec) -> tuple[JobSpec, bool]:
        """The spec a journaled queued job is restored with (dependencies on jobs that ended before the restart
        resolved, see `resolve`) and whether it is held."""
        spec = job_spec(rec)
        if spec.dependencies:
            jobs = self.ctx.engine.state.jobs
            keep = []
            for d in spec.dependencies:
                target = self.ctx.records.get(d.job_id)
                if d.job_id not in jobs and target is not None and target.state in TERMINAL and \
                        d.kind.met_by(JobState(target.state)):
                    continue
                keep.append(d)
            spec = replace(spec, dependencies=tuple(keep))
        return spec, rec.held
