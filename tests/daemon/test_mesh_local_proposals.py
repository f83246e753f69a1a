"""The leader's own proposals (daemon/mesh_batch.py `LocalProposals`): appended by its sequencer without a put to
`proposals/` (one etcd round trip less on the submit-to-RUNNING path when a job starts on the leader's node),
each once, in the node's order; handed back to the put path whenever the sequencer cannot append them."""

from __future__ import annotations

import asyncio

from meshsched.daemon.coordinator import CoordinatorUnavailable
from meshsched.daemon.etcd import EtcdCoordinator
from meshsched.daemon.eventlog import Entry, index_of
from meshsched.daemon.mesh_batch import LocalProposals

from meshsched import events as ev
from tests.daemon.test_mesh_batch import _config, _link, _log, _until
from tests.daemon.test_mesh_batch import etcd  # noqa: F401, F811 - the fixture (a real etcd per test)


class Puts(EtcdCoordinator):
    """The real client; counts the puts to `proposals/`, and can lose the answer of the first transaction that
    appends one of its node's proposals (it committed; the leader hears an error, as on a timeout)."""

    def __init__(self, config, name: str, lose_answer: bool = False) -> None:
        super().__init__(config, name)
        self.proposal_puts = 0
        self.lose_answer = lose_answer

    async def put(self, key: str, value: str, term: int | None = None) -> int:
        if key.startswith("proposals/"):
            self.proposal_puts += 1
        return await super().put(key, value, term)

    async def append(self, term: int, puts: list[tuple[str, str]], deletes: list[str]) -> int:
        revision = await super().append(term, puts, deletes)
        if self.lose_answer and any(d.startswith(f"proposals/{self.name}/") for d in deletes):
            self.lose_answer = False
            raise CoordinatorUnavailable("etcd does not answer (the transaction committed)")
        return revision


def _cancel(i: int) -> ev.CancelRequested:
    return ev.CancelRequested(f"c{i}", f"j.{i}")


async def test_the_leaders_own_proposals_reach_the_log_without_a_put_in_order_each_once(etcd):
    config = _config(etcd.url, "/local")
    coord = Puts(config, "a")
    link, replica = _link("a", coord, config)
    link.start()
    try:
        await _until(lambda: link.term is not None and link._local.queue is not None, 15, "a to lead")
        for i in range(5):
            link.propose(_cancel(i))
        await _until(lambda: link.position == 5, 15, "a's proposals in the log")
        await asyncio.sleep(0.3)  # (nothing more comes)
        log = await _log(coord)
        assert [p for _, p in log] == sorted(p for _, p in log) and len(log) == 5  # the node's order, each once
        assert [i for i, _ in replica.applied] == [1, 2, 3, 4, 5]
        assert coord.proposal_puts == 0  # straight to the sequencer: no round trip through proposals/
        assert link.view()["outbox"] == 0
    finally:
        await link.close()


async def test_an_append_whose_answer_is_lost_falls_back_to_a_put_and_applies_once(etcd):
    config = _config(etcd.url, "/lost")
    coord = Puts(config, "a", lose_answer=True)
    link, replica = _link("a", coord, config)
    link.start()
    probe = EtcdCoordinator(config, "probe")
    await probe.start()
    try:
        await _until(lambda: link.term is not None and link._local.queue is not None, 15, "a to lead")
        link.propose(_cancel(0))
        link.propose(_cancel(1))
        await _until(lambda: len(replica.applied) == 2 and not link.view()["outbox"], 30, "both applied")
        await _until(lambda: link.term is not None, 15, "a to lead again")
        await asyncio.sleep(0.5)
        log = await _log(probe)  # the first is in it twice (committed, then put again): applied once
        assert [p for _, p in replica.applied] == sorted({p for _, p in log})
        assert coord.proposal_puts >= 1  # handed back to the put path
        assert (await probe.list("proposals/")).items == {}
        assert {Entry.from_json(v).event.job_id for v in (await probe.list("log/")).items.values()} == {"j.0", "j.1"}
        assert max(map(index_of, (await probe.list("log/")).items)) == link.position
    finally:
        await link.close()
        await probe.close()


async def test_local_proposals_hand_only_to_an_open_sequencer_and_never_ahead_of_a_put():
    local = LocalProposals()
    assert await local.hand("proposals/a/1", "x") is False  # no sequencer: put it
    queue: asyncio.Queue = asyncio.Queue()
    local.open(queue)
    handed = asyncio.ensure_future(local.hand("proposals/a/2", "y"))
    await asyncio.sleep(0)
    assert queue.get_nowait() == ("proposals/a/2", "y")
    local.committed(["proposals/a/2"])
    assert await handed is True
    pending = asyncio.ensure_future(local.hand("proposals/a/3", "z"))
    await asyncio.sleep(0)
    local.close()  # the sequencer stopped before appending it: back to the put path
    assert await pending is False
    local.open(queue)
    local.unseen = "proposals/a/4"  # put, maybe not yet delivered by the proposals' watch
    assert await local.hand("proposals/a/5", "w") is False  # it would overtake the put one
    local.seen("proposals/a/4")
    handed = asyncio.ensure_future(local.hand("proposals/a/5", "w"))
    await asyncio.sleep(0)
    local.committed(["proposals/a/5"])
    assert await handed is True
