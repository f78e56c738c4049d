"""`pulumi preview` and `pulumi up` of the real program through the real Pulumi CLI, six times over.

The engine tier (tests/engine/): .tools/bin/pulumi runs `__main__.py` through the Python language host,
our dynamic providers in the dynamic-provider host, and the Proxmox provider stand-in against fakepve,
on a local file backend with a passphrase secrets provider. The far side listens on loopback: the Image
Factory stand-in, the PVE API, one FakeTalosNode per node at 127.0.0.32-36:50000 (powered off until its
VM starts, then in maintenance mode until configured) and the cluster's Kubernetes API stand-in.

Each `up` is preceded by a `pulumi preview`, which must plan exactly the steps the `up` then takes
without calling any node. The first `up` makes the cluster; the second changes one worker's patch and
must re-apply to that worker only, over mutual TLS; the third, with nothing changed, must change
nothing; the fourth adds a worker (its VM made and started through the PVE API) and must touch only it;
the fifth upgrades Talos, one node at a time, control planes first; the sixth removes the added worker,
which must be reset before its VM is stopped and destroyed, every other node left alone. Last,
`pulumi destroy` is refused before anything is touched (cluster.deletionProtection).
"""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from urllib.parse import parse_qs
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from talos_proxmox.cluster_plan.resource_inputs import image_facts
from talos_proxmox.settings.stack import load_settings
from talos_proxmox.talos_api.client import TalosClient, read_talosconfig
from tests.support.day_two import upgrade_timeline
from tests.engine.cluster import SNAPSHOT_DIR
from tests.engine.pulumi_cli import CliRun, PulumiProject
from tests.engine.cluster import EngineCluster, EngineUp, engine_cluster, engine_stack, secret_texts
from tests.stand_ins.talos_api import RecordedCall

pytestmark = pytest.mark.engine

# name, role, address: three control planes and a worker, each at its own loopback address
NODES = [("e2e-cp-1", "controlplane", "127.0.0.32"), ("e2e-cp-2", "controlplane", "127.0.0.33"),
         ("e2e-cp-3", "controlplane", "127.0.0.34"), ("e2e-worker-1", "worker", "127.0.0.35")]
WORKER = "e2e-worker-1"
ADDED = ("e2e-worker-2", "worker", "127.0.0.36")
TALOS, UPGRADE = "v1.13.7", "v1.13.8"
FIRST_PATCH = {"machine": {"sysctls": {"net.core.somaxconn": "1024"}}}
CHANGED_PATCH = {"machine": {"sysctls": {"net.core.somaxconn": "4096"}}}
# (the worker's patch, the nodes, the Talos version) of each `pulumi up`, in order
UPS = (
    (FIRST_PATCH, NODES, TALOS),  # first: a new cluster
    (CHANGED_PATCH, NODES, TALOS),  # second: one worker's patch changed
    (CHANGED_PATCH, NODES, TALOS),  # unchanged
    (CHANGED_PATCH, [*NODES, ADDED], TALOS),  # added: one worker more
    (CHANGED_PATCH, [*NODES, ADDED], UPGRADE),  # upgraded
    (CHANGED_PATCH, NODES, UPGRADE),  # removed: that worker gone again
)


@dataclass
class Deployment:
    first: EngineUp
    second: EngineUp
    unchanged: EngineUp
    added: EngineUp
    upgraded: EngineUp
    removed: EngineUp
    destroy: CliRun
    before_destroy: dict[str, int]
    after_destroy: dict[str, int]
    cluster: EngineCluster
    project: PulumiProject
    state: dict  # `pulumi stack export` after the last up: secrets encrypted

    @property
    def ups(self) -> list[EngineUp]:
        return [self.first, self.second, self.unchanged, self.added, self.upgraded, self.removed]

    @property
    def nodes(self):
        return self.cluster.nodes


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine")
    with engine_cluster(tmp, [*NODES, ADDED], TALOS) as (cluster, project):
        ups = [cluster.deploy(project, engine_stack(cluster, nodes, talos, tmp / "secrets.yaml",
                                                    patches={WORKER: [worker_patch]}), tmp / f"render-{index}")
               for index, (worker_patch, nodes, talos) in enumerate(UPS)]
        state = project.export()
        before_destroy = cluster.counts()
        destroy = project.destroy(check=False)
        yield Deployment(*ups, destroy=destroy, before_destroy=before_destroy, after_destroy=cluster.counts(),
                         cluster=cluster, project=project, state=state)


