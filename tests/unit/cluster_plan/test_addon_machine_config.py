"""The CCM's requirements in rendered machine configs of the test-cluster stack (node_patches -> render)."""

import copy

import pytest

from talos_proxmox.talos_config.machine_config import parse_config, render
from talos_proxmox.cluster_plan.node_patches import node_patches
from talos_proxmox.settings.stack import load_settings, stack_file_config
from tests.support import seed_cluster as seed
from tests.paths import STACKS



@pytest.fixture(scope="module")
def bundle():
    return seed.shared_bundle()


def rendered(bundle, ccm_enabled=True):
    """name -> (YAML text, v1alpha1 document) for master-1 and worker-1."""
    raw = copy.deepcopy(stack_file_config(str(STACKS / "Pulumi.test-cluster.yaml")))
    raw["ccm"]["enabled"] = ccm_enabled
    settings = load_settings(raw)
    out = {}
    for node in (settings.control_planes[0], settings.workers[0]):
        text = render(bundle, settings.cluster.name, settings.cluster.endpoint, node.role,
                      settings.cluster.talos_version, settings.cluster.kubernetes_version or seed.KUBERNETES_VERSION,
                      node_patches(settings, node, seed.INSTALLER))
        out[node.name] = (text, next(d for d in parse_config(text) if "apiVersion" not in d))
    return out


def test_every_node_runs_the_kubelet_for_an_external_cloud_provider(bundle):
    for name, (text, cfg) in rendered(bundle).items():
        args = cfg["machine"]["kubelet"]["extraArgs"]
        assert (args["cloud-provider"], args["rotate-server-certificates"]) == ("external", "true"), name
        assert "        cloud-provider: external\n" in text
        assert '        rotate-server-certificates: "true"\n' in text  # a string, as Talos' args map wants


def test_only_control_planes_let_kube_system_read_the_talos_api(bundle):
    configs = rendered(bundle)
    assert configs["master-1"][1]["machine"]["features"]["kubernetesTalosAPIAccess"] == {
        "enabled": True, "allowedRoles": ["os:reader"], "allowedKubernetesNamespaces": ["kube-system"]}
    assert "kubernetesTalosAPIAccess" not in configs["worker-1"][1]["machine"].get("features", {})


def test_ccm_off_leaves_kubelet_and_talos_api_access_alone(bundle):
    for name, (_text, cfg) in rendered(bundle, ccm_enabled=False).items():
        assert "cloud-provider" not in cfg["machine"]["kubelet"].get("extraArgs", {}), name
        assert "kubernetesTalosAPIAccess" not in cfg["machine"].get("features", {}), name
