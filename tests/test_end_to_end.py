"""`pulumi up` of the real program, six times over, with the real dynamic providers doing real work.

The program (`__main__.py`) runs under tests/e2e_engine.py's monitor, which deploys every dynamic
resource the way the engine and the dynamic-provider host would (check, then create, or diff and
update against the previous run's state, and delete what a run no longer registers). Only the far
side is stood in for: the Image Factory (tests/factory_stand_in.py) and one FakeTalosNode per node,
listening on the node's own stack IP at port 50000 — loopback addresses 127.0.0.2-6 — in
maintenance mode, learning its identity from the config it is sent. Proxmox, Kubernetes and Helm
resources are echoed; the health wait is off.

Each `up` starts with its preview, as `pulumi up` does: values not known yet reach the providers'
check and diff as the dynamic-provider host hands them over, and the preview must plan exactly the
steps the `up` then takes, without calling any node. The first `up` makes the cluster; the second
changes one worker's patch and must re-apply to that worker only, over mutual TLS; the third, with
nothing changed, must change nothing; the fourth adds a worker (127.0.0.6, in maintenance until then)
and must touch only it; the fifth upgrades Talos, one node at a time, control planes first; the
sixth removes the added worker, which must be reset while every other node is left alone.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

import pytest
import yaml
from pulumi.output import Unknown

from providers import dynamic_talos
from talos_proxmox.cluster_plan.resource_inputs import image_facts
from talos_proxmox.settings.stack import load_settings
from providers import talos_operations
from talos_proxmox.talos_api.client import TalosClient, read_talosconfig
from tests.day_two import upgrade_timeline
from tests.e2e_engine import DeploymentMonitor, Up, e2e_cluster, e2e_config
from tests.factory_stand_in import StandInFactory
from tests.kube_stand_in import StandInApi
from tests.talos_api_server import FakeTalosNode, RecordedCall

# name, role, address: three control planes and a worker, each at its own loopback address
NODES = [("e2e-cp-1", "controlplane", "127.0.0.2"), ("e2e-cp-2", "controlplane", "127.0.0.3"),
         ("e2e-cp-3", "controlplane", "127.0.0.4"), ("e2e-worker-1", "worker", "127.0.0.5")]
WORKER = "e2e-worker-1"
ADDED = ("e2e-worker-2", "worker", "127.0.0.6")
TALOS, UPGRADE = "v1.13.7", "v1.13.8"
FIRST_PATCH = {"machine": {"sysctls": {"net.core.somaxconn": "1024"}}}
CHANGED_PATCH = {"machine": {"sysctls": {"net.core.somaxconn": "4096"}}}
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: dev
  cluster:
    server: https://127.0.0.100:6443
    certificate-authority-data: c3RhbmQtaW4gY2E=
contexts:
- name: admin@dev
  context: {cluster: dev, user: admin@dev}
current-context: admin@dev
users:
- name: admin@dev
  user: {client-certificate-data: c3RhbmQtaW4gY2VydA==, client-key-data: c3RhbmQtaW4ga2V5}
"""
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
    first: Up
    second: Up
    unchanged: Up
    added: Up
    upgraded: Up
    removed: Up
    factory: StandInFactory
    nodes: dict[str, FakeTalosNode]
    kube: StandInApi

    @property
    def ups(self) -> list[Up]:
        return [self.first, self.second, self.unchanged, self.added, self.upgraded, self.removed]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    with e2e_cluster([*NODES, ADDED], TALOS, tmp_path_factory) as cluster:
        cluster.nodes[NODES[0][0]].kubeconfig_yaml = KUBECONFIG
        ups = [cluster.up(e2e_config(cluster.factory.url, nodes, talos, patches={WORKER: [worker_patch]}))
               for worker_patch, nodes, talos in UPS]
        yield Deployment(*ups, factory=cluster.factory, nodes=cluster.nodes, kube=cluster.kube)


def planned(monitor: DeploymentMonitor) -> set[tuple[str, str]]:
    return {(step.name, step.op) for step in monitor.steps}


