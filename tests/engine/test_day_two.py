"""Day two through the real Pulumi CLI (the engine tier, tests/engine/): `pulumi preview` and `pulumi up`
of the real program after the cluster exists.

Same stand-ins as tests/engine/test_first_deploy_and_day_two.py: one FakeTalosNode per node on 127.0.0.42-45:50000 (three
control planes sharing one etcd member list, one worker, each in the VM the Proxmox provider stand-in
made through fakepve's PVE API), the Image Factory and the Kubernetes API stand-ins. The ups, in order:
  first       a new cluster on Talos v1.13.7, Kubernetes 1.35.4;
  kubernetes  cluster.kubernetesVersion 1.36.3, as talosctl upgrade-k8s makes it: the new images pre-pulled,
              kube-apiserver on every control plane, then kube-controller-manager, then kube-scheduler
              (each Ready at its new config version before the next), kube-proxy's image, then each
              node's new configuration (its kubelet) one at a time, control planes first, healthy and its
              Node reporting the new kubelet before the next; then the bootstrap manifests synced
              (kube-proxy's DaemonSet to the new version);
  hardware    every node from 2 to 4 cores and 4096 to 6144 MiB: the provider PUTs each VM's new config,
              which PVE keeps pending, then in roll order each node is shut down through Talos (drained)
              and its VM started through the PVE API, healthy before the next;
  failed      Talos v1.13.8 (pull, install, drain, reboot, uncordon) while e2e-cp-2 fails its health check
              after its upgrade: the up fails naming it, e2e-cp-2 is uncordoned all the same, later nodes
              are not upgraded, e2e-cp-1 stays upgraded in the state;
  resumed     the same up once e2e-cp-2 is well again: it continues at e2e-cp-2, not at e2e-cp-1;
  cp_removed  e2e-cp-3 taken out of the stack: it leaves etcd, then is reset, then its VM is destroyed;
  unreachable e2e-cp-2 powered off, then taken out of the stack: its etcd member is removed through
              e2e-cp-1, no reset is attempted, and the up succeeds;
  renamed, new_vm_ids, shrunk  refused in the preview, before any PVE request or node call:
              cluster.name, two nodes' vmIds at once, e2e-cp-1's disk;
  datastore, secure_boot, nocloud, bridge, data_disks, grown_with_cores  refused the same way: what the
              real Proxmox provider refuses on a running VM half-way through an up (moving disks, the TPM
              state, the cloud-init drive; a disk grown beside a cores change), or PVE applies to every
              running VM at once (a bridge, data disks on two nodes).
"""

from __future__ import annotations

import time

import grpc
import pytest
import yaml

from talos_proxmox.talos_api.client import read_talosconfig
from tests.support.day_two import upgrade_timeline
from tests.engine.cluster import EngineUp, engine_cluster, engine_stack
from tests.stand_ins.talos_api import FakeTalosNode, RecordedCall

pytestmark = pytest.mark.engine

CP1, CP2, CP3, WORKER = "e2e-cp-1", "e2e-cp-2", "e2e-cp-3", "e2e-worker-1"
NODES = [(CP1, "controlplane", "127.0.0.42"), (CP2, "controlplane", "127.0.0.43"),
         (CP3, "controlplane", "127.0.0.44"), (WORKER, "worker", "127.0.0.45")]
ROLL_ORDER = [CP1, CP2, CP3, WORKER]
TALOS, UPGRADE = "v1.13.7", "v1.13.8"
KUBERNETES, NEW_KUBERNETES = "1.35.4", "1.36.3"
HEALTH_FAILURE = "service kubelet: failed to start after upgrade (stand-in)"
CP2_MEMBER_ID = 0x101  # the shared etcd's member ids are 0x100 + the node's index
BIGGER = {"cpu": 4, "memory": 6144}  # the dev stack's nodes have 2 cores and 4096 MiB
VM_IDS = {name: 9100 + int(ip.rsplit(".", 1)[1]) for name, _, ip in NODES}  # as e2e_config numbers them
ORDER = ["first", "kubernetes", "hardware", "failed", "resumed", "cp_removed", "unreachable"]


