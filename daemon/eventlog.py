"""The mesh's event log: engine events as JSON entries, in the order the leader appended them.

Under the etcd coordinator every meshd runs the same engine over the same log (`log/{index}` records), so
every node holds the whole mesh's state and carries out the actions that touch its own GPUs. Nodes do not
append: they *propose* (`proposals/{node}/{seq}`) and the leader copies each proposal into the log, fenced by
its term. An `Entry` carries the event, the leader's wall time (the engine's `now` on every node), the node
that proposed it, the run (launch count) an exit or report belongs to, and, for a submit, the job record the
other nodes need to launch it.
"""

from __future__ import annotations

import hashlib
import json
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace

from meshsched import events as ev
from meshsched.state import Dependency, DependencyKind, ExecConfig, JobSpec, NodeSpec

# every event a node may propose, field by field; ModelFitted crosses too, its model through daemon/model_codec.py
# (`CARRIED`): one node fits (daemon/node.py), every node installs the same model
LOGGED = {cls.__name__: cls for cls in (
    ev.JobSubmitted, ev.JobStarted, ev.IterationReport, ev.JobPaused, ev.JobFinished, ev.JobFailed,
    ev.CancelRequested, ev.NodeJoined, ev.NodeLost, ev.Tick, ev.CheckpointSaved, ev.ReconfigureApplied,
    ev.RankReport, ev.TotalDeclared, ev.HoldRequested, ev.ReleaseRequested, ev.RequeueRequested,
    ev.GpuFault,  # a shared GPU's fault domain went down (daemon/faultwatch.py)
    ev.JobsForgotten,
    ev.DrainChanged,  # mesh drain / resume: a drain said on any node is in the log
)}


def _spec_out(spec: JobSpec) -> dict:
    out = asdict(spec)
    out["dependencies"] = [{"kind": d.kind.value, "job_id": d.job_id} for d in spec.dependencies]
    return out


def _spec_in(data: dict) -> JobSpec:
    deps = tuple(Dependency(DependencyKind(d["kind"]), str(d["job_id"])) for d in data.get("dependencies", ()))
    return JobSpec(**dict(data, dependencies=deps))


_NESTED = {JobSpec: _spec_in, NodeSpec: lambda d: NodeSpec(**d), ExecConfig: ExecConfig.from_dict}


class LogError(ValueError):
    """An entry or proposal that is not one this version of meshd wrote."""


def log_key(index: int) -> str:
    return f"log/{index:012d}"


def index_of(key: str) -> int:
    return int(key.rsplit("/", 1)[1])


CARRIED = {"ModelFitted": ev.ModelFitted}  # events with a model in them (`encode_fitted`, `decode_fitted`)


def encode_fitted(event: ev.ModelFitted) -> dict:
    """A ModelFitted whose model is plain data already (the fitting worker encoded it) or encodes now."""
    from meshsched.daemon.model_codec import ModelCodecError, encode_model, is_encoded

    try:
        model = event.model if is_encoded(event.model) else encode_model(event.model)
    except ModelCodecError as exc:
        raise LogError(f"ModelFitted cannot cross the mesh: {exc}") from None
    return {"type": "ModelFitted", "stimulus_id": event.stimulus_id, "model": model}


def decode_fitted(data: dict) -> ev.ModelFitted:
    """The ModelFitted every node dispatches, its model decoded (bit-identical on every node); LogError (one
    line: the entry is skipped and the policy keeps its previous model) for a model that does not decode."""
    from meshsched.daemon.model_codec import ModelCodecError, decode_model

    try:
        return ev.ModelFitted(str(data["stimulus_id"]), decode_model(data.get("model")))
    except ModelCodecError as exc:
        raise LogError(f"a fitted model refused ({exc}): the policy keeps its previous model") from None