def sysctls(config: bytes) -> dict:
    [v1alpha1] = [d for d in yaml.safe_load_all(config) if isinstance(d, dict) and d.get("version") == "v1alpha1"]
    return v1alpha1["machine"].get("sysctls", {})


def applies(calls: list[RecordedCall]) -> list[RecordedCall]:
    return [call for call in calls if call.rpc == "ApplyConfiguration"]


# --- every `pulumi up` ----------------------------------------------------------------------------


def test_each_preview_plans_exactly_what_its_up_does_and_calls_no_node(deployment):
    before = {"factory": 0, "pve": 0, **{name: 0 for name in deployment.nodes}}
    for up in deployment.ups:
        assert planned(up.plan) == planned(up.monitor)
        assert up.after_preview == before
        before = {"factory": len(deployment.factory.requests), "pve": up.pve_requests,
                  **{n: len(c) for n, c in up.calls.items()}}


# --- the first `pulumi up` ------------------------------------------------------------------------


def test_every_resource_is_created_once(deployment):
    first = deployment.first
    assert {step.op for step in first.monitor.steps} == {"create"}
    created = [step.name for step in first.monitor.steps]
    assert len(created) == len(set(created))
    assert {"secrets", "talosconfig", "bootstrap", "kubeconfig", "image-schematic"} <= set(created)
    for name, _, _ in NODES:
        assert {f"machineconfig-{name}", f"lifecycle-{name}", f"apply-{name}"} <= set(created)


def test_schematic_is_registered_once_with_the_locally_computed_id(deployment):
    sid = image_facts(load_settings(deployment.first.config)).schematic_id
    [(method, path, _headers, body)] = deployment.factory.requests  # both runs together
    assert (method, path) == ("POST", "/schematics")
    assert hashlib.sha256(body).hexdigest() == sid
    assert deployment.first.run.exports["schematicId"] == sid
    assert deployment.first.run.exports["installerImage"] == (
        f"{deployment.factory.url.removeprefix('http://')}/installer/{sid}:{TALOS}")


def test_each_node_got_one_insecure_apply_of_what_the_render_command_writes(deployment):
    first = deployment.first
    for name, _, _ in NODES:
        [apply] = applies(first.calls[name])
        assert (apply.mode, apply.roles) == ("maintenance", ()), name  # no client certificate: insecure
        assert apply.request.data == first.rendered[name], name
        assert deployment.nodes[name].config is not None


def test_every_node_ends_in_configured_mode(deployment):
    assert deployment.first.modes == {**{name: "configured" for name, _, _ in NODES}, ADDED[0]: "maintenance"}


def test_bootstrap_once_on_the_first_control_plane_over_mtls(deployment):
    first = deployment.first
    bootstraps = {name: [c for c in calls if c.rpc == "Bootstrap"] for name, calls in first.calls.items()}
    assert {name: len(found) for name, found in bootstraps.items()} == {
        name: int(name == "e2e-cp-1") for name in deployment.nodes}
    [call] = bootstraps["e2e-cp-1"]
    assert (call.mode, call.roles) == ("configured", ("os:admin",))
    assert load_settings(first.config).bootstrap_node.name == "e2e-cp-1"


def test_kubeconfig_export_is_the_nodes_kubeconfig_and_secret(deployment):
    run = deployment.first.run
    assert run.exports["kubeconfig"] == KUBECONFIG
    assert {"kubeconfig", "talosconfig"} <= run.secret_exports


def test_talosconfig_export_makes_mtls_calls_to_every_configured_node(deployment):
    context = read_talosconfig(deployment.first.run.exports["talosconfig"])
    assert context.endpoints == ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    for name, _, ip in NODES:
        # each node's certificate (a worker's from trustd) must chain to the talosconfig's CA
        with TalosClient([ip], credentials=context.credentials) as client:
            reply = client.version(timeout=10)
        assert reply.messages[0].version.tag == deployment.nodes[name].version_tag
        last = deployment.nodes[name].calls[-1]
        assert (last.rpc, last.mode, last.roles) == ("Version", "configured", ("os:admin",))


