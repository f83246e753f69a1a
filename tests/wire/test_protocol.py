"""Job-socket framing and HTTP request validation (meshsched.wire.protocol)."""

import msgpack
import pytest

from meshsched.wire.protocol import (
    HEADER,
    MAX_FRAME,
    REPLY_TYPES,
    FrameDecoder,
    ProtocolError,
    RequestError,
    SubmitRequest,
    decode_body,
    encode_frame,
    frame_length,
)


def test_round_trip_through_incremental_decoder():
    frames = encode_frame({"type": "report", "iterations": 5, "step_time": 0.1}) + encode_frame({"type": "ping"})
    dec = FrameDecoder()
    got = []
    for i in range(len(frames)):  # byte by byte: partial frames wait for the rest
        got += dec.feed(frames[i : i + 1])
    assert [m["type"] for m in got] == ["report", "ping"]
    assert got[0]["iterations"] == 5 and got[0]["v"] == 1


def test_oversized_frame_is_refused_from_its_header():
    with pytest.raises(ProtocolError, match="exceeds"):
        frame_length(HEADER.pack(MAX_FRAME + 1))
    with pytest.raises(ProtocolError):
        encode_frame({"type": "ping", "pad": "x" * MAX_FRAME})


@pytest.mark.parametrize(
    "body, match",
    [
        (b"\xc1", "undecodable"),
        (msgpack.packb([1, 2]), "map"),
        (msgpack.packb({"v": 99, "type": "ping"}), "version"),
        (msgpack.packb({"v": 1, "type": "launch"}), "unknown message type"),
        (msgpack.packb({"v": 1, "type": "report", "iterations": "x", "step_time": 1}), "iterations"),
        (msgpack.packb({"v": 1, "type": "report", "iterations": -1, "step_time": 1}), "iterations"),
        (msgpack.packb({"v": 1, "type": "report", "iterations": 1, "step_time": float("nan")}), "step_time"),
        (msgpack.packb({"v": 1, "type": "hello", "job_id": 7}), "job_id"),
        (msgpack.packb({"v": 1, "type": "hello", "rank": 0, "steps": 0}), "steps"),
        (msgpack.packb({"v": 1, "type": "hello", "rank": 0, "steps": 2.5}), "steps"),
    ],
)
def test_bad_messages(body, match):
    with pytest.raises(ProtocolError, match=match):
        decode_body(body)


def test_replies_are_not_requests():
    body = encode_frame({"type": "ok"})[HEADER.size :]
    with pytest.raises(ProtocolError):
        decode_body(body)
    assert decode_body(body, REPLY_TYPES)["type"] == "ok"


def test_submit_request_validation():
    req = SubmitRequest.from_json({"command": ["python", "t.py"], "cwd": "/tmp", "gpus": 2})
    assert req.gpus == 2 and req.model == "custom" and req.iterations is None  # None: the script may declare it
    assert SubmitRequest.from_json({"command": ["x"], "cwd": "/", "iterations": 7}).iterations == 7
    for bad, match in [
        ({"command": [], "cwd": "/tmp"}, "command"),
        ({"command": ["x"], "cwd": "rel"}, "cwd"),
        ({"command": ["x"], "cwd": "/", "gpus": 0}, "gpus"),
        ({"command": ["x"], "cwd": "/", "gpus": True}, "gpus"),
        ({"command": ["x"], "cwd": "/", "shell": True}, "unknown field"),
        ({"command": ["x"], "cwd": "/", "env": {"A": 1}}, "env"),
        ([1], "object"),
    ]:
        with pytest.raises(RequestError, match=match):
            SubmitRequest.from_json(bad)
