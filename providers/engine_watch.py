"""A dynamic-provider host that outlives its engine ends once it is between node steps.

`pulumi up` killed with SIGKILL (a laptop lid closed, a cancelled CI job) leaves the dynamic-provider host it
started running: the host sits in a process group of its own, and nothing tells it the engine is gone. The
engine sends no further step, but a host left behind keeps its connections and, in a step that takes a node
down, its place in the cluster's operations lock. The watchdog here notices the engine is gone (the `pulumi`
process above the host, which runs under Pulumi's launcher script, no longer runs) and ends the host as
soon as it holds no operations lock:
the node step it is on finishes (a half-done upgrade would be worse), nothing after it starts.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

from talos_proxmox.day_two import cluster_lock

POLL_SECONDS = 1.0
PROVIDER_HOST_MODULES = ("pulumi.dynamic.__main__", "pulumi.dynamic")


def watch(engine_alive: Callable[[], bool], *, busy: Callable[[], bool] = cluster_lock.held_here,
          end: Callable[[int], None] = os._exit, poll: float = POLL_SECONDS,
          sleep: Callable[[float], None] = time.sleep) -> threading.Thread:
    """Poll: once not `engine_alive()` and nothing is `busy()`, `end(0)` the process."""
    def run() -> None:
        while True:
            sleep(poll)
            if not engine_alive() and not busy():
                try:  # to whoever still reads it: the engine that read this pipe is gone (EPIPE)
                    sys.stderr.write("talos-proxmox: the engine that started this provider host is gone: ending it\n")
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
                end(0)
                return

    thread = threading.Thread(target=run, daemon=True, name="engine-watch")
    thread.start()
    return thread


def _stat(pid: int) -> tuple[str, int, str]:
    """(comm, parent pid, state) of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
    return comm, int(rest[1]), rest[0]


def engine_pid(start: int, engine_command: str = "pulumi", depth: int = 4) -> int:
    """The engine among `start` and its ancestors: the nearest process named `engine_command` (the host runs
    under Pulumi's launcher script, whose parent is the CLI), else `start` itself."""
    pid = start
    for _ in range(depth):
        try:
            comm, parent, _state = _stat(pid)
        except (OSError, ValueError, IndexError):
            break
        if comm == engine_command:
            return pid
        pid = parent
    return start


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie no longer does)."""
    try:
        return _stat(pid)[2] != "Z"
    except (OSError, ValueError, IndexError):
        return False


_started: list[threading.Thread] = []


def start_in_provider_host() -> None:
    """Start the watchdog once, in Pulumi's dynamic-provider host only (not in the program)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if not _started and spec is not None and spec.name in PROVIDER_HOST_MODULES:
        engine = engine_pid(os.getppid())
        _started.append(watch(lambda: alive(engine)))
