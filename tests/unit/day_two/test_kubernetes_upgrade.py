"""talos_proxmox.day_two.kubernetes_upgrade: a Kubernetes version change as talosctl upgrade-k8s makes it,
against stand-in Talos nodes (real TLS and protobuf; each control plane renders its static pods from the
configuration it is sent) and a played Kubernetes API that reads what the stand-ins run (a static pod's
mirror pod carries the config version its node rendered; a Node reports the kubelet its node's config names)."""

from __future__ import annotations

import pytest
import yaml

from talos_proxmox.day_two import kubernetes_upgrade as ku
from talos_proxmox.day_two.rolling import RollError, RollNode
from talos_proxmox.talos_api.client import TalosClient
from talos_proxmox.talos_config import machine_config
from tests.stand_ins.talos_api import client_credentials, config_images
from tests.support.day_two import FAST, bundle, stand_in_cluster, stop_all  # noqa: F401 - fixture

OLD, NEW = "1.35.4", "1.36.3"
LAYOUT = [("cp-1", "10.5.0.1", "controlplane"), ("cp-2", "10.5.0.2", "controlplane"),
          ("w-1", "10.5.0.11", "worker")]
INSTALL = [{"machine": {"install": {"disk": "/dev/sda"}}}]


def render(bundle, role: str, kubernetes: str, talos: str = "v1.13.7") -> str:
    return machine_config.render(bundle, "c", "https://10.5.0.1:6443", role, talos, kubernetes, INSTALL)


class PlayedKubeApi:
    """GETs of pods and Nodes answered from what the stand-in nodes run: the static pods each control plane
    rendered (Ready, at its address, with the version annotation) and each node's kubelet version."""

    def __init__(self, nodes: dict, fakes: dict):
        self.nodes, self.fakes, self.gets = nodes, fakes, []

    def get(self, path: str):
        self.gets.append(path)
        if path.startswith("/api/v1/nodes/"):
            name = path.rsplit("/", 1)[1]
            kubelet = config_images(list(yaml.safe_load_all(self.fakes[name].config or b""))).get("kubelet", "")
            return {"status": {"nodeInfo": {"kubeletVersion": kubelet.rsplit(":", 1)[-1]},
                               "conditions": [{"type": "Ready", "status": "True"}]}}
        component = path.rsplit("%3D", 1)[1]
        return {"items": [
            {"metadata": {"annotations": {ku.CONFIG_VERSION_ANNOTATION: str(fake.static_pods[component][1])}},
             "status": {"hostIP": self.nodes[name].address, "conditions": [{"type": "Ready", "status": "True"}]}}
            for name, fake in self.fakes.items() if component in fake.static_pods]}


@pytest.fixture
def cluster(bundle):
    nodes, fakes = stand_in_cluster(bundle, LAYOUT)
    for (name, _, role), fake in zip(LAYOUT, fakes.values()):
        fake.config = render(bundle, role, OLD).encode()
        fake._config_taken(fake.config)
    yield nodes, fakes
    stop_all(fakes)


def run_upgrade(bundle, nodes, fakes, applied: list, synced: list, **options):
    credentials = client_credentials(bundle)
    configs = {name: render(bundle, role, NEW) for name, _, role in LAYOUT}

    def apply_node(node: RollNode) -> None:  # the kubelet step: the whole new configuration
        applied.append(node.name)
        fakes[node.name].config = configs[node.name].encode()
        fakes[node.name]._config_taken(fakes[node.name].config)

    ku.upgrade(list(nodes.values()), configs, NEW, client_for=lambda node: TalosClient(
                   [node.dial], credentials=credentials, node=node.address, timeout=5),
               kube=PlayedKubeApi(nodes, fakes), apply_node=apply_node, sync_manifests=synced.append,
               timeout=5, backoff=FAST, on_event=lambda what, node: None, **options)
    return configs


