"""A node's VM on day two: how cores, memory or CPU type roll in through the Proxmox API (the PVE
stand-in) with the node's health gating it. What may change at all: tests/test_node_changes.py."""

import grpc
import pytest

from providers.node_lifecycle import NodeLifecycleProvider
from talos_proxmox.day_two import vm_hardware
from talos_proxmox.day_two.cluster_health import KubeApi, read_kubeconfig
from talos_proxmox.day_two.rolling import RollError
from talos_proxmox.proxmox_api import vms
from talos_proxmox.talos_api.client import TalosClient
from talos_proxmox.talos_api.generated.machine import machine_pb2
from talos_proxmox.talos_config.client_config import talosconfig as make_talosconfig
from tests.support import seed_cluster as seed
from tests.support.day_two import FAST, bundle, credentials, fast_backoff, stand_in_cluster, stop_all  # noqa: F401 - fixtures
from tests.stand_ins.kubernetes_api import StandInApi, coredns, node as k8s_node
from tests.stand_ins.proxmox_ve import PVE_HOST, TOKEN_SECRET, serve_proxmox

VM_ID = 9101
OLD = dict(host=PVE_HOST, vm_id=VM_ID, mac="bc:24:11:00:01:01", cores=2, memory_mib=4096, cpu_type="host",
           disk_gb=20, data_disk_gb=None)


pytestmark = pytest.mark.usefixtures("fast_backoff")


@pytest.fixture
def node(bundle):
    nodes, fakes = stand_in_cluster(bundle, [("cp-1", "10.5.0.1", "controlplane")])
    yield nodes["cp-1"], fakes["cp-1"]
    stop_all(fakes)


@pytest.fixture
def pve(node):
    _, fake = node
    with serve_proxmox(boot_seconds=0.3) as pve:
        pve.run_guest(VM_ID, "cp-1", fake, config={"cores": 2, "memory": "4096", "cpu": "host"})
        yield pve


def _apply(credentials, roll_node, pve, changes, events, timeout=10.0, **options):
    with TalosClient([roll_node.endpoint], credentials=credentials, node=roll_node.address, timeout=5) as client:
        vm_hardware.apply_hardware(client, pve.client(), roll_node, vms.VmRef(PVE_HOST, VM_ID), changes,
                                   timeout=timeout, backoff=FAST, on_event=lambda what, name: events.append(what),
                                   **options)


# --- what rolls ------------------------------------------------------------------------------------

def test_cores_memory_and_cpu_type_are_the_hardware_that_rolls():
    new = {**OLD, "cores": 4, "memory_mib": 8192, "cpu_type": "x86-64-v3", "disk_gb": 30}
    assert vm_hardware.hardware_changes(OLD, new) == {"cores": (2, 4), "memory_mib": (4096, 8192),
                                                      "cpu_type": ("host", "x86-64-v3")}
    assert vm_hardware.hardware_changes(OLD, {**OLD, "disk_gb": 30}) == {}  # a bigger disk: the provider resizes live
    assert vm_hardware.hardware_changes(None, new) == {}  # recorded before VMs were tracked: nothing to roll


def test_numbers_read_back_from_the_engine_as_floats_are_the_same_numbers():
    through_the_engine = {fact: float(value) if isinstance(value, int) else value for fact, value in OLD.items()}
    assert vm_hardware.hardware_changes(through_the_engine, OLD) == {}
    assert vm_hardware.hardware_changes(through_the_engine, {**OLD, "cores": 4.0}) == {"cores": (2, 4)}


# --- the roll of one node, against the PVE and Talos stand-ins ------------------------------------