# --- the second `pulumi up`: one worker's patch changed -------------------------------------------


def test_second_up_updates_only_the_changed_workers_config_and_apply(deployment):
    second = deployment.second
    assert second.steps("update") == {f"machineconfig-{WORKER}", f"apply-{WORKER}"}
    assert second.steps("create") == set()
    assert len(second.steps("same")) == len(deployment.first.monitor.steps) - 2


def test_second_up_reapplies_to_that_worker_only_over_mtls(deployment):
    first, second = deployment.first, deployment.second
    for name, _, _ in NODES:
        assert len(applies(second.calls[name])) == (2 if name == WORKER else 1), name
    again = applies(second.calls[WORKER])[1]
    assert (again.mode, again.roles) == ("configured", ("os:admin",))
    assert again.request.data == second.rendered[WORKER] != first.rendered[WORKER]
    assert sysctls(again.request.data) == {"net.core.somaxconn": "4096"}
    assert sysctls(first.rendered[WORKER]) == {"net.core.somaxconn": "1024"}
    for name, _, _ in NODES:
        if name != WORKER:
            assert second.rendered[name] == first.rendered[name], name


def test_second_up_leaves_bootstrap_kubeconfig_and_secrets_alone(deployment):
    first, second = deployment.first, deployment.second
    assert sum(c.rpc in ("Bootstrap", "Kubeconfig") for calls in second.calls.values() for c in calls) == \
        sum(c.rpc in ("Bootstrap", "Kubeconfig") for calls in first.calls.values() for c in calls) == 2
    assert second.run.exports["kubeconfig"] == first.run.exports["kubeconfig"]
    assert second.run.exports["talosconfig"] == first.run.exports["talosconfig"]
    assert (second.monitor.state_named("secrets").outputs["bundle"]
            == first.monitor.state_named("secrets").outputs["bundle"])


# --- a third `pulumi up` with nothing changed -----------------------------------------------------


def test_up_without_changes_changes_nothing(deployment):
    second, unchanged = deployment.second, deployment.unchanged
    assert {step.op for step in unchanged.monitor.steps} == {"same"}
    assert unchanged.calls == second.calls  # not one call to any node
    assert len(deployment.factory.requests) == 1
    assert unchanged.run.exports == second.run.exports


# --- what a preview hands the providers: unknowns as `pulumi.output.Unknown` -----------------------


def test_providers_take_unknowns_as_the_dynamic_provider_host_passes_them():
    """The host deserializes a value a preview has not computed as pulumi.output.Unknown (not the wire's
    sentinel string): checks must defer, diffs must not fail: a changed configuration is "changed"; a
    talosconfig that is unknown (its resource updating) is no reason to fetch the kubeconfig again."""
    unknown = Unknown()
    config_inputs = {"secrets": unknown, "cluster_name": "dev", "endpoint": "https://127.0.0.100:6443",
                     "role": "worker", "talos_version": "v1.13.7", "kubernetes_version": "1.36.2", "patches": []}
    assert dynamic_talos.MachineConfigurationProvider().check({}, config_inputs).failures == []
    talosconfig_inputs = {"secrets": unknown, "context": "dev", "endpoints": ["127.0.0.2"], "nodes": ["127.0.0.2"]}
    assert dynamic_talos.TalosconfigProvider().check({}, talosconfig_inputs).failures == []
    apply_olds = {"node": "127.0.0.5", "mode": "auto", "timeout_seconds": 600, "config_sha256": "0" * 64}
    apply_news = {**apply_olds, "machine_configuration": unknown}
    assert talos_operations.ConfigurationApplyProvider().diff("127.0.0.5", apply_olds, apply_news).changes is True
    kubeconfig_olds = {"node": "127.0.0.2", "timeout_seconds": 600, "talosconfig_sha256": "0" * 64}
    kubeconfig_news = {**kubeconfig_olds, "talosconfig": unknown}
    assert talos_operations.KubeconfigProvider().diff("kubeconfig-127.0.0.2", kubeconfig_olds, kubeconfig_news).changes is False


