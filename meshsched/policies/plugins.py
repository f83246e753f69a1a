"""Policies from outside the repository: a class named by entry point (group `meshsched.policies`) or by its
import path `package.module:Class`, checked against the layers' Protocols before anything is built.

A policy class is built as `cls(handle)` with the `PolicyHandle` (models, seed, RNG); its layer is the first
of placement, preemption, calibration and plan whose methods it has all of. Whatever is wrong with it is
refused with one line (`PluginRefused`), as an unknown policy is.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from meshsched.policies.abilities import members
from meshsched.policies.base import CalibrationPolicy, PlacementPolicy, PlanPolicy, PreemptionPolicy

GROUP = "meshsched.policies"
LAYERS = {"placement": PlacementPolicy, "preemption": PreemptionPolicy, "calibration": CalibrationPolicy,
          "plan": PlanPolicy}


class PluginRefused(ValueError):
    """A policy from outside that cannot be used (one line)."""


def is_import_path(head: str, pairs: list[str]) -> bool:
    """Whether a stack item `head:pairs[0]:...` names a class by import path (`pkg.mod:Class`), not parameters."""
    return bool(pairs) and "=" not in pairs[0] and pairs[0].strip().isidentifier()


def installed_names() -> list[str]:
    """The names of the policies installed under the entry point group."""
    return sorted({ep.name for ep in entry_points(group=GROUP)})


def find(name: str) -> type | None:
    """The policy class `name` stands for (an entry point's name or `pkg.mod:Class`); None if it names neither."""
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            found = getattr(importlib.import_module(module.strip()), attr.strip())
        except ImportError as exc:
            raise PluginRefused(f"policy {name!r}: cannot import {module.strip()!r} ({exc})") from None
        except AttributeError:
            raise PluginRefused(f"policy {name!r}: module {module.strip()!r} has no {attr.strip()!r}") from None
        return _checked_class(name, found)
    matches = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not matches:
        return None
    try:
        found = matches[0].load()
    except (ImportError, AttributeError) as exc:
        raise PluginRefused(f"policy {name!r}: its entry point {matches[0].value!r} does not load ({exc})") from None
    return _checked_class(name, found)


def _checked_class(name: str, found: object) -> type:
    if not isinstance(found, type):
        raise PluginRefused(f"policy {name!r}: {found!r} is not a class (a policy is a class built as cls(handle))")
    return found


def layer_of(name: str, cls: type) -> str:
    """The first layer whose Protocol's methods `cls` has all of; PluginRefused naming what is missing if none."""
    missing_by_layer = {}
    for layer, protocol in LAYERS.items():
        methods, _ = members(protocol)
        missing = [m for m in methods if not callable(getattr(cls, m, None))]
        if not missing:
            return layer
        missing_by_layer[layer] = missing
    layer, missing = min(missing_by_layer.items(), key=lambda kv: len(kv[1]))
    raise PluginRefused(f"policy {name!r}: {cls.__qualname__} has the methods of no layer (closest, a {layer} "
                        f"policy: it lacks {', '.join(missing)})")


def build(name: str, cls: type, layer: str, handle) -> object:
    """`cls(handle)`, checked against its layer's Protocol (data members included)."""
    try:
        policy = cls(handle)
    except (TypeError, ValueError) as exc:
        raise PluginRefused(f"policy {name!r}: {cls.__qualname__}(handle) failed: {exc}") from None
    if not isinstance(policy, LAYERS[layer]):
        lacking = [m for group in members(LAYERS[layer]) for m in group if not hasattr(policy, m)]
        raise PluginRefused(f"policy {name!r}: {cls.__qualname__} lacks {', '.join(lacking)} of a {layer} policy")
    return policy