def test_pending_hardware_comes_in_through_a_drained_shutdown_and_a_proxmox_start(node, pve, credentials):
    roll_node, fake = node
    pve.vm_changed(VM_ID, {"cores": 4, "memory": 8192})
    events, before = [], len(pve.requests)
    _apply(credentials, roll_node, pve, {"cores": (2, 4), "memory_mib": (4096, 8192)}, events)

    vm = f"/api2/json/nodes/{PVE_HOST}/qemu/{VM_ID}"
    calls = [(method, path) for method, path, _ in pve.requests[before:]]
    assert calls[:2] == [("GET", f"{vm}/status/current"), ("GET", f"{vm}/pending")]
    # Talos was asked to shut down gracefully (it cordons and drains first), then PVE saw the VM stop
    [shutdown] = fake.calls_for("Shutdown")
    assert (shutdown.request.force, shutdown.roles) == (False, ("os:admin",))
    polls = [c for c in calls[2:] if c == ("GET", f"{vm}/status/current")]
    start = calls.index(("POST", f"{vm}/status/start"))
    assert polls and calls[2:start] == polls
    assert calls[start + 1][0] == "GET" and f":qmstart:{VM_ID}:" in calls[start + 1][1]
    assert calls[start + 2:] == [("GET", f"{vm}/pending")]
    assert fake.reboots == 1 and [e.what for e in pve.power_events] == ["off", "up"]
    # stored typed, as PVE's check_type does
    assert (pve.vm(VM_ID).config["cores"], pve.vm(VM_ID).config["memory"]) == (4, 8192)
    assert pve.vm(VM_ID).pending == {}
    assert events == ["healthy-before", "shutdown-requested (cpu 2 -> 4, memory 4096 -> 8192; pending: cores, memory)",
                      "vm-stopped", "vm-started", "healthy"]
    # The node was asked for its health before the shutdown and after it came back.
    service_lists = [c.at for c in fake.calls_for("ServiceList")]
    [off] = [e.at for e in pve.power_events if e.what == "off"]
    assert min(service_lists) < shutdown.at < off < max(service_lists)


def test_nothing_pending_means_proxmox_took_it_live_and_the_node_is_not_touched(node, pve, credentials):
    roll_node, fake = node
    events = []
    _apply(credentials, roll_node, pve, {"cores": (2, 4)}, events)
    assert pve.start_requests() == [] and fake.calls_for("Shutdown") == [] and fake.reboots == 0
    assert events == ["healthy-before", "hardware-applied-live (cpu 2 -> 4)"]


def test_an_unhealthy_node_is_not_shut_down(node, pve, credentials):
    roll_node, fake = node
    fake.services[1] = type(fake.services[1])(id="etcd", state="Running")  # etcd not healthy
    pve.vm_changed(VM_ID, {"cores": 4})
    with pytest.raises(RollError, match=r"^node cp-1 \(10\.5\.0\.1\): .*etcd"):
        _apply(credentials, roll_node, pve, {"cores": (2, 4)}, [], timeout=1.0)
    assert fake.calls_for("Shutdown") == [] and pve.vm(VM_ID).pending == {"cores": 4}


def test_a_refused_shutdown_stops_the_roll_naming_the_node(node, pve, credentials):
    roll_node, fake = node
    fake.fail_next("Shutdown", grpc.StatusCode.PERMISSION_DENIED, "not authorized")
    pve.vm_changed(VM_ID, {"cores": 4})
    with pytest.raises(RollError) as failed:
        _apply(credentials, roll_node, pve, {"cores": (2, 4)}, [])
    assert str(failed.value).startswith("node cp-1 (10.5.0.1): Talos refused to shut down to apply cpu 2 -> 4: ")
    assert pve.start_requests() == [] and pve.vm(VM_ID).status == "running"


def test_a_vm_that_never_powers_off_stops_the_roll_naming_the_node(node, pve, credentials):
    roll_node, fake = node
    fake.behaviours["Shutdown"] = lambda _node, _request, _context: machine_pb2.ShutdownResponse()
    pve.vm_changed(VM_ID, {"cores": 4})
    with pytest.raises(RollError) as failed:
        _apply(credentials, roll_node, pve, {"cores": (2, 4)}, [], timeout=2.0)
    assert str(failed.value).startswith("node cp-1 (10.5.0.1): power-cycling VM 9101 on pve1 to apply cpu 2 -> 4 "
                                        "failed: VM 9101 on pve1 still running ")
    assert pve.start_requests() == []