def test_no_key_or_token_is_stored_or_exported_in_plain_text(deployment):
    """Every output that carries key material is a Pulumi secret, in state and in the stack's exports."""
    bundle = deployment.first.monitor.state_named("secrets").outputs["bundle"]
    needles = {bundle["cluster"]["secret"], bundle["trustdinfo"]["token"], *bundle["secrets"].values(),
               *(pair["key"] for pair in bundle["certs"].values())}
    needles |= {base64.b64decode(key).decode().splitlines()[1] for key in needles if key.startswith("LS0t")}
    needles.add("PRIVATE KEY")
    for up in deployment.ups:
        for state in up.monitor.state.values():
            plain = json.dumps({k: v for k, v in state.outputs.items() if k not in state.secret_outputs})
            assert not [n for n in needles if n in plain], state.urn
        plain_exports = json.dumps({k: v for k, v in up.run.exports.items() if k not in up.run.secret_exports})
        assert not [n for n in needles if n in plain_exports]


# --- a fourth `pulumi up`: a worker added ---------------------------------------------------------


def test_adding_a_worker_creates_only_its_resources_and_applies_to_it_alone(deployment):
    unchanged, added = deployment.unchanged, deployment.added
    name = ADDED[0]
    assert added.steps("create") == {f"machineconfig-{name}", f"lifecycle-{name}", f"apply-{name}"}
    assert added.steps("update") == {"node-changes", "nodes-installed"}  # the latter waits for the new node only
    [apply] = applies(added.calls[name])
    assert (apply.mode, apply.roles) == ("maintenance", ())
    assert apply.request.data == added.rendered[name]
    assert added.modes[name] == "configured"
    versions = [c for c in added.calls[name] if c.rpc == "Version" and c.at > apply.at]
    assert versions and versions[-1].mode == "configured"  # answered over mTLS once installed
    assert {n: c for n, c in added.calls.items() if n != name} == {n: c for n, c in unchanged.calls.items() if n != name}
    assert {n: added.rendered[n] for n in unchanged.rendered} == unchanged.rendered
    assert (added.run.exports["kubeconfig"], added.run.exports["talosconfig"]) == (
        unchanged.run.exports["kubeconfig"], unchanged.run.exports["talosconfig"])


# --- a fifth `pulumi up`: a Talos upgrade ---------------------------------------------------------


def test_talos_upgrade_rolls_one_node_at_a_time_control_planes_first(deployment):
    """Talos 1.13 nodes, upgraded as talosctl 1.13 does: pull the installer, install it, drain the node
    through the Kubernetes API, reboot, uncordon once healthy; the next node only after that."""
    added, upgraded = deployment.added, deployment.upgraded
    order = [name for name, role, _ in NODES if role == "controlplane"] + [WORKER, ADDED[0]]
    new_calls = {name: upgraded.calls[name][len(added.calls[name]):] for name in order}
    installer = upgraded.run.exports["installerImage"]
    assert installer.endswith(f":{UPGRADE}")
    since = min(c.at for calls in new_calls.values() for c in calls)
    assert upgrade_timeline(new_calls, deployment.kube, since) == [entry for name in order for entry in (
        (name, "ImageService/Pull"), (name, "LifecycleService/Upgrade"), ("kubernetes", f"cordon {name}"),
        ("kubernetes", f"evict default/app-{name}"), (name, "Reboot"), ("kubernetes", f"uncordon {name}"))]
    for name in order:
        [pull] = [c for c in new_calls[name] if c.rpc == "ImageService/Pull"]
        [install] = [c for c in new_calls[name] if c.rpc == "LifecycleService/Upgrade"]
        assert (pull.request.image_ref, install.request.source.image_name) == (installer, installer), name
        assert (install.mode, install.roles) == ("configured", ("os:admin",)), name
        assert deployment.nodes[name].version_tag == UPGRADE
        # then the new configuration (its install image changed), over mTLS
        last = applies(new_calls[name])[-1]
        assert (last.request.data, last.roles) == (upgraded.rendered[name], ("os:admin",)), name
    for before, after in zip(order, order[1:]):
        # the next node starts only once the one before answers healthy on the new version
        healthy = [c.at for c in new_calls[before] if c.rpc == "ServiceList"]
        [pull] = [c.at for c in new_calls[after] if c.rpc == "ImageService/Pull"]
        assert healthy and max(c.at for c in new_calls[before] if c.rpc == "Reboot") < max(healthy) < pull, \
            (before, after)


