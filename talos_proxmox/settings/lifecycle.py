"""The `lifecycle` and `health` sections: day-two timeouts, etcd snapshots, the health wait. No Pulumi here."""

from __future__ import annotations

from typing import Any

from talos_proxmox.settings.model import (
    DEFAULT_HEALTH_TIMEOUT_SECONDS,
    DEFAULT_LIFECYCLE_TIMEOUT_SECONDS,
    EtcdSnapshots,
    HealthSettings,
    LifecycleSettings,
    TIMEOUT_RANGE,
)
from talos_proxmox.settings.values import _Reader, _TIMEOUT_EXPECTED, _bool, _int_in, _string


def _read_lifecycle(r: _Reader, raw: Any) -> LifecycleSettings:
    s = r.section(raw, "lifecycle", ("timeoutSeconds", "resetOnDelete", "etcdSnapshots"))
    snap = r.section(s.get("etcdSnapshots"), "lifecycle.etcdSnapshots", ("enabled", "directory", "keep"))
    snapshots = None
    if r.value(snap, "enabled", "lifecycle.etcdSnapshots.enabled", _bool, "is not true or false", default=True):
        snapshots = EtcdSnapshots(
            directory=r.value(snap, "directory", "lifecycle.etcdSnapshots.directory", _string,
                              "is not a directory path", default=EtcdSnapshots.directory),
            keep=r.value(snap, "keep", "lifecycle.etcdSnapshots.keep", _int_in(1, 1000),
                         "is not a number of snapshots to keep (expected 1-1000)", default=EtcdSnapshots.keep))
    return LifecycleSettings(
        etcd_snapshots=snapshots,
        timeout_seconds=r.value(s, "timeoutSeconds", "lifecycle.timeoutSeconds", _int_in(*TIMEOUT_RANGE),
                                _TIMEOUT_EXPECTED,
                                default=DEFAULT_LIFECYCLE_TIMEOUT_SECONDS),
        reset_on_delete=r.value(s, "resetOnDelete", "lifecycle.resetOnDelete", _bool, "is not true or false",
                                default=True),
    )


def _read_health(r: _Reader, raw: Any) -> HealthSettings:
    s = r.section(raw, "health", ("wait", "timeoutSeconds"))
    return HealthSettings(
        wait=r.value(s, "wait", "health.wait", _bool, "is not true or false", default=True),
        timeout_seconds=r.value(s, "timeoutSeconds", "health.timeoutSeconds", _int_in(*TIMEOUT_RANGE),
                                _TIMEOUT_EXPECTED,
                                default=DEFAULT_HEALTH_TIMEOUT_SECONDS),
    )