def test_a_failed_start_stops_the_roll_naming_the_node_and_what_pve_said(node, pve, credentials):
    roll_node, fake = node
    pve.vm(VM_ID).start_error = "storage 'local-lvm' is not online"
    pve.vm_changed(VM_ID, {"memory": 8192})
    with pytest.raises(RollError) as failed:
        _apply(credentials, roll_node, pve, {"memory_mib": (4096, 8192)}, [])
    assert str(failed.value) == ("node cp-1 (10.5.0.1): power-cycling VM 9101 on pve1 to apply memory 4096 -> 8192 "
                                 "failed: task qmstart of VM 9101 on pve1 ended with: "
                                 "storage 'local-lvm' is not online")


def test_a_roll_cut_short_after_the_shutdown_is_finished_by_the_next_without_a_second_shutdown(node, pve,
                                                                                               credentials):
    roll_node, fake = node
    pve.vm(VM_ID).start_error = "QEMU exited with code 1"
    pve.vm_changed(VM_ID, {"memory": 8192})
    with pytest.raises(RollError, match="QEMU exited with code 1"):
        _apply(credentials, roll_node, pve, {"memory_mib": (4096, 8192)}, [])
    assert pve.vm(VM_ID).status == "stopped" and not fake.is_up  # left down, drained, its config still pending

    pve.vm(VM_ID).start_error = None
    events, before = [], len(pve.requests)
    _apply(credentials, roll_node, pve, {"memory_mib": (4096, 8192)}, events)
    # No health gate before (the node is down) and no second shutdown: a start, then the node healthy
    assert events == ["vm-found-stopped (starting it to apply memory 4096 -> 8192)", "vm-started", "healthy"]
    vm = f"/api2/json/nodes/{PVE_HOST}/qemu/{VM_ID}"
    calls = [(method, path) for method, path, _ in pve.requests[before:]]
    assert calls[:2] == [("GET", f"{vm}/status/current"), ("POST", f"{vm}/status/start")]
    assert len(fake.calls_for("Shutdown")) == 1 and fake.is_up
    assert pve.vm(VM_ID).config["memory"] == 8192 and pve.vm(VM_ID).pending == {}
    assert [e.what for e in pve.power_events] == ["off", "up"]


def test_a_node_that_does_not_come_back_stops_the_roll_naming_it(node, credentials):
    roll_node, fake = node
    with serve_proxmox(boot_seconds=30) as pve:  # boots long after the roll's deadline
        pve.run_guest(VM_ID, "cp-1", fake, config={"cores": 2})
        pve.vm_changed(VM_ID, {"cores": 4})
        with pytest.raises(RollError, match=r"^node cp-1 \(10\.5\.0\.1\): not healthy after"):
            _apply(credentials, roll_node, pve, {"cores": (2, 4)}, [], timeout=3.0)
        assert [e.what for e in pve.power_events] == ["off"]


# --- through the NodeLifecycle provider, with the stack's Proxmox credentials ---------------------

def _props(bundle, roll_node, vm, **changes):
    talosconfig = make_talosconfig(bundle, "test", [roll_node.endpoint])
    return {"node_name": "cp-1", "address": roll_node.address, "endpoint": roll_node.endpoint, "role": "controlplane",
            "installer_image": f"factory.talos.dev/installer/{seed.SCHEMATIC}:v1.12.6", "talos_version": "v1.12.6",
            "kubernetes_version": "1.34.1", "timeout_seconds": 10, "reset_on_delete": True, "talosconfig": talosconfig,
            "vm": vm, "vm_id": VM_ID, "position": "1 of 1",
            "machine_configuration": "version: v1alpha1\nmachine:\n  type: controlplane\n", **changes}


def _configured(config):
    from pulumi.dynamic import Config, ConfigureRequest

    provider = NodeLifecycleProvider()
    provider.configure(ConfigureRequest(Config(raw_config=config, project_name="talos-proxmox")))
    return provider


