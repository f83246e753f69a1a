"""Lazer's model fits cross the mesh (issue 25, point 4): a fitted model as plain data (daemon/model_codec.py), a
ModelFitted log entry carrying it (daemon/eventlog.py), and one node, the leader, fitting for the whole mesh
(daemon/node.py `_fit`)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import tempfile
import time
import zlib
from pathlib import Path

import pytest
from meshsched.daemon.config import CoordinatorConfig
from meshsched.daemon.coordinator import LocalCoordinator
from meshsched.daemon.eventlog import Entry, LogError, log_key
from meshsched.daemon.mesh import LinkContext, MeshLink
from meshsched.daemon.model_codec import ModelCodecError, decode_model, encode_model

from meshsched import events as ev
from meshsched.actions import FitModel
from meshsched.policies.lazer_opt import (
    DeferralContext,
    DeferralOptimizer,
    FitRequest,
    Observation,
    OptimizerConfig,
    OptimizerState,
    fit_model,
)

CONTEXTS = [DeferralContext(a, r, load, p) for a in (1.0, 900.0) for r in (10.0, 600.0, 1e5)
            for load in (0.0, 300.0) for p in (0.0, 60.0)]


def _request(n: int = 12, seed: int = 1) -> FitRequest:
    obs = tuple(Observation(DeferralContext(30.0 + i, 600.0 * (i + 1), 120.0, 8.0), 10.0 * i, abs(10.0 * i - 40.0))
                for i in range(n))
    return FitRequest(OptimizerConfig(seed=seed), obs)


def _same_decisions(a, b) -> bool:
    """Every suggestion, its EI included, equal (==) on a grid of contexts; and an optimiser with each installed
    decides the same."""
    if not all(a.best_ei(c) == b.best_ei(c) and a.mean_argmin(c) == b.mean_argmin(c) for c in CONTEXTS):
        return False
    request = _request()
    opts = []
    for model in (a, b):
        opt = DeferralOptimizer.restore(request.config, OptimizerState(request.observations, 12, 10, False), fit=False)
        assert opt.install(model)
        opts.append(opt)
    return all(opts[0].decide(c) == opts[1].decide(c) for c in CONTEXTS)


def test_a_fitted_model_round_trips_to_identical_decisions():
    model = fit_model(_request())
    data = encode_model(model)
    text = json.dumps(data)  # plain data: JSON, no pickle
    back = decode_model(json.loads(text))
    assert type(back) is type(model) and back is not model
    assert _same_decisions(model, back)
    assert encode_model(back) == data  # the leader's re-encoding (it decodes each proposal) changes nothing


def test_a_model_crosses_the_log_in_a_modelfitted_entry():
    model = fit_model(_request())
    entry = Entry(ev.ModelFitted("fitted-n1-1", model), "n1", 3.0, proposal="n1/0001")
    back = Entry.from_json(entry.to_json())
    assert type(back.event) is ev.ModelFitted and back.event.stimulus_id == "fitted-n1-1"
    assert _same_decisions(model, back.event.model)
    encoded = Entry(ev.ModelFitted("s", encode_model(model)), "n1").to_json()  # as the fitting worker sends it
    assert encoded == Entry(ev.ModelFitted("s", model), "n1").to_json()
    with pytest.raises(LogError, match="cannot cross the mesh"):
        Entry(ev.ModelFitted("s", object()), "n1").to_json()


def _corrupt(data: dict, how: str) -> dict:
    data = json.loads(json.dumps(data))
    fields = data["model"]["fields"]["model"]["fields"]
    if how == "bitflip":  # a flipped bit in the Cholesky factor
        raw = bytearray(zlib.decompress(base64.b64decode(fields["chol"]["zb64"])))
        raw[5] ^= 0x10
        fields["chol"]["zb64"] = base64.b64encode(zlib.compress(bytes(raw))).decode()
        return data
    if how == "class":
        data["model"]["fields"]["model"]["dc"] = "Popen"
    elif how == "field":
        del fields["alpha"]
    elif how == "shape":
        fields["alpha"]["shape"] = [3]
    from meshsched.daemon.model_codec import (
        _digest,  # a consistent checksum: what the codec itself refuses
    )

    data["sha256"] = _digest(data["model"])
    return data


@pytest.mark.parametrize("how, message", [("bitflip", "checksum"), ("class", "not a model class"),
                                          ("field", "has fields"), ("shape", "holds")])
def test_a_corrupt_model_is_refused(how, message):
    data = encode_model(fit_model(_request()))
    bad = _corrupt(data, how)
    with pytest.raises(ModelCodecError, match=message):
        decode_model(bad)
    with pytest.raises(LogError, match="refused.*keeps its previous model"):
        Entry.from_json(json.dumps({"e": {"type": "ModelFitted", "stimulus_id": "s", "model": bad}, "n": "n1"}))


class _Replica:
    def __init__(self) -> None:
        self.applied: list[ev.Event] = []
        self.outbox_path = None

    def apply_entry(self, entry, index: int, act: bool) -> None:
        self.applied.append(entry.event)

    def synced(self) -> None:
        pass

    def leadership_changed(self, leader) -> None:
        pass


def test_a_model_that_does_not_decode_is_one_log_line_and_the_previous_model_stays(caplog):
    """In the log: a good fit, then a damaged one: the node applies the first, refuses the second in one line
    (the engine never sees it: the policy keeps the first model), and goes on with the next entry."""
    good, newer = fit_model(_request(12)), encode_model(fit_model(_request(14)))
    entries = {log_key(1): Entry(ev.ModelFitted("f1", good), "n1", proposal="n1/1").to_json(),
               log_key(2): Entry(ev.ModelFitted("f2", _corrupt(newer, "bitflip")), "n1", proposal="n1/2").to_json(),
               log_key(3): Entry(ev.Tick("t", 1), "n1", proposal="n1/3").to_json()}
    replica = _Replica()
    link = MeshLink(LinkContext("n1", "n1", (), 0, dict, {}), replica, LocalCoordinator("n1", initial=entries),
                    CoordinatorConfig(), node_grace=60.0)

    async def run() -> None:
        link.start()
        try:
            deadline = time.monotonic() + 10
            while link.position < 3:
                assert time.monotonic() < deadline, link.view()
                await asyncio.sleep(0.01)
        finally:
            await link.close()

    with caplog.at_level(logging.WARNING, logger="meshd"):
        asyncio.run(run())
    assert [type(e).__name__ for e in replica.applied] == ["ModelFitted", "Tick"]
    assert _same_decisions(good, replica.applied[0].model)
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "entry 2" in refused[0].getMessage() and "\n" not in refused[0].getMessage()


def test_a_fit_lost_with_its_leader_is_asked_for_again_at_the_next_observation():
    """The FitModel every engine emitted was fitted by no one (its leader died mid-fit): the same policy (every
    node's, the next leader's included) asks again once it has one more observation, and the next leader fits."""
    from meshsched.engine import Engine
    from meshsched.estimate import ProfileEstimator
    from meshsched.policies.lazer import LazerMemory
    from meshsched.policies.registry import make_policy
    from meshsched.policies.stack import PolicyHandle
    from meshsched.state import JobSpec, NodeSpec
    from tests.support.fakes import LinearPerf

    perf = LinearPerf(10.0, 5.0)
    engine = Engine(make_policy("lazer:seed=1", PolicyHandle(perf=perf)), ProfileEstimator(perf))
    engine.handle(ev.NodeJoined("join", NodeSpec("n0", 4, "fake", 16384)), 0.0)
    obs = _request(10).observations
    engine.memory = LazerMemory(OptimizerState(obs, 0, 10, exploiting=False))

    def fits(i: int, now: float) -> list[FitModel]:
        spec = JobSpec(f"j{i}", 4, "m", 400, 1000 - i, submit_time=now)
        return [a for a in engine.handle(ev.JobSubmitted(f"s{i}", spec), now) if isinstance(a, FitModel)]

    first = fits(1, 1.0)
    assert len(first) == 1 and len(first[0].request.observations) == 10  # ... and lost: no ModelFitted comes
    assert fits(2, 2.0) == []  # asked already: not again for the same observations
    engine.policy.preemption._opt.observe(DeferralContext(5.0, 100.0, 10.0, 5.0), 3.0, 7.0)  # one more measured F
    again = fits(3, 3.0)
    assert len(again) == 1 and len(again[0].request.observations) == 11


class _Holder:  # what with_model / install_model read of a replica: ctx.engine.model
    def __init__(self, model=None) -> None:
        self.ctx = type("Ctx", (), {})()
        self.ctx.engine = type("Engine", (), {"model": model})()


def test_a_snapshot_carries_the_fitted_model_and_a_node_that_loads_it_installs_it():
    from meshsched.daemon.eventlog import Snapshot, install_model, with_model

    model = fit_model(_request())
    bare = Snapshot(7, {}, {}, {}, {})
    assert with_model(bare, _Holder()) is bare and "model" not in json.loads(bare.to_json())  # as before
    snap = Snapshot.from_json(with_model(bare, _Holder(model)).to_json())
    loaded, lines = _Holder(), []
    install_model(snap, loaded, lines.append)
    assert lines == [] and _same_decisions(model, loaded.ctx.engine.model)
    damaged = dataclasses.replace(snap, model=_corrupt(snap.model, "bitflip"))
    refused = _Holder()
    install_model(Snapshot.from_json(damaged.to_json()), refused, lines.append)
    assert refused.ctx.engine.model is None  # the snapshot stands; the policy asks for a fit again
    assert len(lines) == 1 and lines[0].startswith("snapshot 7: a fitted model refused (its checksum")


# ------------------------------------------------------------------ a two-meshd mesh


def _mesh_config(root: Path, etcd_url: str, name: str):
    from tests.support.daemon import make_config, short_dir

    coord = CoordinatorConfig(backend="etcd", endpoints=(etcd_url,), ttl=9, loop_wait=1.0, retry_timeout=2.0)
    cfg = make_config(root / name / "s", short_dir(), policy="lazer", coordinator=coord, mesh_address="127.0.0.1")
    return dataclasses.replace(cfg, node_name=name).validate()


@pytest.mark.slow
def test_two_meshd_install_the_same_model_fitted_once_by_the_leader():
    """Both engines ask for the same fit (the action every node's engine emits); only the leader runs it, its
    model crosses the log, and both engines end with models that decide identically."""
    from meshsched.daemon.etcd_local import ETCD, NO_ETCD, start_etcd

    from meshsched.executor import dispatch
    from tests.support.daemon import daemon_in_thread, poll, remove

    if ETCD is None:
        pytest.skip(NO_ETCD)
    root = Path(tempfile.mkdtemp(prefix="fitmesh"))
    etcd = start_etcd(root)
    try:
        with daemon_in_thread(_mesh_config(root, etcd.url, "n1")) as (d1, loop1), \
                daemon_in_thread(_mesh_config(root, etcd.url, "n2")) as (d2, loop2):
            nodes = ((d1, loop1), (d2, loop2))
            poll(lambda: all(d.mesh.synced and d.mesh.leader is not None for d, _ in nodes)
                 and d1.mesh.leader == d2.mesh.leader, timeout=20, what="a leader both nodes see")
            action = FitModel(fit_model, _request())

            async def act(d) -> bool:  # on the node's loop, as its engine would: did it lead then?
                led = d.mesh.term is not None
                dispatch("meshd", d._handlers, action)
                return led

            led = [asyncio.run_coroutine_threadsafe(act(d), loop).result(10) for d, loop in nodes]
            poll(lambda: all(d.engine.model is not None for d, _ in nodes), timeout=60, what="both nodes' models")
            for (d, _), leading in zip(nodes, led, strict=True):
                assert (d._fit_pool is not None) == leading  # only a node leading when the action ran fits
            assert d1.engine.model is not d2.engine.model
            assert _same_decisions(d1.engine.model, d2.engine.model)
            fitted = [[e.message for e in d.engine.log if "model fitted" in e.message] for d, _ in nodes]
            assert fitted[0] == fitted[1] == ["model fitted (FittedModel)"] * sum(led)  # in log order, on both
    finally:
        etcd.stop()
        remove(root)
