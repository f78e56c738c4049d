"""A node whose VM must be made anew, through the real Pulumi CLI (the engine tier, tests/engine/): a new
vmId, MAC or Proxmox host replaces the VM delete-before-replace, and the node goes as a node removed and
comes back as one added: the engine asks the node's lifecycle and apply for their diff with the VM's id
unknown, they answer with a replacement, so they are deleted first (etcd snapshot, etcd leave, reset),
then the old VM (stopped, destroyed through the PVE API), then the new VM boots the ISO, gets its first
apply in maintenance mode and installs, and the up waits for it. One such node per up, alone; anything
more is refused before any VM is touched.

The ups, in order, each after its preview, on three control planes and a worker:
  first        a new cluster on Talos v1.13.7;
  cp1_new_id   e2e-cp-1, the bootstrap node, vmId 9162 -> 9262: it rejoins etcd, with no second bootstrap;
  worker_mac   the worker's MAC changes: its machine config names the new MAC, which the new VM has;
  cp2_new_host e2e-cp-2 moves from Proxmox host pve to pve2 (the same vmId, on the new host);
  with_upgrade e2e-cp-3's vmId and the Talos version in one up: refused in the preview;
  cp1_removed  e2e-cp-1, the bootstrap node, taken out of the stack: it leaves etcd, and e2e-cp-2, now the
               first control plane, is not bootstrapped (the Bootstrap resource records it).
"""

from __future__ import annotations

import copy

import pytest

from tests.engine.cluster import EngineUp, engine_cluster, engine_stack
from tests.stand_ins.talos_api import RecordedCall

pytestmark = pytest.mark.engine

CP1, CP2, CP3, WORKER = "e2e-cp-1", "e2e-cp-2", "e2e-cp-3", "e2e-worker-1"
NODES = [(CP1, "controlplane", "127.0.0.62"), (CP2, "controlplane", "127.0.0.63"),
         (CP3, "controlplane", "127.0.0.64"), (WORKER, "worker", "127.0.0.65")]
TALOS, UPGRADE = "v1.13.7", "v1.13.8"
NEW_MAC = "bc:24:11:00:02:05"
OLD_WORKER_MAC = b"bc:24:11:00:01:41"  # e2e_config's MAC for 127.0.0.65
NODE_DOWN_RPCS = {"Reboot", "Upgrade", "LifecycleService/Upgrade", "Reset", "Shutdown", "EtcdLeaveCluster"}


def _node(config: dict, name: str) -> dict:
    return next(node for node in config["nodes"] if node["name"] == name)