def test_the_provider_rolls_a_memory_change_with_the_stacks_proxmox_token(node, pve, bundle, capfd):
    roll_node, fake = node
    provider = _configured(pve.provider_config())
    olds = provider.create(_props(bundle, roll_node, OLD)).outs
    pve.vm_changed(VM_ID, {"memory": 8192})
    new = {**OLD, "memory_mib": 8192}
    assert provider.diff("id", olds, _props(bundle, roll_node, new)).changes is True
    outs = provider.update("id", olds, _props(bundle, roll_node, new)).outs
    assert outs["vm"]["memory_mib"] == 8192 and fake.reboots == 1
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("talos-proxmox: hardware")]
    assert [line.split(": ", 2)[1] for line in lines] == ["hardware cp-1 (1 of 1)"] * 6
    # the stand-in node hands out no kubeconfig: the other nodes' readiness goes unchecked, said so, and it rolls
    assert lines[1].startswith("talos-proxmox: hardware cp-1 (1 of 1): other nodes not checked (no control plane "
                               "gave a kubeconfig (cp-1: KubeconfigError)) (")
    assert lines[2].startswith("talos-proxmox: hardware cp-1 (1 of 1): shutdown-requested (memory 4096 -> 8192; "
                               "pending: memory) (")
    assert TOKEN_SECRET not in err


def test_without_proxmox_credentials_the_roll_stops_before_the_node_is_touched(node, bundle, monkeypatch):
    roll_node, fake = node
    for variable in ("PROXMOX_VE_ENDPOINT", "PROXMOX_VE_API_TOKEN", "PROXMOX_VE_USERNAME", "PROXMOX_VE_PASSWORD"):
        monkeypatch.delenv(variable, raising=False)
    provider = _configured({})
    olds = provider.create(_props(bundle, roll_node, OLD)).outs
    with pytest.raises(RollError) as failed:
        provider.update("id", olds, _props(bundle, roll_node, {**OLD, "cores": 4}))
    assert str(failed.value) == ("node cp-1 (10.5.0.1): its VM's hardware changed, which rolls through the Proxmox "
                                 "API: proxmoxve:endpoint is not set (nor PROXMOX_VE_ENDPOINT): expected the Proxmox "
                                 "API's URL, e.g. https://pve.lab.local:8006/")
    assert fake.reboots == 0


def test_a_long_power_off_prints_a_line_while_it_lasts():
    """Polled on an injected clock: one line per `every` seconds of waiting, then done once stopped."""
    statuses = iter(["running"] * 7 + ["stopped"])

    class Api:  # the one call wait_stopped makes: GET nodes/{host}/qemu/{id}/status/current
        def nodes(self, _host):
            return self

        def qemu(self, _vm_id):
            return self

        @property
        def status(self):
            return self

        @property
        def current(self):
            return self

        def get(self):
            return {"status": next(statuses)}

    now, lines = [0.0], []

    def sleep(seconds):
        now[0] += seconds

    vms.wait_stopped(Api(), vms.VmRef(PVE_HOST, VM_ID), timeout=60, sleep=sleep, clock=lambda: now[0],
                     still_running=lambda: lines.append(now[0]), every=3)
    assert lines == [3.0, 6.0]


def test_a_node_beside_one_that_is_not_ready_is_not_shut_down(node, pve, credentials):
    roll_node, fake = node
    pve.vm_changed(VM_ID, {"memory": 8192})
    kube = StandInApi([([k8s_node("cp-1", True), k8s_node("worker-2", False, "NodeStatusUnknown", "Kubelet stopped "
                                                           "posting node status.")], coredns(2))])
    try:
        with pytest.raises(RollError, match=r"^node cp-1 \(10\.5\.0\.1\): not taken down: node worker-2 is not "
                                            r"Ready \(NodeStatusUnknown: .*\) after 1s"):
            _apply(credentials, roll_node, pve, {"memory_mib": (4096, 8192)}, [], preflight_timeout=1,
                   kube=lambda: KubeApi(read_kubeconfig(kube.kubeconfig())))
    finally:
        kube.close()
    assert fake.calls_for("Shutdown") == [] and pve.vm(VM_ID).status == "running"
    assert pve.vm(VM_ID).pending == {"memory": 8192}  # still waiting for a roll that may take the node down


def test_without_a_kubernetes_api_the_hardware_still_rolls(node, pve, credentials):
    """A cluster whose API is down may need this very change (more memory for its control planes)."""
    roll_node, fake = node
    pve.vm_changed(VM_ID, {"memory": 8192})
    _apply(credentials, roll_node, pve, {"memory_mib": (4096, 8192)}, [], kube=lambda: None)
    assert pve.vm(VM_ID).config["memory"] == 8192 and len(fake.calls_for("Shutdown")) == 1
