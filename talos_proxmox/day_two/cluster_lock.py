"""One node-down operation at a time per cluster, across processes: the operations lock.

Every step that takes a node down (an upgrade, a Kubernetes or hardware roll of one node, a removal)
holds the cluster's lock, an exclusive flock on a file named after the cluster (a hash of its OS CA, the
same from every stack and machine user that manages it here). A `pulumi up` killed mid-step leaves its
dynamic-provider host finishing the node it is on; the next `pulumi up` waits for that step to end
instead of taking a second node down beside it, printing who holds the lock, and gives up after
`wait_seconds`, naming the holder. The kernel drops the lock when its holder exits, however it exits.
No Pulumi here.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from talos_proxmox.talos_api.client import read_talosconfig

LOCK_DIR = Path(tempfile.gettempdir()) / "talos-proxmox-locks"
WAIT_SECONDS = 1800.0  # a node's step is bounded by the lifecycle's own timeout; this covers one
PROGRESS_EVERY = 15.0


def key_for(talosconfig) -> Optional[str]:
    """Names the cluster's locks: a hash of its OS CA (from its talosconfig), the same for every node of
    it and every stack that manages it; None when the talosconfig cannot be read."""
    try:
        ca = read_talosconfig(talosconfig).credentials.ca_pem
    except (ValueError, TypeError, KeyError):
        return None
    return hashlib.sha256(ca).hexdigest()[:16]


class ClusterBusy(RuntimeError):
    """Another process held the cluster's operations lock for longer than we wait."""


def holder(path: Path) -> str:
    """Who holds (or last held) the lock at `path`: `pid 1234 (upgrade of cp-2, since 12:03:04)`."""
    try:
        found = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "another process"
    since = time.strftime("%H:%M:%S", time.localtime(found.get("since", 0)))
    return f"pid {found.get('pid')} ({found.get('what')}, since {since})"


_held = [0]  # how many operations locks this process holds now


def held_here() -> bool:
    """Whether this process holds a cluster's operations lock now (a node-down step is under way)."""
    return _held[0] > 0


@contextlib.contextmanager
def hold(cluster_key: Optional[str], what: str, *, wait_seconds: float = WAIT_SECONDS,
         on_wait: Optional[Callable[[str], None]] = None, directory: Path = LOCK_DIR,
         sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> Iterator[None]:
    """Hold the cluster's operations lock for `what` (e.g. "upgrade of cp-2"). None: no lock (no cluster
    identity to name it by). Waits for another holder, telling `on_wait` who it is now and then."""
    if cluster_key is None:
        yield
        return
    directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / f"{cluster_key}.operations.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        started, told = clock(), None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = clock() - started
                if waited >= wait_seconds:
                    raise ClusterBusy(f"{what}: another node operation on this cluster still runs after "
                                      f"{waited:.0f}s: {holder(path)}; if that process is gone, run `pulumi up` "
                                      f"again") from None
                if on_wait is not None and (told is None or clock() - told >= PROGRESS_EVERY):
                    on_wait(f"waiting for {holder(path)} to finish ({waited:.0f}s)")
                    told = clock()
                sleep(0.5)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "what": what, "since": time.time()}).encode(), 0)
        _held[0] += 1
        try:
            yield
        finally:
            _held[0] -= 1
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
