"""A fitted model as plain data, so that it can cross the mesh's log (`ModelFitted` entries, daemon/eventlog.py).

Under a mesh, one node carries out a `FitModel` (the leader when the action runs: daemon/node.py) and proposes
the result; every node decodes the same entry and installs an identical model, so every node's policy makes the
same decisions. The encoding is JSON-ready data, never pickle (every node reads the log):

- a dataclass of the allowed classes (`ALLOWED`: Lazer's `FittedModel` and its `GridGP`) is
  `{"dc": name, "fields": {field: value}}`, over its dataclass fields, so a field added later travels too;
- a numpy array is `{"nd": dtype, "shape": [...], "zb64": base64 of its little-endian bytes, zlib-deflated}`
  (float64, int64 or bool): the exact bits, so a decoded model's posterior is bit-identical to the fitted one's
  (the GP's n x n Cholesky factor dominates: ~5.5 n^2 bytes, 220 KB at 200 observations);
- a float is `{"f": float.hex()}` (exact, and NaN or infinity stay JSON), a numpy scalar `{"npf": ...}`;
  ints, strings, bools and None as themselves; tuples and lists as `{"seq": [...]}`;
- the whole is `{"codec": 1, "model": ..., "sha256": digest of the model part's canonical JSON}`: a model
  damaged on the way (a flipped bit in a tensor) does not decode.

`decode_model` raises ModelCodecError (a ValueError, one line) for anything it does not recognise; `fit_encoded`
runs a fit and encodes its result in the worker process that fits (meshd's spawn pool)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib
import json
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

CODEC = 1
MAX_BYTES = 1 << 20  # a larger model is not proposed (etcd refuses a request over 1.5 MiB by default)
# name in the encoding -> (module, class): the only classes a log entry may build
ALLOWED = {
    "FittedModel": ("meshsched.policies.lazer_opt", "FittedModel"),
    "GridGP": ("meshsched.policies.lazer_gp", "GridGP"),
}
DTYPES = {"<f8": np.float64, "<i8": np.int64, "|b1": np.bool_}
MAX_DEPTH = 8


class ModelCodecError(ValueError):
    """A model that cannot be encoded, or an encoding that does not decode."""


def _allowed(name: str) -> type:
    where = ALLOWED.get(name)
    if where is None:
        raise ModelCodecError(f"{name!r} is not a model class the log carries")
    return getattr(importlib.import_module(where[0]), where[1])


def _out(value: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise ModelCodecError("the model nests too deep")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
        if arr.dtype.str not in DTYPES:
            raise ModelCodecError(f"an array of {value.dtype} cannot be encoded")
        packed = zlib.compress(arr.tobytes(), 6)  # a Cholesky factor is half zeros
        return {"nd": arr.dtype.str, "shape": list(arr.shape), "zb64": base64.b64encode(packed).decode()}
    if isinstance(value, np.generic):
        return {"npf": _out(value.item(), depth + 1), "dtype": np.asarray(value).dtype.newbyteorder("<").str}
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return {"f": value.hex()}
    if isinstance(value, (tuple, list)):
        return {"seq": [_out(v, depth + 1) for v in value]}
    name = type(value).__name__
    if dataclasses.is_dataclass(value) and name in ALLOWED and type(value) is _allowed(name):
        return {"dc": name, "fields": {f.name: _out(getattr(value, f.name), depth + 1)
                                       for f in dataclasses.fields(value)}}
    raise ModelCodecError(f"a {type(value).__module__}.{name} cannot be encoded")


def _array(d: dict) -> np.ndarray:
    dtype = DTYPES.get(d.get("nd"))
    shape = d.get("shape")
    if dtype is None or not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise ModelCodecError(f"bad array header {d.get('nd')!r} {shape!r}")
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(base64.b64decode(str(d.get("zb64", "")), validate=True), size + 1)
    except zlib.error as exc:
        raise ModelCodecError(f"an array's data does not inflate: {exc}") from None
    if len(raw) != size or not inflate.eof:
        raise ModelCodecError(f"an array of shape {shape} holds {len(raw)} bytes")
    arr = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
    return arr.reshape(shape).astype(dtype)  # native byte order, a writable copy


def _in(value: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise ModelCodecError("the model nests too deep")
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if not isinstance(value, dict):
        raise ModelCodecError(f"unexpected {type(value).__name__} in a model")
    if "f" in value:
        return float.fromhex(str(value["f"]))
    if "nd" in value:
        return _array(value)
    if "npf" in value:
        dtype = DTYPES.get(value.get("dtype"))
        if dtype is None:
            raise ModelCodecError(f"bad scalar type {value.get('dtype')!r}")
        return dtype(_in(value["npf"], depth + 1))
    if "seq" in value and isinstance(value["seq"], list):
        return tuple(_in(v, depth + 1) for v in value["seq"])
    if "dc" in value and isinstance(value.get("fields"), dict):
        cls = _allowed(str(value["dc"]))
        names = {f.name for f in dataclasses.fields(cls)}
        if set(value["fields"]) != names:
            raise ModelCodecError(f"{value['dc']} has fields {sorted(names)}, the model {sorted(value['fields'])}")
        return cls(**{k: _in(v, depth + 1) for k, v in value["fields"].items()})
    raise ModelCodecError(f"unexpected keys {sorted(value)[:4]} in a model")


def _digest(part: Any) -> str:
    return hashlib.sha256(json.dumps(part, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def encode_model(model: Any) -> dict:
    """`model` (a fitted model of an allowed class) as plain JSON-ready data; ModelCodecError if it is not."""
    part = _out(model)
    return {"codec": CODEC, "model": part, "sha256": _digest(part)}


def is_encoded(data: Any) -> bool:
    return isinstance(data, dict) and "codec" in data and "model" in data


def decode_model(data: Any) -> Any:
    """The model `encode_model` gave `data` for, equal in every bit; ModelCodecError (one line) otherwise."""
    if not is_encoded(data):
        raise ModelCodecError("not an encoded model")
    if data["codec"] != CODEC:
        raise ModelCodecError(f"codec {data['codec']!r}, this meshd reads {CODEC}")
    if data.get("sha256") != _digest(data["model"]):
        raise ModelCodecError("its checksum does not match (damaged)")
    try:
        return _in(data["model"])
    except ModelCodecError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, ImportError) as exc:
        raise ModelCodecError(f"{type(exc).__name__}: {exc}") from None


def fit_encoded(fit: Callable[[Any], Any], request: Any) -> dict:
    """`encode_model(fit(request))`: run in the fitting worker process, so what comes back is already plain data."""
    return encode_model(fit(request))