def sysctls(config: bytes) -> dict:
    [v1alpha1] = [d for d in yaml.safe_load_all(config) if isinstance(d, dict) and d.get("version") == "v1alpha1"]
    return v1alpha1["machine"].get("sysctls", {})


def applies(calls: list[RecordedCall]) -> list[RecordedCall]:
    """The configurations sent, Talos's dry runs (which change nothing) left out."""
    return [call for call in calls if call.rpc == "ApplyConfiguration" and not call.request.dry_run]


def dry_runs(calls: list[RecordedCall]) -> list[RecordedCall]:
    return [call for call in calls if call.rpc == "ApplyConfiguration" and call.request.dry_run]


# --- every `pulumi up` ----------------------------------------------------------------------------


def test_each_preview_plans_exactly_what_its_up_does_and_calls_no_one(deployment):
    before = {"factory": 0, "pve": 0, **{name: 0 for name in deployment.nodes}}
    for index, up in enumerate(deployment.ups):
        assert up.preview.changes() == up.up.changes(), index
        assert up.after_preview == before, index
        before = {"factory": 1, "pve": up.pve_requests, **{n: len(c) for n, c in up.calls.items()}}


def test_no_secret_is_printed_or_stored_in_plain_text(deployment):
    """Nothing the CLI printed (human output, JSON events, previews) and nothing in the state file holds a
    key, token or the Proxmox API token in plain text; every output carrying one is a Pulumi secret."""
    needles = secret_texts(deployment.cluster)
    needles += [base64.b64decode(key).decode().splitlines()[1] for key in needles if key.startswith("LS0t")]
    needles.append("PRIVATE KEY")
    printed = [run.output for run in deployment.project.runs if "--show-secrets" not in run.args]
    state = json.dumps(deployment.state)
    for needle in needles:
        assert not [text for text in printed if needle in text]
        assert needle not in state
    for up in deployment.ups:
        assert {"kubeconfig", "talosconfig"} <= up.secret_outputs


# --- the first `pulumi up` ------------------------------------------------------------------------


def test_every_resource_is_created_once_and_each_vm_made_then_started_through_the_pve_api(deployment):
    first = deployment.first
    assert set(first.up.steps().values()) == {"create"}
    assert set(first.up.summary()) == {"create"}
    created = [name for op, name in first.up.started() if op == "create"]
    assert len(created) == len(set(created))
    assert {"secrets", "talosconfig", "bootstrap", "kubeconfig", "image-schematic", "image-iso"} <= set(created)
    for name, _, _ in NODES:
        assert {name, f"machineconfig-{name}", f"lifecycle-{name}", f"apply-{name}"} <= set(created)
    requests = deployment.cluster.pve.requests[:first.pve_requests]
    download = next(i for i, (method, path, _) in enumerate(requests) if method == "POST" and path.endswith("/download-url"))
    made = {int(parse_qs(_text(body))["vmid"][0]): i for i, (method, path, body) in enumerate(requests)
            if (method, path) == ("POST", "/api2/json/nodes/pve/qemu")}
    started = {int(path.split("/")[-3]): i for i, (method, path, _) in enumerate(requests)
               if method == "POST" and path.endswith("/status/start")}
    vm_ids = {9100 + int(ip.rsplit(".", 1)[1]) for _, _, ip in NODES}
    assert set(made) == set(started) == vm_ids
    for vm_id in vm_ids:
        assert download < made[vm_id] < started[vm_id], vm_id