def test_talos_upgrade_leaves_secrets_talosconfig_bootstrap_and_kubeconfig_alone(deployment):
    upgraded = deployment.upgraded
    assert not {"secrets", "talosconfig", "bootstrap", "kubeconfig"} & upgraded.steps("update")
    assert upgraded.run.exports["kubeconfig"] == deployment.added.run.exports["kubeconfig"]
    assert len(deployment.factory.requests) == 1  # same schematic: nothing to register


# --- a sixth `pulumi up`: the added worker removed ------------------------------------------------


def test_removing_a_worker_resets_it_and_deletes_only_its_resources(deployment):
    upgraded, removed = deployment.upgraded, deployment.removed
    name = ADDED[0]
    assert removed.steps("delete") == {name, f"machineconfig-{name}", f"lifecycle-{name}", f"apply-{name}"}
    assert removed.steps("create") == set()
    assert removed.steps("update") == {"node-changes", "nodes-installed"}  # one node fewer, nothing to wait for
    deleted = [step.name for step in removed.monitor.steps if step.op == "delete"]
    assert deleted.index(f"apply-{name}") < deleted.index(f"lifecycle-{name}") < deleted.index(name)  # VM last
    new_calls = [c for c in removed.calls[name][len(upgraded.calls[name]):] if c.rpc != "Version"]
    [reset] = [c for c in new_calls if c.rpc == "Reset"]
    assert (reset.request.graceful, reset.request.reboot, reset.roles) == (True, False, ("os:admin",))
    assert not [c for c in new_calls if c.rpc.startswith("Etcd")]  # a worker has no etcd member
    # Other nodes: only the control planes' Kubeconfig, for deleting the worker's Node object.
    for other in removed.calls:
        if other != name:
            extra = removed.calls[other][len(upgraded.calls[other]):]
            assert removed.calls[other][:len(upgraded.calls[other])] == upgraded.calls[other], other
            assert {c.rpc for c in extra} <= {"Kubeconfig"}, other
    assert not [urn for urn in removed.monitor.state if urn.endswith(f"-{name}")]
    assert [urn for urn in upgraded.monitor.state if urn.endswith(f"-{name}")]


def test_each_control_plane_is_snapshotted_before_its_upgrade_and_only_a_few_kept(deployment):
    """lifecycle.etcdSnapshots: EtcdSnapshot right before each control plane's upgrade, none for workers;
    the files are the nodes' snapshot bytes, owner-only, and the stack keeps its newest `keep`."""
    import stat
    from pathlib import Path

    from tests.e2e_engine import SNAPSHOT_DIR

    added, upgraded = deployment.added, deployment.upgraded
    for name, role, _ in NODES:
        calls = [c.rpc for c in upgraded.calls[name][len(added.calls[name]):]]
        if role == "controlplane":
            assert calls.count("EtcdSnapshot") == 1, name
            assert calls.index("EtcdSnapshot") < calls.index("LifecycleService/Upgrade"), name
        else:
            assert "EtcdSnapshot" not in calls, name
    files = sorted(Path(SNAPSHOT_DIR).glob("*.snapshot"))
    assert 1 <= len(files) <= 3  # keep: 3, of the three control planes' snapshots
    for path in files:
        node = next(n for n, role, _ in NODES if role == "controlplane" and f"-{n}-" in path.name)
        assert path.read_bytes() == deployment.nodes[node].etcd_snapshot_data
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
