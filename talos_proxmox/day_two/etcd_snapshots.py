"""etcd snapshots before a control plane goes down for an upgrade or leaves the cluster.

`take_snapshot` streams `EtcdSnapshot` from the node (`talosctl etcd snapshot`) into
`<directory>/<cluster>-<node>-<UTC time>.snapshot`, readable by the owner only (the snapshot holds every
Kubernetes Secret), written atomically, and keeps the newest `keep` snapshots of the cluster. No Pulumi.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Callable

from talos_proxmox.talos_api.client import TalosClient

SUFFIX = ".snapshot"


def snapshot_name(cluster: str, node: str, now: datetime.datetime) -> str:
    return f"{cluster}-{node}-{now.astimezone(datetime.timezone.utc):%Y%m%dT%H%M%SZ}{SUFFIX}"


def prune(directory: Path, cluster: str, keep: int) -> list[Path]:
    """Delete all but the newest `keep` snapshots of `cluster`; returns what was deleted."""
    mine = sorted((p for p in directory.glob(f"{cluster}-*{SUFFIX}")), key=lambda p: (p.stat().st_mtime, p.name))
    doomed = mine[:-keep] if keep > 0 else mine
    for path in doomed:
        path.unlink()
    return doomed


def take_snapshot(client: TalosClient, node: str, address: str, *, directory: str | Path, cluster: str, keep: int,
                  timeout: float, now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(
                      datetime.timezone.utc)) -> Path:
    """Snapshot the etcd of the control plane at `address`; returns the file written."""
    data = client.etcd_snapshot(timeout=timeout, node=address)
    if not data:
        raise RuntimeError(f"node {node}: EtcdSnapshot returned no data")
    target_dir = Path(directory)
    target_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = target_dir / snapshot_name(cluster, node, now())
    partial = target.with_suffix(target.suffix + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, target)
    prune(target_dir, cluster, keep)
    return target