def test_the_iso_is_named_after_the_cluster_and_no_disk_asks_for_an_io_thread(deployment):
    """The ISO's file name carries the cluster, so the provider's overwrite_unmanaged can only ever replace this
    cluster's own copy; behind virtio-scsi-pci PVE ignores an I/O thread and warns at every start."""
    first = deployment.first
    requests = deployment.cluster.pve.requests[:first.pve_requests]
    [download] = [parse_qs(_text(body)) for method, path, body in requests
                  if method == "POST" and path.endswith("/download-url")]
    sid = image_facts(load_settings(first.config)).schematic_id
    assert download["filename"] == [f"talos-dev-{sid[:12]}-{TALOS}-metal-amd64.iso"]
    made = [parse_qs(_text(body)) for method, path, body in requests if (method, path) == ("POST", "/api2/json/nodes/pve/qemu")]
    assert len(made) == len(NODES)
    for vm in made:
        assert vm["scsihw"] == ["virtio-scsi-pci"] and "iothread=0" in vm["scsi0"][0], vm["scsi0"]


def _text(body) -> str:
    return body.decode() if isinstance(body, bytes) else str(body)


def test_schematic_is_registered_once_with_the_locally_computed_id(deployment):
    sid = image_facts(load_settings(deployment.first.config)).schematic_id
    [(method, path, _headers, body)] = deployment.cluster.factory.requests
    assert (method, path) == ("POST", "/schematics")
    assert hashlib.sha256(body).hexdigest() == sid
    assert deployment.first.outputs["schematicId"] == sid
    assert deployment.first.outputs["installerImage"] == (
        f"{deployment.cluster.factory.url.removeprefix('http://')}/installer/{sid}:{TALOS}")


def test_each_node_got_one_insecure_apply_of_what_the_render_command_writes(deployment):
    first = deployment.first
    for name, _, _ in NODES:
        [apply] = applies(first.calls[name])
        assert (apply.mode, apply.roles) == ("maintenance", ()), name  # no client certificate: insecure
        assert apply.request.data == first.rendered[name], name


def test_every_node_ends_in_configured_mode_and_the_added_one_is_not_yet_running(deployment):
    assert deployment.first.modes == {**{name: "configured" for name, _, _ in NODES}, ADDED[0]: "maintenance"}
    assert not deployment.first.calls[ADDED[0]]


def test_bootstrap_once_on_the_first_control_plane_over_mtls(deployment):
    first = deployment.first
    bootstraps = {name: [c for c in calls if c.rpc == "Bootstrap"] for name, calls in first.calls.items()}
    assert {name: len(found) for name, found in bootstraps.items()} == {
        name: int(name == "e2e-cp-1") for name in deployment.nodes}
    [call] = bootstraps["e2e-cp-1"]
    assert (call.mode, call.roles) == ("configured", ("os:admin",))


def test_kubeconfig_output_is_the_nodes_kubeconfig(deployment):
    assert deployment.first.outputs["kubeconfig"] == deployment.nodes["e2e-cp-1"].kubeconfig_yaml


def test_talosconfig_output_makes_mtls_calls_to_every_configured_node(deployment):
    context = read_talosconfig(deployment.first.outputs["talosconfig"])
    assert context.endpoints == ("127.0.0.32", "127.0.0.33", "127.0.0.34")
    for name, _, ip in NODES:
        # each node's certificate (a worker's from trustd) must chain to the talosconfig's CA
        with TalosClient([ip], credentials=context.credentials) as client:
            reply = client.version(timeout=10)
        assert reply.messages[0].version.tag == deployment.nodes[name].version_tag


# --- the second `pulumi up`: one worker's patch changed -------------------------------------------


def test_second_up_updates_only_the_changed_workers_config_and_apply(deployment):
    second = deployment.second
    assert second.steps("update") == {f"machineconfig-{WORKER}", f"apply-{WORKER}"}
    assert second.steps("create") == set()
    assert len(second.steps("same")) == len(deployment.first.up.steps()) - 2