@pytest.fixture(scope="module")
def ups(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("engine-vm-replacement")
    with engine_cluster(tmp, NODES, TALOS) as (cluster, project):
        cluster.pve.add_node("pve2")  # the Proxmox cluster's second host
        config = engine_stack(cluster, NODES, TALOS, tmp / "secrets.yaml")

        def deploy(name, stack, fails=False):
            return cluster.deploy(project, copy.deepcopy(stack), tmp / f"render-{name}", fails=fails)

        done = {"first": deploy("first", config)}
        _node(config, CP1)["vmId"] = 9262
        done["cp1_new_id"] = deploy("cp1_new_id", config)
        _node(config, WORKER)["mac"] = NEW_MAC
        done["worker_mac"] = deploy("worker_mac", config)
        _node(config, CP2)["proxmoxNode"] = "pve2"
        done["cp2_new_host"] = deploy("cp2_new_host", config)
        refused = copy.deepcopy(config)
        _node(refused, CP3)["vmId"] = 9264
        refused["cluster"]["talosVersion"] = UPGRADE
        done["with_upgrade"] = deploy("with_upgrade", refused, fails=True)
        done["etcd"] = etcd_members(cluster)
        config["nodes"] = [node for node in config["nodes"] if node["name"] != CP1]
        done["cp1_removed"] = deploy("cp1_removed", config)
        done["etcd_after_removal"] = etcd_members(cluster)
        done["pve"], done["kube"] = cluster.pve, cluster.kubernetes.kube
        yield done


def etcd_members(cluster) -> dict[str, list[str]]:
    return {name: sorted(m.hostname for m in cluster.nodes[name].etcd_members) for name in (CP1, CP2, CP3)}


def rpcs(calls: list[RecordedCall], *names: str) -> list[RecordedCall]:
    return [call for call in calls if call.rpc in names]


def replacement_steps(up: EngineUp) -> list[tuple[str, str]]:
    """(resource, op) of the replacement's deletes and creates, in the order the engine began them."""
    return [(name, op) for op, name in up.up.started() if op in ("delete-replaced", "create-replacement")]


def replacement_order_holds(up: EngineUp, name: str) -> None:
    """Dependents deleted before what they depend on, then the VM; the new VM before its lifecycle and apply."""
    lifecycle, apply = f"lifecycle-{name}", f"apply-{name}"
    assert replacement_steps(up) == [
        (apply, "delete-replaced"), (lifecycle, "delete-replaced"), (name, "delete-replaced"),
        (name, "create-replacement"), (lifecycle, "create-replacement"), (apply, "create-replacement")], name


# --- the bootstrap control plane in a new VM --------------------------------------------------------

def test_the_preview_plans_the_nodes_replacement_and_calls_no_one(ups):
    before, up = ups["first"], ups["cp1_new_id"]
    assert up.preview.changes() == {CP1: "replace", f"lifecycle-{CP1}": "replace", f"apply-{CP1}": "replace",
                                    "node-changes": "update", "nodes-installed": "update"}
    assert up.after_preview["pve"] == before.pve_requests
    for name, _, _ in NODES:
        assert up.after_preview[name] == len(before.calls[name]), name


def test_a_new_vm_id_replaces_the_node_dependents_first_and_the_rest_stays(ups):
    up = ups["cp1_new_id"]
    replacement_order_holds(up, CP1)
    assert up.up.changes() == up.preview.changes()
    assert up.up.steps()["bootstrap"] == "same"


def test_the_node_leaves_etcd_and_is_reset_before_its_vm_goes_then_installs_in_the_new_one(ups):
    before, up, pve = ups["first"], ups["cp1_new_id"], ups["pve"]
    calls = up.new_calls(before, CP1)
    [snapshot] = rpcs(calls, "EtcdSnapshot")
    [leave] = rpcs(calls, "EtcdLeaveCluster")
    [reset] = rpcs(calls, "Reset")
    [apply] = rpcs(calls, "ApplyConfiguration")
    assert (reset.request.graceful, reset.request.reboot) == (True, False)
    [destroyed] = [e.at for e in pve.vm_events if (e.vm_id, e.what) == (9162, "destroyed")]
    [made] = [e.at for e in pve.vm_events if (e.vm_id, e.what) == (9262, "made")]
    # The old VM is gone before the new one exists: never two VMs with the node's MAC.
    assert snapshot.at < leave.at < reset.at < destroyed < made < apply.at
    assert apply.mode == "maintenance" and apply.request.data == up.rendered[CP1]
    after_install = calls[calls.index(apply):]
    assert rpcs(after_install, "Version"), "the up did not wait for the node's install"
    # then for it to be healthy in the running cluster: its services, etcd as every member sees it
    assert rpcs(after_install, "ServiceList") and rpcs(after_install, "EtcdMemberList")
    assert pve.vm(9162) is None


def test_the_bootstrap_node_rejoins_etcd_without_a_second_bootstrap(ups):
    before, up = ups["first"], ups["cp1_new_id"]
    for name, _, _ in NODES:
        assert not rpcs(up.new_calls(before, name), "Bootstrap"), name
    assert ups["etcd"][CP2] == sorted([CP1, CP2, CP3])


def test_no_other_node_goes_down_while_one_is_replaced(ups):
    before, up = ups["first"], ups["cp1_new_id"]
    for name in (CP2, CP3, WORKER):
        # beyond a kubeconfig from a control plane to delete the old Node object, nothing
        assert {call.rpc for call in up.new_calls(before, name)} <= {"Kubeconfig"}, name
    deleted = [(c.name, c.code) for c in ups["kube"].changes() if (c.verb, c.resource) == ("delete", "nodes")]
    assert (CP1, 200) in deleted, deleted


# --- a worker with a new MAC; a control plane on another host ---------------------------------------

def test_a_new_mac_replaces_the_vm_and_the_new_config_names_it(ups):
    before, up = ups["cp1_new_id"], ups["worker_mac"]
    replacement_order_holds(up, WORKER)
    assert up.up.steps()[f"machineconfig-{WORKER}"] == "update"  # the LinkAliasConfig selects the new MAC
    calls = up.new_calls(before, WORKER)
    assert [call.rpc for call in rpcs(calls, *NODE_DOWN_RPCS)] == ["Reset"]  # a worker has no etcd to leave
    [apply] = rpcs(calls, "ApplyConfiguration")
    assert apply.mode == "maintenance" and NEW_MAC.encode() in apply.request.data
    assert OLD_WORKER_MAC not in apply.request.data
    assert [e.what for e in ups["pve"].vm_events if e.vm_id == 9165] == ["made", "destroyed", "made"]
    for name in (CP1, CP2, CP3):
        assert not rpcs(up.new_calls(before, name), *NODE_DOWN_RPCS), name


def test_a_new_host_makes_the_vm_there_with_the_same_id(ups):
    before, up = ups["worker_mac"], ups["cp2_new_host"]
    replacement_order_holds(up, CP2)
    pve = ups["pve"]
    assert [(e.what, e.vm_id) for e in pve.vm_events if e.name == CP2] == [
        ("made", 9163), ("destroyed", 9163), ("made", 9163)]
    assert pve.vm(9163).node == "pve2"
    requests = [(method, path) for method, path, _ in pve.requests[before.pve_requests:up.pve_requests]]
    assert requests.index(("POST", "/api2/json/nodes/pve/qemu/9163/status/stop")) < requests.index(
        ("DELETE", "/api2/json/nodes/pve/qemu/9163/")) < requests.index(("POST", "/api2/json/nodes/pve2/qemu"))
    assert [call.rpc for call in rpcs(up.new_calls(before, CP2), *NODE_DOWN_RPCS)] == ["EtcdLeaveCluster", "Reset"]
    assert ups["etcd"][CP1] == sorted([CP1, CP2, CP3])


# --- more than one node change with it: refused before any VM ---------------------------------------

def test_a_new_vm_with_an_upgrade_is_refused_in_the_preview_before_any_vm(ups):
    before, refused = ups["cp2_new_host"], ups["with_upgrade"]
    assert refused.stopped_in_preview
    assert ("node e2e-cp-3: vmId 9164 -> 9264 replaces its VM, which takes the node out of the cluster and back "
            "in; make that the only node change of its `pulumi up` (this one also changes: the Talos installer ") \
        in refused.error
    assert refused.pve_requests == before.pve_requests
    for name, _, _ in NODES:
        assert refused.new_calls(before, name) == [], name


# --- the bootstrap node taken out of the stack ------------------------------------------------------

def test_removing_the_bootstrap_node_bootstraps_no_other(ups):
    before, up = ups["with_upgrade"], ups["cp1_removed"]
    assert up.up.returncode == 0
    assert up.steps("delete") == {CP1, f"machineconfig-{CP1}", f"lifecycle-{CP1}", f"apply-{CP1}"}
    assert up.up.steps()["bootstrap"] == "update"
    assert up.resource("bootstrap")["outputs"]["node"] == "127.0.0.63"  # e2e-cp-2's address
    for name, _, _ in NODES:
        assert not rpcs(up.new_calls(before, name), "Bootstrap"), name
    assert [call.rpc for call in rpcs(up.new_calls(before, CP1), *NODE_DOWN_RPCS)] == ["EtcdLeaveCluster", "Reset"]
    assert ups["etcd_after_removal"][CP2] == sorted([CP2, CP3])