def test_images_are_read_and_set_in_both_configuration_forms(bundle):
    for talos in ("v1.13.7", "v1.14.1"):
        config = render(bundle, "controlplane", OLD, talos)
        assert ku.component_image(config, "kube-scheduler") == f"registry.k8s.io/kube-scheduler:v{OLD}"
        changed = ku.with_component_image(config, "kube-apiserver", "registry.k8s.io/kube-apiserver:v1.36.3")
        assert ku.component_image(changed, "kube-apiserver") == "registry.k8s.io/kube-apiserver:v1.36.3"
        # nothing else moved: every other image as before, the documents' kinds in their order
        for component in ("kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet"):
            assert ku.component_image(changed, component) == ku.component_image(config, component)
        assert [d.get("kind") for d in yaml.safe_load_all(changed)] == [d.get("kind") for d in yaml.safe_load_all(config)]
        assert ku.component_image(render(bundle, "worker", OLD, talos), "kube-apiserver") is None
    with pytest.raises(ValueError, match="no kube-apiserver section"):
        ku.with_component_image(render(bundle, "worker", OLD), "kube-apiserver", "x:1")


def test_kube_proxy_is_off_in_either_configuration_form(bundle):
    for talos in ("v1.13.7", "v1.14.1"):
        assert ku.proxy_enabled(render(bundle, "controlplane", OLD, talos)), talos
    v1alpha1 = "version: v1alpha1\ncluster:\n  proxy:\n    image: registry.k8s.io/kube-proxy:v1.35.4\n"
    assert not ku.proxy_enabled(v1alpha1.replace("  proxy:\n", "  proxy:\n    disabled: true\n"))
    own = "version: v1alpha1\n---\napiVersion: v1alpha1\nkind: KubeProxyConfig\nimage: registry.k8s.io/kube-proxy:v1.35.4\n"
    assert ku.proxy_enabled(own)
    assert not ku.proxy_enabled(own + "enabled: false\n")


def test_pre_pulls_follow_talosctl_order(bundle):
    nodes = [RollNode(name, address, role) for name, address, role in LAYOUT]
    configs = {name: render(bundle, role, NEW) for name, _, role in LAYOUT}
    assert [(n.name, ns, image.rsplit("/", 1)[1]) for n, ns, image in ku.pre_pulls([nodes[2], nodes[0], nodes[1]], configs)] == [
        ("cp-1", "cri", f"kube-apiserver:v{NEW}"), ("cp-2", "cri", f"kube-apiserver:v{NEW}"),
        ("cp-1", "cri", f"kube-controller-manager:v{NEW}"), ("cp-2", "cri", f"kube-controller-manager:v{NEW}"),
        ("cp-1", "cri", f"kube-scheduler:v{NEW}"), ("cp-2", "cri", f"kube-scheduler:v{NEW}"),
        ("cp-1", "system", f"kubelet:v{NEW}"), ("cp-2", "system", f"kubelet:v{NEW}"), ("w-1", "system", f"kubelet:v{NEW}")]


def test_static_pod_problem_needs_the_nodes_pod_at_the_version_and_ready():
    node = RollNode("cp-1", "10.5.0.1", "controlplane")

    def pod(address, version, ready):
        return {"metadata": {"annotations": {ku.CONFIG_VERSION_ANNOTATION: version}},
                "status": {"hostIP": address, "conditions": [{"type": "Ready", "status": str(ready)}]}}
    assert ku.static_pod_problem({"items": [pod("10.5.0.2", "3", True)]}, node, "3") == "no pod on the node"
    assert ku.static_pod_problem({"items": [pod("10.5.0.1", "2", True)]}, node, "3") == "config version 2, Ready"
    assert ku.static_pod_problem({"items": [pod("10.5.0.1", "3", False)]}, node, "3") == "config version 3, not Ready"
    assert ku.static_pod_problem({"items": [pod("10.5.0.1", "3", True)]}, node, "3") is None
    assert ku.kubelet_problem(None, "v1.36.3") == "its Node is not registered"
    assert ku.kubelet_problem({"status": {"nodeInfo": {"kubeletVersion": "v1.35.4"}}}, "v1.36.3") == \
        "its Node reports kubelet v1.35.4"