def encode_event(event: ev.Event) -> dict:
    name = type(event).__name__
    if name in CARRIED:
        return encode_fitted(event)
    if name not in LOGGED:
        raise LogError(f"{name} cannot cross the mesh")
    out: dict = {"type": name}
    for f in fields(event):
        value = getattr(event, f.name)
        if isinstance(value, ExecConfig):
            value = value.to_dict()
        elif isinstance(value, JobSpec):
            value = _spec_out(value)
        elif is_dataclass(value):
            value = asdict(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def decode_event(data: dict) -> ev.Event:
    if data.get("type") in CARRIED:
        return decode_fitted(data)
    cls = LOGGED.get(data.get("type", ""))
    if cls is None:
        raise LogError(f"unknown event type {data.get('type')!r}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value, kind = data[f.name], hints[f.name]
        for nested, build in _NESTED.items():
            if value is not None and (kind is nested or nested in typing.get_args(kind)):
                value = build(value)
        if isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise LogError(f"bad {cls.__name__}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Entry:
    """One event as every node applies it."""

    event: ev.Event
    node: str  # who proposed it
    time: float = 0.0  # the leader's wall clock when it appended the entry: the engine's `now` everywhere
    run: int | None = None  # for an exit or report: the job's launch count when it happened (stale ones drop)
    record: dict | None = None  # for a submit: the job record (command, cwd, env) any node needs to launch it
    proposal: str = ""  # the proposal key it came from (a second copy after a failover is skipped)

    def to_json(self) -> str:
        return json.dumps({"e": encode_event(self.event), "n": self.node, "t": self.time, "r": self.run,
                           "rec": self.record, "p": self.proposal}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Entry:
        try:
            d = json.loads(text)
            return cls(decode_event(d["e"]), str(d["n"]), float(d.get("t", 0.0)), d.get("r"), d.get("rec"),
                       str(d.get("p", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LogError(f"unreadable log entry: {exc}") from None


# ---------------------------------------------------------------- snapshots (meshsched.snapshot beside the log)

SNAPSHOTS = "snapshots/"


def snapshot_key(index: int) -> str:
    return f"{SNAPSHOTS}{index:012d}"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The mesh's state after log entry `index`: the engine's (`meshsched.snapshot.encode`) and what meshd keeps
    beside it: the job records the log's submits carried, the newest proposal applied per node (a failover's
    second copies are skipped) and where each node's ranks are reached."""

    index: int
    engine: dict
    records: dict  # job -> the record payload its JobSubmitted entry carried (`mesh_node.record_payload`)
    last_seq: dict  # node -> newest proposal sequence applied
    addresses: dict  # node -> address
    submitted: dict = field(default_factory=dict)  # node -> highest job seq (`NODE.SEQ`) the log has submitted
    model: dict | None = None  # the engine's fitted model (daemon/model_codec.py), where it has one that encodes

    def to_json(self) -> str:
        out = {"i": self.index, "engine": self.engine, "rec": self.records, "seq": self.last_seq,
               "addr": self.addresses, "sub": self.submitted}
        if self.model is not None:
            out["model"] = self.model
        return json.dumps(out, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Snapshot:
        try:
            d = json.loads(text)
            if "broken" in d:  # join_snapshots: its parts do not make the snapshot its head names
                raise ValueError(d["broken"])
            snap = cls(int(d["i"]), d["engine"], d["rec"], d["seq"], d["addr"], d.get("sub", {}), d.get("model"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LogError(f"unreadable snapshot: {type(exc).__name__}: {exc}") from None
        if not all(isinstance(v, dict) for v in (snap.engine, snap.records, snap.last_seq, snap.addresses,
                                                 snap.submitted)):
            raise LogError("unreadable snapshot: a part of it is not a mapping")
        return snap


def with_model(snap: Snapshot, replica) -> Snapshot:
    """`snap` with the fitted model of `replica`'s engine (Lazer's GP), so a node that loads it installs the same
    model instead of asking for a fit only the leader runs; without one where there is none or it does not encode
    (that node's policy then asks for a fit again)."""
    model = getattr(getattr(getattr(replica, "ctx", None), "engine", None), "model", None)
    if model is None:
        return snap
    from meshsched.daemon.model_codec import ModelCodecError, encode_model

    try:
        return replace(snap, model=encode_model(model))
    except ModelCodecError:
        return snap


def install_model(snap: Snapshot, replica, refuse: typing.Callable[[str], None]) -> None:
    """After `snap` loaded into `replica`'s engine: its fitted model, decoded, is the engine's; one that does not
    decode is refused in one line through `refuse` (the snapshot stands; the policy asks for a fit again)."""
    engine = getattr(getattr(replica, "ctx", None), "engine", None)
    if snap.model is None or engine is None:
        return
    try:
        engine.model = decode_fitted({"stimulus_id": "snapshot", "model": snap.model}).model
    except LogError as exc:
        refuse(f"snapshot {snap.index}: {exc}")


def load_newest(items: dict[str, str], load: typing.Callable[[Snapshot], object],
                refuse: typing.Callable[[str], None]) -> tuple[Snapshot, object] | None:
    """The newest snapshot of `items` (key -> text) that `load` accepts, with what `load` returned; each one that
    does not decode (LogError, or a ValueError such as meshsched.snapshot.SnapshotError from `load`) is refused
    in one line through `refuse` and the next older one is tried. None: none loads (replay the whole log)."""
    for key in sorted(items, key=index_of, reverse=True):
        try:
            snap = Snapshot.from_json(items[key])
            if snap.index != index_of(key):
                raise LogError(f"it says index {snap.index}")
            return snap, load(snap)
        except ValueError as exc:
            refuse(f"snapshot {index_of(key)} refused: {exc}; trying an older one")
    return None


def compactable(log_keys: typing.Iterable[str], snapshot_keys: typing.Iterable[str]) -> tuple[list[str], list[str]]:
    """What compaction may delete once the newest snapshot is written: log entries at or below the previous
    snapshot's index (a node that cannot read the newest falls back to the previous one and replays from it),
    and every snapshot older than the previous one."""
    snaps = sorted(snapshot_keys, key=index_of)
    if len(snaps) < 2:
        return [], []
    keep_from = index_of(snaps[-2])
    return [k for k in log_keys if index_of(k) <= keep_from], snaps[:-2]


# A snapshot is written in parts (`snapshot-parts/{index}/{n}`), then a small head (`snapshots/{index}`) naming how
# many: etcd refuses a request over --max-request-bytes (1.5 MiB by default) and a snapshot of 10,000 jobs is 11 MB.
SNAPSHOT_PARTS = "snapshot-parts/"
PART_CHARS = 512 * 1024  # ASCII JSON: one part is 512 KiB, 683 KiB in base64, well under etcd's limit


def part_key(index: int, part: int) -> str:
    return f"{SNAPSHOT_PARTS}{index:012d}/{part:04d}"


def split_snapshot(snap: Snapshot) -> tuple[dict[str, str], str]:
    """The parts (key -> text) and the head to write after them."""
    text = snap.to_json()
    parts = {part_key(snap.index, n): text[at:at + PART_CHARS] for n, at in enumerate(range(0, len(text), PART_CHARS))}
    return parts, json.dumps({"parts": len(parts), "sha256": hashlib.sha256(text.encode()).hexdigest()})


def join_snapshots(heads: dict[str, str], parts: dict[str, str]) -> dict[str, str]:
    """`snapshots/{index}` -> the snapshot's text put together from its parts, for `load_newest` (a head that does
    not read, or parts missing or damaged, gives a text that does not decode: refused there in one line)."""
    out = {}
    for key, head in heads.items():
        try:
            d = json.loads(head)
            count, digest = int(d["parts"]), str(d["sha256"])
        except (KeyError, TypeError, ValueError):
            out[key] = head
            continue
        text = "".join(parts.get(part_key(index_of(key), n), "") for n in range(count))
        if hashlib.sha256(text.encode()).hexdigest() != digest:
            text = json.dumps({"broken": f"its {count} part(s) are missing or damaged (checksum)"})
        out[key] = text
    return out
