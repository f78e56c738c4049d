"""One node-down operation at a time per cluster, across processes (talos_proxmox.day_two.cluster_lock): a
second process waits for the holder, is told who it is, and gives up naming it; a holder that dies
releases the lock."""

import multiprocessing
import os
import signal
import time

import pytest

from talos_proxmox.day_two import cluster_lock


def hold_until_killed(directory, ready):
    with cluster_lock.hold("cluster-a", "upgrade of cp-2", directory=directory):
        ready.set()
        time.sleep(60)


@pytest.fixture
def holder(tmp_path):
    """Another process (as a killed up's provider host) holding cluster-a's lock."""
    ready = multiprocessing.Event()
    process = multiprocessing.Process(target=hold_until_killed, args=(tmp_path, ready))
    process.start()
    assert ready.wait(10)
    yield process
    if process.is_alive():
        os.kill(process.pid, signal.SIGKILL)
    process.join()


def test_a_second_holder_waits_is_told_who_holds_it_and_gives_up_naming_it(tmp_path, holder):
    told = []
    clock = iter(range(0, 100, 5))
    with pytest.raises(cluster_lock.ClusterBusy) as refused:
        with cluster_lock.hold("cluster-a", "roll of cp-3", wait_seconds=30, on_wait=told.append,
                               directory=tmp_path, sleep=lambda _s: None, clock=lambda: next(clock)):
            pytest.fail("held while another process holds it")
    assert f"pid {holder.pid} (upgrade of cp-2, since " in str(refused.value)
    assert str(refused.value).startswith("roll of cp-3: another node operation on this cluster still runs after")
    assert told and told[0].startswith(f"waiting for pid {holder.pid} (upgrade of cp-2")


def test_another_cluster_is_not_held_up(tmp_path, holder):
    with cluster_lock.hold("cluster-b", "roll of w-1", wait_seconds=0, directory=tmp_path):
        pass


def test_the_lock_is_free_once_its_holder_is_killed(tmp_path, holder):
    os.kill(holder.pid, signal.SIGKILL)
    holder.join()
    with cluster_lock.hold("cluster-a", "roll of cp-3", wait_seconds=5, directory=tmp_path):
        pass
