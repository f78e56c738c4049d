"""The dynamic-provider host's watchdog (providers/engine_watch.py): a host whose engine is gone ends, but
only between node steps; and a real orphaned process does end."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from providers import engine_watch
from talos_proxmox.day_two import cluster_lock
from tests.paths import REPO


def _watched(engine: list[bool], busy: list[bool]) -> tuple[list[int], threading.Event]:
    ended: list[int] = []
    done = threading.Event()

    def end(code: int) -> None:
        ended.append(code)
        done.set()

    engine_watch.watch(lambda: engine[0], busy=lambda: busy[0], end=end, poll=0.01)
    return ended, done


def test_a_host_whose_engine_lives_keeps_running():
    ended, done = _watched([True], [False])
    assert not done.wait(0.2) and ended == []


def test_a_host_whose_engine_is_gone_ends_once_no_node_step_holds_the_lock():
    engine, busy = [True], [True]
    ended, done = _watched(engine, busy)
    engine[0] = False  # the CLI was killed
    assert not done.wait(0.2), "ended in the middle of a node step"
    busy[0] = False
    assert done.wait(2) and ended == [0]


def test_a_host_whose_stderr_pipe_is_broken_still_ends(monkeypatch):
    """The killed engine was the only reader of the host's stderr: the farewell line fails with EPIPE."""
    class Broken:
        def write(self, _text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(engine_watch.sys, "stderr", Broken())
    ended, done = _watched([False], [False])
    assert done.wait(2) and ended == [0]


def test_the_engine_is_the_nearest_pulumi_process_above_the_host():
    me = os.getpid()
    assert engine_watch.engine_pid(me, engine_command="nothing-is-called-this") == me
    comm = open(f"/proc/{os.getppid()}/comm").read().strip()
    assert engine_watch.engine_pid(me, engine_command=comm) == os.getppid()
    assert engine_watch.alive(me) and not engine_watch.alive(2 ** 22 + 1)


def test_holding_the_operations_lock_is_what_counts_as_busy(tmp_path):
    assert not cluster_lock.held_here()
    with cluster_lock.hold("watch-test", "upgrade of cp-1", directory=tmp_path):
        assert cluster_lock.held_here()
    assert not cluster_lock.held_here()


ORPHAN = """
import os, sys, time
sys.path.insert(0, {repo!r})
from providers import engine_watch
parent = os.getppid()
engine_watch.watch(lambda: engine_watch.alive(parent), poll=0.05)
print(os.getpid(), flush=True)
time.sleep(60)
"""


def test_a_real_orphan_ends_within_a_poll():
    """A process whose engine exits (as the CLI does under SIGKILL) notices, and its watchdog ends it."""
    launcher = subprocess.run(
        [sys.executable, "-c", "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
                               "stdout=subprocess.PIPE, text=True); print(p.stdout.readline().strip())",
         ORPHAN.format(repo=str(REPO))], capture_output=True, text=True, timeout=30)
    orphan = int(launcher.stdout.strip())
    deadline = time.monotonic() + 10
    while _alive(orphan):
        assert time.monotonic() < deadline, f"orphan {orphan} still runs"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its new parent is gone for our purpose
        return stat.read().split(") ", 1)[1].split()[0] != "Z"
