"""open_coordinator: the coordinator backend a `CoordinatorConfig` names, not yet started.

Apart from the seam (daemon/coordinator.py), whose types the etcd backend builds on: the seam imports no backend,
and the etcd one is imported only when a configuration names it."""

from __future__ import annotations

from collections.abc import Callable

from meshsched.daemon.config import COORDINATOR_BACKENDS, CoordinatorConfig
from meshsched.daemon.coordinator import Coordinator, LocalCoordinator


def _open_local(config: CoordinatorConfig, name: str) -> Coordinator:
    return LocalCoordinator(name)


def _open_etcd(config: CoordinatorConfig, name: str) -> Coordinator:
    from meshsched.daemon.etcd import EtcdCoordinator

    return EtcdCoordinator(config, name)


BACKENDS: dict[str, Callable[[CoordinatorConfig, str], Coordinator]] = {"local": _open_local, "etcd": _open_etcd}
assert tuple(BACKENDS) == COORDINATOR_BACKENDS  # the names the configuration accepts


def open_coordinator(config: CoordinatorConfig, name: str) -> Coordinator:
    """The coordinator the configuration names (not started: call `start()`)."""
    return BACKENDS[config.validate().backend](config, name)