def fail_health_after_upgrade(fake: FakeTalosNode) -> None:
    """From its next install of an upgrade on (done as Talos does), the node's health check (ServiceList)
    fails hard."""

    def upgrade(node: FakeTalosNode, request, context):
        node.behaviours["ServiceList"] = failing_service_list
        return FakeTalosNode._rpc_LifecycleService_Upgrade(node, request, context)

    def failing_service_list(_node, _request, context):
        context.abort(grpc.StatusCode.INTERNAL, HEALTH_FAILURE)

    fake.behaviours["LifecycleService/Upgrade"] = upgrade


def recover(fake: FakeTalosNode) -> None:
    for rpc in ("LifecycleService/Upgrade", "ServiceList"):
        fake.behaviours.pop(rpc, None)


@pytest.fixture(scope="module")
def ups(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("engine-day-two")
    with engine_cluster(tmp, NODES, TALOS) as (cluster, project):
        def deploy(name, nodes, talos, fails=False, **options):
            config = engine_stack(cluster, nodes, talos, tmp / "secrets.yaml", **options)
            return cluster.deploy(project, config, tmp / f"render-{name}", fails=fails)

        done = {"first": deploy("first", NODES, TALOS, kubernetes_version=KUBERNETES)}
        done["kubernetes"] = deploy("kubernetes", NODES, TALOS, kubernetes_version=NEW_KUBERNETES)
        kube_api = cluster.kubernetes.kube
        done["after_kubernetes"] = {
            "static_pod_updates": {name: list(cluster.nodes[name].static_pod_updates) for name in ROLL_ORDER},
            "nodes": {n["metadata"]["name"]: n for n in kube_api.request("GET", "/api/v1/nodes").json()["items"]},
            "kube-proxy": kube_api.request("GET", "/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy").json(),
            "mirror_pods": kube_api.request("GET", "/api/v1/namespaces/kube-system/pods?labelSelector=tier%3D"
                                                   "control-plane").json()["items"],
            "static_pods": {name: dict(cluster.nodes[name].static_pods) for name in ROLL_ORDER}}
        done["hardware"] = deploy("hardware", NODES, TALOS, kubernetes_version=NEW_KUBERNETES, hardware=BIGGER)
        done["pve"] = cluster.pve
        # The VMs as the hardware up left them (later ups destroy some), and when it ended.
        done["hardware_vms"] = {name: (dict(vm.config), dict(vm.pending))
                                for name in ROLL_ORDER for vm in [cluster.pve.vm(VM_IDS[name])]}
        done["hardware_end"] = time.monotonic()
        done["kube"] = cluster.kubernetes.kube

        def deploy_now(name, nodes, fails=False, **config_changes):  # what the stack says from here on
            config = engine_stack(cluster, nodes, UPGRADE, tmp / "secrets.yaml", kubernetes_version=NEW_KUBERNETES,
                                  hardware=BIGGER)
            for change in config_changes.get("edits", ()):
                change(config)
            return cluster.deploy(project, config, tmp / f"render-{name}", fails=fails)

        fail_health_after_upgrade(cluster.nodes[CP2])
        done["failed"] = deploy_now("failed", NODES, fails=True)
        recover(cluster.nodes[CP2])
        done["resumed"] = deploy_now("resumed", NODES)
        without_cp3 = [node for node in NODES if node[0] != CP3]
        done["cp_removed"] = deploy_now("cp_removed", without_cp3)
        cluster.nodes[CP2].go_down()
        without_cp2 = [node for node in without_cp3 if node[0] != CP2]
        done["unreachable"] = deploy_now("unreachable", without_cp2)
        done["etcd"] = {name: [m.hostname for m in cluster.nodes[name].etcd_members] for name in (CP1, CP2, CP3)}

        def rename(config):
            config["cluster"]["name"] = "prod"

        def new_vm_ids(config):
            config["nodes"][0]["vmId"], config["nodes"][1]["vmId"] = 9202, 9205  # e2e-cp-1 and the worker

        def shrink(config):
            config["nodes"][0]["disk"] = 10  # e2e-cp-1, 20 GiB

        def section(key, **values):
            def edit(config):
                config[key] = {**config.get(key, {}), **values}
            return edit

        def data_disks(config):
            for node in config["nodes"]:
                node["dataDisk"] = {"size": 50}

        def grown_with_cores(config):
            config["nodes"][0].update(disk=30, cpu=6)

        done["renamed"] = deploy_now("renamed", without_cp2, fails=True, edits=[rename])
        done["new_vm_ids"] = deploy_now("new_vm_ids", without_cp2, fails=True, edits=[new_vm_ids])
        done["shrunk"] = deploy_now("shrunk", without_cp2, fails=True, edits=[shrink])
        done["datastore"] = deploy_now("datastore", without_cp2, fails=True,
                                       edits=[section("proxmox", vmDatastore="ceph-vm")])
        done["secure_boot"] = deploy_now("secure_boot", without_cp2, fails=True,
                                         edits=[section("image", secureBoot=True)])
        done["nocloud"] = deploy_now("nocloud", without_cp2, fails=True, edits=[section("image", platform="nocloud")])
        done["bridge"] = deploy_now("bridge", without_cp2, fails=True, edits=[section("proxmox", bridge="vmbr1")])
        done["data_disks"] = deploy_now("data_disks", without_cp2, fails=True, edits=[data_disks])
        done["grown_with_cores"] = deploy_now("grown_with_cores", without_cp2, fails=True, edits=[grown_with_cores])
        yield done


def rpcs(calls: list[RecordedCall], *names: str) -> list[RecordedCall]:
    return [call for call in calls if call.rpc in names]


def kubelet_image(config: bytes) -> str:
    [v1alpha1] = [d for d in yaml.safe_load_all(config) if isinstance(d, dict) and d.get("version") == "v1alpha1"]
    return v1alpha1["machine"]["kubelet"]["image"]


def pve_requests_during(ups: dict, name: str) -> list[tuple]:
    """The PVE requests made during the up `name` (its preview included)."""
    before = ups[ORDER[ORDER.index(name) - 1]].pve_requests
    return ups["pve"].requests[before:ups[name].pve_requests]


def test_each_preview_calls_no_one_and_plans_what_its_up_does(ups):
    counts = {"factory": 0, "pve": 0, **{n: 0 for n in ROLL_ORDER}}
    for name in ORDER:
        up: EngineUp = ups[name]
        assert up.after_preview == counts, name
        counts = {"factory": 1, "pve": up.pve_requests, **{n: len(c) for n, c in up.calls.items()}}
        if name == "failed":  # the up stops at the failing node: it takes a part of the plan
            assert set(up.up.changes().items()) < set(up.preview.changes().items())
        elif name == "resumed":  # and it finishes what the failed up left: the old ISO's (retained) delete
            assert up.up.changes() == {**up.preview.changes(), "image-iso": "delete-replaced"}
        else:
            assert up.up.changes() == up.preview.changes(), name


# --- Kubernetes 1.36.2 -> 1.36.3 ------------------------------------------------------------------


def test_kubernetes_change_updates_each_nodes_config_and_apply_and_the_upgrade_only(ups):
    up = ups["kubernetes"]
    assert up.steps("update") == {f"{kind}-{name}" for kind in ("machineconfig", "apply") for name in ROLL_ORDER} | {
        "node-changes", "kubernetes-upgrade"}  # node-changes records the version
    assert up.steps("create") == up.steps("delete") == set()
    assert {"secrets", "talosconfig", "bootstrap", "kubeconfig"} | {f"lifecycle-{n}" for n in ROLL_ORDER} <= \
        up.steps("same")
    assert up.outputs == ups["first"].outputs
    for name in ROLL_ORDER:
        assert not rpcs(up.new_calls(ups["first"], name), "Upgrade", "ImageService/Pull", "LifecycleService/Upgrade",
                        "Bootstrap", "Reset", "Reboot"), name


def test_kubernetes_images_are_pre_pulled_before_any_node_changes(ups):
    first, up = ups["first"], ups["kubernetes"]
    new = {name: up.new_calls(first, name) for name in ROLL_ORDER}
    pulls = sorted((c.at, name, c.request.reference) for name in ROLL_ORDER for c in rpcs(new[name], "ImagePull"))
    first_apply = min(c.at for name in ROLL_ORDER for c in rpcs(new[name], "ApplyConfiguration"))
    assert pulls and max(at for at, _, _ in pulls) < first_apply
    control_plane_images = [f"registry.k8s.io/{c}:v{NEW_KUBERNETES}"
                            for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")]
    assert [(name, image) for _, name, image in pulls] == \
        [(cp, image) for image in control_plane_images for cp in (CP1, CP2, CP3)] + \
        [(name, f"ghcr.io/siderolabs/kubelet:v{NEW_KUBERNETES}") for name in ROLL_ORDER]
    namespaces = {c.request.reference.split("/")[0]: c.request.namespace for name in ROLL_ORDER
                  for c in rpcs(new[name], "ImagePull")}
    assert namespaces == {"registry.k8s.io": 2, "ghcr.io": 1}  # NS_CRI, NS_SYSTEM


def test_every_api_server_is_upgraded_before_any_controller_manager_and_those_before_any_scheduler(ups):
    seen = ups["after_kubernetes"]
    updates = sorted((at, component, name) for name in (CP1, CP2, CP3)
                     for at, component, image in seen["static_pod_updates"][name]
                     if image.endswith(f":v{NEW_KUBERNETES}") and at > ups["first"].ended)
    assert [(component, name) for _, component, name in updates] == [
        (component, name) for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
        for name in (CP1, CP2, CP3)]
    # each mirror pod in the API server runs the new image at the config version its node rendered last
    pods = {pod["metadata"]["name"]: pod for pod in seen["mirror_pods"]}
    for name in (CP1, CP2, CP3):
        for component, (image, version) in seen["static_pods"][name].items():
            pod = pods[f"{component}-{name}"]
            assert image == f"registry.k8s.io/{component}:v{NEW_KUBERNETES}"
            assert (pod["spec"]["containers"][0]["image"], pod["metadata"]["annotations"]["talos.dev/config-version"]) \
                == (image, str(version)) and version == 2


def test_each_node_takes_its_new_kubelet_one_at_a_time_after_the_control_plane_components(ups):
    first, up = ups["first"], ups["kubernetes"]
    new = {name: up.new_calls(first, name) for name in ROLL_ORDER}
    last_scheduler = max(at for name in (CP1, CP2, CP3) for at, component, _ in ups["after_kubernetes"][
        "static_pod_updates"][name] if component == "kube-scheduler" and at > first.ended)
    arrived = {}
    for name in ROLL_ORDER:
        whole = [c for c in rpcs(new[name], "ApplyConfiguration") if c.request.data == up.rendered[name]]
        assert whole and all((c.mode, c.roles) == ("configured", ("os:admin",)) for c in whole), name
        assert kubelet_image(first.rendered[name]).endswith(f":v{KUBERNETES}"), name
        assert kubelet_image(up.rendered[name]) == f"ghcr.io/siderolabs/kubelet:v{NEW_KUBERNETES}", name
        arrived[name] = whole[0].at
        # a control plane's earlier applies were its running configuration with one image changed, no reboot
        partial = [c for c in rpcs(new[name], "ApplyConfiguration") if c.at < whole[0].at]
        assert [c.request.mode for c in partial] == ([2, 2, 2, 2] if name != WORKER else []), name
    assert [arrived[name] for name in ROLL_ORDER] == sorted(arrived.values())
    assert last_scheduler < arrived[CP1]
    for before, after in zip(ROLL_ORDER, ROLL_ORDER[1:]):
        # healthy again (services listed after its new config) before the next node gets its own
        checked = [c.at for c in rpcs(new[before], "ServiceList") if c.at > arrived[before]]
        assert checked and min(checked) < arrived[after], (before, after)
    nodes = ups["after_kubernetes"]["nodes"]
    assert {name: nodes[name]["status"]["nodeInfo"]["kubeletVersion"] for name in ROLL_ORDER} == {
        name: f"v{NEW_KUBERNETES}" for name in ROLL_ORDER}


def test_the_bootstrap_manifests_are_synced_after_the_upgrade(ups):
    proxy = ups["after_kubernetes"]["kube-proxy"]
    assert proxy["spec"]["template"]["spec"]["containers"][0]["image"] == f"registry.k8s.io/kube-proxy:v{NEW_KUBERNETES}"
    assert proxy["metadata"]["annotations"]["config.k8s.io/owning-inventory"] == "talos-bootstrap-manifests-inventory"
    printed = "".join(ups["kubernetes"].up.diagnostics("info#err")) + ups["kubernetes"].up.stderr
    assert "manifests: Configured DaemonSet kube-system/kube-proxy" in printed
    assert (f'+spec.template.spec.containers[0].image: "registry.k8s.io/kube-proxy:v{NEW_KUBERNETES}"') in printed
    # CoreDNS was made by Talos's bootstrap: the first sync adopts it (the inventory's annotation, nothing else,
    # since the Talos version, and with it CoreDNS's, is the same)
    synced = [line.split("manifests: ", 1)[1] for line in printed.splitlines() if "talos-proxmox: manifests: " in line]
    coredns = synced.index("Configured Deployment kube-system/coredns")
    assert synced[coredns + 1] == '  +metadata.annotations.config.k8s.io/owning-inventory: "talos-bootstrap-manifests-inventory"'
    assert "coredns/coredns:" not in printed
    # the order the progress lines came in: API servers, controller managers, schedulers, kubelets, manifests
    lines = [line for line in printed.splitlines() if "talos-proxmox: kubernetes" in line or "talos-proxmox: manifests:" in line]
    steps = [next(step for step in ("pre-pull", "kube-apiserver ->", "kube-controller-manager ->", "kube-scheduler ->",
                                    "kube-proxy ->", "kubelet ->", "manifests:") if step in line)
             for line in lines if any(step in line for step in ("pre-pull", "->", "manifests:"))]
    assert steps == sorted(steps, key=["pre-pull", "kube-apiserver ->", "kube-controller-manager ->", "kube-scheduler ->",
                                       "kube-proxy ->", "kubelet ->", "manifests:"].index), lines


# --- 2 -> 4 cores, 4096 -> 6144 MiB on every node --------------------------------------------------


def test_hardware_change_updates_each_vm_and_lifecycle_and_no_talos_config(ups):
    up = ups["hardware"]
    assert up.steps("update") == {*ROLL_ORDER, *(f"lifecycle-{name}" for name in ROLL_ORDER), "node-changes"}
    assert {f"{kind}-{name}" for kind in ("machineconfig", "apply") for name in ROLL_ORDER} <= up.steps("same")
    for name in ROLL_ORDER:
        assert up.resource(name)["inputs"]["cpu"]["cores"] == 4, name
        assert up.resource(f"lifecycle-{name}")["outputs"]["vm"]["memory_mib"] == 6144, name
        # Talos is asked for its health and to shut down (drained), and a control plane for the kubeconfig through
        # which each roll reads the other Nodes' readiness first; nothing else: no apply, no upgrade
        calls = up.new_calls(ups["kubernetes"], name)
        assert {c.rpc for c in calls} <= {"ServiceList", "EtcdMemberList", "Get", "Version", "Shutdown",
                                          *(("Kubeconfig",) if name.startswith("e2e-cp") else ())}, name
        assert bool(rpcs(calls, "Kubeconfig")) == name.startswith("e2e-cp"), name  # its own step asks itself first
        [shutdown] = rpcs(calls, "Shutdown")
        assert (shutdown.request.force, shutdown.roles) == (False, ("os:admin",)), name


def test_hardware_change_puts_each_vms_config_then_starts_each_through_proxmox_in_roll_order(ups):
    vm = "/api2/json/nodes/pve/qemu/{}"
    requests = pve_requests_during(ups, "hardware")
    puts = [(path, body) for method, path, body in requests if method == "PUT"]
    # the real provider's update of each running VM (bpg's vmUpdate: the whole CPU and memory blocks, the
    # name, deletes of unset CPU limits), one PUT each, which PVE keeps pending until the VM starts
    assert sorted(puts) == sorted((vm.format(VM_IDS[name]) + "/config",
                                   b"balloon=0&cores=4&cpu=host&delete=vcpus%2Ccpulimit&memory=6144&name=" +
                                   name.encode() + b"&numa=0&sockets=1") for name in ROLL_ORDER)
    starts = [path for method, path, _ in requests if method == "POST" and path.endswith("/status/start")]
    assert starts == [vm.format(VM_IDS[name]) + "/status/start" for name in ROLL_ORDER]
    assert max(i for i, r in enumerate(requests) if r[0] == "PUT") < min(
        i for i, r in enumerate(requests) if r[1].endswith("/status/start"))
    for name in ROLL_ORDER:
        config, pending = ups["hardware_vms"][name]
        assert (int(config["cores"]), int(config["memory"])) == (4, 6144), name
        assert pending == {}, name


def test_hardware_change_never_has_two_nodes_down_and_each_is_healthy_before_the_next(ups):
    up, pve = ups["hardware"], ups["pve"]
    assert pve.most_down_at_once(ROLL_ORDER, until=ups["hardware_end"]) == 1
    events = {(e.name, e.what): e.at for e in pve.power_events if e.at <= ups["hardware_end"]}
    for before, after in zip(ROLL_ORDER, ROLL_ORDER[1:]):
        assert events[(before, "up")] < events[(after, "off")], (before, after)
        checked = [c.at for c in rpcs(up.new_calls(ups["kubernetes"], before), "ServiceList")
                   if events[(before, "up")] < c.at < events[(after, "off")]]
        assert checked, f"{before} was not seen healthy before {after} went down"


# --- a Talos upgrade that stops at a failing node, then resumes -----------------------------------


def test_failed_upgrade_names_the_failing_node_and_upgrades_no_later_node(ups):
    before, failed = ups["hardware"], ups["failed"]
    assert failed.up.returncode != 0
    assert "e2e-cp-2 (127.0.0.43)" in failed.error and HEALTH_FAILURE in failed.error
    upgrades = {name: rpcs(failed.new_calls(before, name), "LifecycleService/Upgrade") for name in ROLL_ORDER}
    assert {name: len(calls) for name, calls in upgrades.items()} == {CP1: 1, CP2: 1, CP3: 0, WORKER: 0}
    assert upgrades[CP1][0].at < upgrades[CP2][0].at
    for name in (CP3, WORKER):
        assert failed.new_calls(before, name) == [], name  # not even a health check
    # e2e-cp-2 was drained and rebooted; once its health failed, it was uncordoned all the same
    since = upgrades[CP2][0].at
    until = min(c.at for name in ROLL_ORDER for c in ups["resumed"].new_calls(failed, name))
    assert upgrade_timeline({CP2: failed.new_calls(before, CP2)}, ups["kube"].changes(), since, until,
                            by_deployment=True, namespaces={"default"}) == [
        (CP2, "LifecycleService/Upgrade"), ("kubernetes", f"cordon {CP2}"), ("kubernetes", f"evict default/app-{CP2}"),
        (CP2, "Reboot"), ("kubernetes", f"uncordon {CP2}")]


def test_failed_upgrade_keeps_the_first_node_upgraded_in_the_state(ups):
    failed = ups["failed"]
    installer = ups["resumed"].outputs["installerImage"]
    assert installer.endswith(f":{UPGRADE}")
    images = {name: failed.resource(f"lifecycle-{name}")["outputs"]["installer_image"] for name in ROLL_ORDER}
    assert images[CP1] == installer
    assert all(images[name] != installer for name in (CP2, CP3, WORKER)), images
    assert "lifecycle-e2e-cp-1" in failed.steps("update")
    assert not {f"lifecycle-{name}" for name in (CP2, CP3, WORKER)} & failed.steps("update")


def test_rerun_after_recovery_continues_at_the_failed_node(ups):
    """cp-2 had rebooted into the new version before its health failed: once healthy again it is not
    upgraded (rebooted) a second time; the roll checks it and goes on with the nodes after it."""
    failed, resumed = ups["failed"], ups["resumed"]
    upgrades = {name: rpcs(resumed.new_calls(failed, name), "LifecycleService/Upgrade") for name in ROLL_ORDER}
    assert {name: len(calls) for name, calls in upgrades.items()} == {CP1: 0, CP2: 0, CP3: 1, WORKER: 1}
    cp2_checks = rpcs(resumed.new_calls(failed, CP2), "ServiceList")
    assert cp2_checks and cp2_checks[-1].at < upgrades[CP3][0].at < upgrades[WORKER][0].at
    assert "lifecycle-e2e-cp-1" in resumed.steps("same")
    assert resumed.steps("update") >= {f"lifecycle-{name}" for name in (CP2, CP3, WORKER)}
    installer = resumed.outputs["installerImage"]
    for name in ROLL_ORDER:
        assert resumed.resource(f"lifecycle-{name}")["outputs"]["installer_image"] == installer, name


# --- a control plane removed ----------------------------------------------------------------------


def test_removed_control_plane_leaves_etcd_then_is_reset_before_its_vm_goes(ups):
    before, removed = ups["resumed"], ups["cp_removed"]
    assert removed.steps("delete") == {CP3, f"machineconfig-{CP3}", f"lifecycle-{CP3}", f"apply-{CP3}"}
    assert removed.steps("create") == set()
    calls = removed.new_calls(before, CP3)
    [leave] = rpcs(calls, "EtcdLeaveCluster")
    [reset] = rpcs(calls, "Reset")
    assert (reset.request.graceful, reset.request.reboot, reset.roles) == (True, False, ("os:admin",))
    [destroyed] = [e.at for e in ups["pve"].vm_events if (e.vm_id, e.what) == (VM_IDS[CP3], "destroyed")]
    assert leave.at < reset.at < destroyed  # the VM goes last
    assert not rpcs(calls, "EtcdRemoveMemberByID")
    deleted = [name for op, name in removed.up.started() if op == "delete"]
    assert deleted.index(f"lifecycle-{CP3}") < deleted.index(CP3)


def test_removing_a_control_plane_calls_no_other_node_and_drops_it_from_the_talosconfig(ups):
    before, removed = ups["resumed"], ups["cp_removed"]
    # Beyond a Kubeconfig from a remaining control plane (to delete the Node object), nothing.
    for name in (CP1, CP2, WORKER):
        assert {c.rpc for c in removed.new_calls(before, name)} <= ({"Kubeconfig"} if name != WORKER else set()), name
    assert read_talosconfig(removed.outputs["talosconfig"]).endpoints == ("127.0.0.42", "127.0.0.43")
    assert removed.steps("update") == {"talosconfig", "node-changes", "nodes-installed"}
    assert removed.outputs["kubeconfig"] == before.outputs["kubeconfig"]


def test_unreachable_control_plane_is_removed_through_another_and_not_reset(ups):
    before, removed = ups["cp_removed"], ups["unreachable"]
    assert removed.up.returncode == 0
    assert removed.steps("delete") == {CP2, f"machineconfig-{CP2}", f"lifecycle-{CP2}", f"apply-{CP2}"}
    # a quick look at which peers answer (Version), then the removal through the one that does
    cp1_calls = removed.new_calls(before, CP1)
    assert {c.rpc for c in cp1_calls} == {"Version", "EtcdMemberList", "EtcdRemoveMemberByID", "Kubeconfig"}
    assert rpcs(cp1_calls, "Version")[0].at < rpcs(cp1_calls, "EtcdMemberList")[0].at
    [removal] = rpcs(cp1_calls, "EtcdRemoveMemberByID")
    assert (removal.request.member_id, removal.roles) == (CP2_MEMBER_ID, ("os:admin",))
    assert all(not rpcs(removed.new_calls(before, name), "Reset", "EtcdLeaveCluster") for name in ROLL_ORDER)
    assert removed.new_calls(before, WORKER) == []
    assert ups["etcd"][CP1] == [CP1]
    assert read_talosconfig(removed.outputs["talosconfig"]).endpoints == ("127.0.0.42",)


# --- refused in the preview -----------------------------------------------------------------------


# (the up, the one before it, what its refusal must say); cluster.name is in every node's config, keys
# discovery and owns the protected secrets; a VM made anew is a node removed and added, one per up.
REFUSALS = [
    ("renamed", "unreachable", ["talos-proxmox:cluster.name: 'prod' renames the deployed cluster 'dev'"]),
    ("new_vm_ids", "renamed", ["nodes e2e-cp-1 (vmId 9142 -> 9202), e2e-worker-1 (vmId 9145 -> 9205) would each "
                               "have their VM replaced in one up", "so replace one node per `pulumi up`"]),
    ("shrunk", "new_vm_ids", ["node e2e-cp-1: disk 20 -> 10 GiB: Proxmox cannot shrink a disk"]),
    # What the real Proxmox provider refuses on a running VM after the up's earlier changes have landed, or
    # what PVE applies to every running VM at once: refused before any of it.
    ("datastore", "shrunk", ["proxmox.vmDatastore 'local-lvm' -> 'ceph-vm' would change the VMs of e2e-cp-1, "
                             "e2e-worker-1", "cannot move disks between datastores while the VM is running",
                             "keep proxmox.vmDatastore: 'local-lvm' for this cluster"]),
    ("secure_boot", "datastore", ["image.secureBoot False -> True would change the VMs of e2e-cp-1, e2e-worker-1",
                                  "cannot add, remove, or update the TPM device while the VM is running"]),
    ("nocloud", "secure_boot", ["image.platform 'metal' -> 'nocloud' would change the VMs of e2e-cp-1, e2e-worker-1",
                                "cannot move the Cloud-Init drive while the VM is running"]),
    ("bridge", "nocloud", ["proxmox.bridge 'vmbr0' -> 'vmbr1' would change the VMs of e2e-cp-1, e2e-worker-1",
                           "drop off the network together"]),
    ("data_disks", "bridge", ["nodes e2e-cp-1, e2e-worker-1 would each get a data disk in one up",
                              "add data disks one node per `pulumi up`"]),
    ("grown_with_cores", "data_disks", ["node e2e-cp-1: disk 20 -> 30 GiB and cpu 4 -> 6 in one up",
                                        "grow the disk in one `pulumi up`, then change cpu 4 -> 6 in the next"]),
]


@pytest.mark.parametrize("name, previous, reasons", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refused_in_the_preview_with_the_reason_before_any_pve_request_or_node_call(ups, name, previous, reasons):
    before, refused = ups[previous], ups[name]
    assert refused.stopped_in_preview
    for reason in reasons:
        assert reason in refused.error
    assert refused.pve_requests == before.pve_requests
    assert not set(ROLL_ORDER) & set(refused.up.changes())  # no VM was planned
    assert [e for e in ups["pve"].power_events if e.at > before.ended] == []  # no VM stopped or started
    for node in ROLL_ORDER:
        assert refused.new_calls(before, node) == [], node