def test_every_api_server_before_any_controller_manager_and_pre_pulls_first(bundle, cluster):
    nodes, fakes = cluster
    applied, synced = [], []
    run_upgrade(bundle, nodes, fakes, applied, synced)
    updates = sorted((at, component, name) for name, fake in fakes.items()
                     for at, component, image in fake.static_pod_updates if image.endswith(f":v{NEW}"))
    assert [(component, name) for _, component, name in updates] == [
        ("kube-apiserver", "cp-1"), ("kube-apiserver", "cp-2"),
        ("kube-controller-manager", "cp-1"), ("kube-controller-manager", "cp-2"),
        ("kube-scheduler", "cp-1"), ("kube-scheduler", "cp-2"),
        # then the kubelet step sends each its whole configuration, which changes no static pod
    ]
    first_apply = min(c.at for fake in fakes.values() for c in fake.calls_for("ApplyConfiguration"))
    pulls = [c for fake in fakes.values() for c in fake.calls_for("ImagePull")]
    assert len(pulls) == 9 and max(c.at for c in pulls) < first_apply
    assert fakes["w-1"].image_pulls == [("NS_SYSTEM", f"ghcr.io/siderolabs/kubelet:v{NEW}")]
    # each static pod step applied the node's running configuration with that one image changed, no reboot
    for name in ("cp-1", "cp-2"):
        sent = [c.request for c in fakes[name].calls_for("ApplyConfiguration")]
        assert [r.mode for r in sent] == [2, 2, 2, 2]  # NO_REBOOT: three static pods, then kube-proxy
    assert applied == ["cp-1", "cp-2", "w-1"] and len(synced) == 1
    assert {fake.static_pods["kube-scheduler"][0] for fake in fakes.values() if fake.static_pods} == {
        f"registry.k8s.io/kube-scheduler:v{NEW}"}


def test_a_failed_pod_names_node_and_component_and_a_rerun_starts_where_it_stopped(bundle, cluster):
    nodes, fakes = cluster
    fakes["cp-2"].on_static_pod = None
    stuck = fakes["cp-2"]
    original = stuck._config_taken

    def never_renders_controller_manager(config):  # cp-2's controller manager keeps its old config version
        before = dict(stuck.static_pods)
        original(config)
        if "kube-controller-manager" in before:
            stuck.static_pods["kube-controller-manager"] = (stuck.static_pods["kube-controller-manager"][0],
                                                            before["kube-controller-manager"][1])
    stuck._config_taken = never_renders_controller_manager
    with pytest.raises(RollError, match=r"node cp-2 \(10.5.0.2\): kube-controller-manager rendered with "
                                        r"registry.k8s.io/kube-controller-manager:v1.36.3: not after 5s"):
        run_upgrade(bundle, nodes, fakes, [], [])
    assert "kube-scheduler" not in {component for _, component, image in fakes["cp-1"].static_pod_updates
                                    if image.endswith(NEW)}
    stuck._config_taken = original
    applies_before = {name: len(fake.calls_for("ApplyConfiguration")) for name, fake in fakes.items()}
    applied, synced = [], []
    run_upgrade(bundle, nodes, fakes, applied, synced)
    # the API servers and both controller managers already render the new image: not applied again, but their
    # pods are asked for (Ready at the rendered config version) before the schedulers go
    new_applies = {name: len(fake.calls_for("ApplyConfiguration")) - applies_before[name]
                   for name, fake in fakes.items()}
    assert new_applies == {"cp-1": 2, "cp-2": 2, "w-1": 0}  # the scheduler, kube-proxy
    assert applied == ["cp-1", "cp-2", "w-1"] and len(synced) == 1


def test_a_node_that_does_not_pull_on_request_is_skipped_and_another_error_stops(bundle, cluster):
    import grpc

    nodes, fakes = cluster
    fakes["w-1"].fail_next("ImagePull", grpc.StatusCode.UNIMPLEMENTED, "not implemented")
    run_upgrade(bundle, nodes, fakes, [], [])
    assert fakes["w-1"].image_pulls == []
    for fake in fakes.values():
        fake.static_pods.clear()
    fakes["cp-2"].fail_next("ImagePull", grpc.StatusCode.INTERNAL, "no space left on device")
    with pytest.raises(RollError, match=r"node cp-2 \(10.5.0.2\): pre-pulling registry.k8s.io/kube-apiserver:v1.36.3 "
                                        r"failed: .*no space left on device"):
        run_upgrade(bundle, nodes, fakes, [], [])