def test_second_up_reapplies_to_that_worker_only_over_mtls(deployment):
    first, second = deployment.first, deployment.second
    for name, _, _ in NODES:
        assert len(applies(second.calls[name])) == (2 if name == WORKER else 1), name
    again = applies(second.calls[WORKER])[1]
    assert (again.mode, again.roles) == ("configured", ("os:admin",))
    [asked] = dry_runs(second.new_calls(first, WORKER))  # whether it takes a reboot: it does not
    assert asked.at < again.at and asked.request.data == again.request.data
    assert again.request.data == second.rendered[WORKER] != first.rendered[WORKER]
    assert sysctls(again.request.data) == {"net.core.somaxconn": "4096"}
    assert sysctls(first.rendered[WORKER]) == {"net.core.somaxconn": "1024"}


def test_second_up_leaves_bootstrap_kubeconfig_and_secrets_alone(deployment):
    first, second = deployment.first, deployment.second
    assert sum(c.rpc in ("Bootstrap", "Kubeconfig") for calls in second.calls.values() for c in calls) == \
        sum(c.rpc in ("Bootstrap", "Kubeconfig") for calls in first.calls.values() for c in calls) == 2
    assert second.outputs == first.outputs


# --- a third `pulumi up` with nothing changed -----------------------------------------------------


def test_up_without_changes_changes_nothing(deployment):
    second, unchanged = deployment.second, deployment.unchanged
    assert set(unchanged.up.steps().values()) == {"same"}
    assert set(unchanged.up.summary()) == {"same"}
    assert unchanged.preview.changes() == {}
    assert unchanged.calls == second.calls  # not one call to any node
    assert len(deployment.cluster.factory.requests) == 1
    assert unchanged.outputs == second.outputs


# --- a fourth `pulumi up`: a worker added ---------------------------------------------------------


def test_adding_a_worker_makes_its_vm_and_applies_to_it_alone(deployment):
    unchanged, added = deployment.unchanged, deployment.added
    name = ADDED[0]
    assert added.steps("create") == {name, f"machineconfig-{name}", f"lifecycle-{name}", f"apply-{name}"}
    assert added.steps("update") == {"node-changes", "nodes-installed"}  # the latter waits for the new node only
    [apply] = applies(added.calls[name])
    assert (apply.mode, apply.roles) == ("maintenance", ())
    assert apply.request.data == added.rendered[name]
    assert added.modes[name] == "configured"
    assert {n: c for n, c in added.calls.items() if n != name} == {n: c for n, c in unchanged.calls.items() if n != name}
    assert {n: added.rendered[n] for n in unchanged.rendered} == unchanged.rendered
    assert added.outputs["kubeconfig"] == unchanged.outputs["kubeconfig"]


# --- a fifth `pulumi up`: a Talos upgrade ---------------------------------------------------------


def test_talos_upgrade_rolls_one_node_at_a_time_control_planes_first(deployment):
    """Talos 1.13 nodes, upgraded as talosctl 1.13 does: pull the installer, install it, drain the node
    through the Kubernetes API, reboot, uncordon once healthy; the next node only after that."""
    added, upgraded = deployment.added, deployment.upgraded
    order = [name for name, role, _ in NODES if role == "controlplane"] + [WORKER, ADDED[0]]
    new_calls = {name: upgraded.new_calls(added, name) for name in order}
    installer = upgraded.outputs["installerImage"]
    assert installer.endswith(f":{UPGRADE}")
    since = min(c.at for calls in new_calls.values() for c in calls)
    assert upgrade_timeline(new_calls, deployment.cluster.kubernetes.kube.changes(), since, by_deployment=True,
                            namespaces={"default"}) == [
        entry for name in order for entry in (
        (name, "ImageService/Pull"), (name, "LifecycleService/Upgrade"), ("kubernetes", f"cordon {name}"),
        ("kubernetes", f"evict default/app-{name}"), (name, "Reboot"), ("kubernetes", f"uncordon {name}"))]
    for name in order:
        [install] = [c for c in new_calls[name] if c.rpc == "LifecycleService/Upgrade"]
        assert (install.request.source.image_name, install.roles) == (installer, ("os:admin",)), name
        assert deployment.nodes[name].version_tag == UPGRADE
        last = applies(new_calls[name])[-1]  # then the new configuration (its install image changed)
        assert (last.request.data, last.roles) == (upgraded.rendered[name], ("os:admin",)), name
    for before, after in zip(order, order[1:]):
        healthy = [c.at for c in new_calls[before] if c.rpc == "ServiceList"]
        [pull] = [c.at for c in new_calls[after] if c.rpc == "ImageService/Pull"]
        assert healthy and max(c.at for c in new_calls[before] if c.rpc == "Reboot") < max(healthy) < pull, \
            (before, after)


