"""Shared by the day-two tests: stand-in Talos nodes laid out as a small cluster, and recording mocks."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Collection, Optional

import pulumi
import pytest

from talos_proxmox.day_two import rolling
from talos_proxmox.day_two.backup_target import BackupTarget
from talos_proxmox.day_two.rolling import RollNode
from talos_proxmox.talos_api import operations
from talos_proxmox.talos_api.generated.machine import machine_pb2
from talos_proxmox.talos_api.retry import Backoff
from tests.stand_ins.s3_server import ACCESS_KEY, SECRET_KEY, serve_s3
from tests.program.mocked_program import RecordingMonitor
from tests.support import seed_cluster as seed
from tests.stand_ins.talos_api import FakeTalosNode, client_credentials

FAST = Backoff(initial=0.02, factor=1.5, maximum=0.1)
# With a FakeClock, whole-second sleeps leave each call of a wait at least a second of real time, where
# FAST's last attempt before the deadline may get a few milliseconds.
SECONDS = Backoff(initial=1.0, factor=1.0, maximum=1.0)


# Fixtures for test modules that import them.
@pytest.fixture(scope="module")
def bundle():
    return seed.shared_bundle()


@pytest.fixture(scope="module")
def credentials(bundle):
    return client_credentials(bundle)


@pytest.fixture
def fast_backoff(monkeypatch):
    """The roll's and the Talos operations' default retries made fast (import it with autouse in a module)."""
    monkeypatch.setattr(rolling, "DEFAULT_BACKOFF", FAST)
    monkeypatch.setattr(operations, "DEFAULT_BACKOFF", FAST)


class FakeClock:
    """A clock that only moves when `sleep` is called, which records each sleep: what a wait given
    `sleep=clock.sleep, clock=clock` must use instead of real time."""

    def __init__(self) -> None:
        self.now, self.slept = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def slept_as(self, backoff, within: float) -> bool:
        """Whether the sleeps were `backoff`'s delays, in order, at least three of them, and together
        stayed within the wait's `within` seconds (a wait on the real clock would sleep on and on)."""
        return (len(self.slept) >= 3 and sum(self.slept) <= within
                and self.slept == list(itertools.islice(backoff.delays(), len(self.slept))))


def stand_in_cluster(bundle: dict, layout, *, version_tag: str = "v1.12.6", downtime: float = 0.3,
                     member_ids: dict | None = None) -> tuple[dict, dict]:
    """(RollNode by name, FakeTalosNode by name) for layout [(name, address, role)]. Every control
    plane lists every control plane as an etcd member (URLs on its address); workers run no etcd."""
    member_ids = member_ids or {}
    members = [machine_pb2.EtcdMember(id=member_ids.get(name, 0x100 + i), hostname=name,
                                      peer_urls=[f"https://{address}:2380"], client_urls=[f"https://{address}:2379"])
               for i, (name, address, role) in enumerate(layout) if role == "controlplane"]
    nodes, fakes = {}, {}
    for name, address, role in layout:
        fake = FakeTalosNode(bundle, mode="configured", hostname=name, install_downtime=downtime,
                             version_tag=version_tag)
        fake.etcd_members = list(members) if role == "controlplane" else []
        if role == "worker":
            fake.services = [s for s in fake.services if s.id != "etcd"]
        fakes[name] = fake
        nodes[name] = RollNode(name=name, address=address, role=role, endpoint=fake.endpoint)
    peers = {address: fakes[name] for name, address, _ in layout}
    for fake in fakes.values():
        fake.peers = peers  # a call naming another node's address is answered by it, as apid proxies
    return nodes, fakes


UPGRADE_RPCS = ("ImageService/Pull", "LifecycleService/Upgrade", "Reboot", "Upgrade")


def upgrade_timeline(calls: dict, changes, since: float = 0.0, until: float = float("inf"), *,
                     by_deployment: bool = False, namespaces: Optional[Collection[str]] = None) -> list[tuple[str, str]]:
    """(who, what) of each upgrade call a node received (`calls`: name -> RecordedCall list) and each change
    made through the Kubernetes API (`changes`: Change records, as KubeCluster.changes() reads them from the
    API server's audit log: cordon X, uncordon X, evict namespace/pod), in the order they came, from `since`
    to `until` (time.monotonic()). `by_deployment`: evicted pods named by their Deployment (a pod is
    <deployment>-<pod template hash>-<suffix>); `namespaces`: only evictions from these (in a real cluster
    CoreDNS's pods are evicted too, from wherever the scheduler happened to put them)."""
    entries = [(call.at, name, call.rpc) for name, received in calls.items() for call in received
               if call.rpc in UPGRADE_RPCS and since <= call.at < until]
    for change in changes:
        if not since <= change.at < until:
            continue
        if (change.verb, change.resource, change.subresource) == ("patch", "nodes", ""):
            verb = "cordon" if change.body["spec"]["unschedulable"] else "uncordon"
            entries.append((change.at, "kubernetes", f"{verb} {change.name}"))
        elif (change.verb, change.resource, change.subresource) == ("create", "pods", "eviction") and (
                namespaces is None or change.namespace in namespaces):
            pod = change.name.rsplit("-", 2)[0] if by_deployment else change.name
            entries.append((change.at, "kubernetes", f"evict {change.namespace}/{pod}"))
    return [(who, what) for _, who, what in sorted(entries)]


def stop_all(fakes: dict) -> None:
    for fake in fakes.values():
        fake.stop()


def recording_mocks(outputs: Callable[[pulumi.runtime.MockResourceArgs], dict]) -> RecordingMonitor:
    """Install Pulumi mocks whose resources answer `outputs(args)`; returns the monitor that records
    each registration's options (additional_secret_outputs, dependencies)."""

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args):
            return f"{args.name}-id", outputs(args)

        def call(self, args):
            return {}

    mocks = Mocks()
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project="talos-proxmox", stack="test", preview=False, monitor=monitor)
    return monitor


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The real versitygw with the bucket `etcd-backups`."""
    with serve_s3(tmp_path_factory.mktemp("s3")) as server:
        server.make_bucket("etcd-backups")
        yield server


def backup_target(s3, recipient: str, **changes) -> BackupTarget:
    """The stack's backup target (prefix `dev`) on `s3`'s bucket, with its credentials, `changes` made."""
    return dataclasses.replace(BackupTarget(
        bucket="etcd-backups", endpoint=s3.endpoint, region="us-east-1", path_style=True, prefix="dev",
        age_recipient=recipient, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY), **changes)