def test_talos_upgrade_prints_a_progress_line_per_node_step(deployment):
    lines = "".join(deployment.upgraded.up.diagnostics("info#err"))
    for position, name in enumerate([n for n, role, _ in NODES if role == "controlplane"] + [WORKER, ADDED[0]], 1):
        assert f"{name} ({position} of 5)" in lines, name


def test_each_control_plane_is_snapshotted_before_its_upgrade_and_only_a_few_kept(deployment):
    added, upgraded = deployment.added, deployment.upgraded
    for name, role, _ in NODES:
        calls = [c.rpc for c in upgraded.new_calls(added, name)]
        if role == "controlplane":
            assert calls.count("EtcdSnapshot") == 1, name
            assert calls.index("EtcdSnapshot") < calls.index("LifecycleService/Upgrade"), name
        else:
            assert "EtcdSnapshot" not in calls, name
    files = sorted(Path(SNAPSHOT_DIR).glob("*.snapshot"))
    assert 1 <= len(files) <= 3  # keep: 3
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


# --- a sixth `pulumi up`: the added worker removed ------------------------------------------------


def test_removing_a_worker_resets_it_before_its_vm_is_stopped_and_destroyed(deployment):
    upgraded, removed = deployment.upgraded, deployment.removed
    name = ADDED[0]
    assert removed.steps("delete") == {name, f"machineconfig-{name}", f"lifecycle-{name}", f"apply-{name}"}
    assert removed.steps("create") == set()
    deleted = [step_name for op, step_name in removed.up.started() if op == "delete"]
    assert deleted.index(f"apply-{name}") < deleted.index(f"lifecycle-{name}") < deleted.index(name)  # VM last
    new_calls = [c for c in removed.new_calls(upgraded, name) if c.rpc != "Version"]
    [reset] = [c for c in new_calls if c.rpc == "Reset"]
    assert (reset.request.graceful, reset.request.reboot, reset.roles) == (True, False, ("os:admin",))
    vm_id = 9100 + int(ADDED[2].rsplit(".", 1)[1])
    [made, destroyed] = [e for e in deployment.cluster.pve.vm_events if e.vm_id == vm_id]
    assert (made.what, destroyed.what) == ("made", "destroyed")
    assert reset.at < destroyed.at
    for other in removed.calls:
        if other != name:
            assert {c.rpc for c in removed.new_calls(upgraded, other)} <= {"Kubeconfig"}, other


# --- `pulumi destroy` -----------------------------------------------------------------------------


def test_destroy_is_refused_before_anything_is_touched(deployment):
    """The engine deletes dependents first and fails only on reaching a protected resource; the cluster's
    deletion protection, which depends on every resource, is reached first."""
    destroy = deployment.destroy
    assert destroy.returncode != 0
    assert 'DeletionProtection::deletion-protection" cannot be deleted' in "".join(destroy.diagnostics("error"))
    assert destroy.started() == []
    assert deployment.after_destroy == deployment.before_destroy  # not one PVE, factory or Talos request
    vms = {vm.vmid for vm in deployment.cluster.pve.vms}
    assert vms == {9100 + int(ip.rsplit(".", 1)[1]) for _, _, ip in NODES}
