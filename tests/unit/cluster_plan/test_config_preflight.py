"""Component images a patch pins (config_preflight.pinned_image_problems): one at another Kubernetes version
than the stack's would stay behind on upgrades, wherever Talos keeps it; the kubelet's -fat and -slim
flavours, a registry with a port and a digest are read as what they are. The stack-level refusals are rows of
tests/program/test_bad_stacks.py."""

from talos_proxmox.cluster_plan.config_preflight import pinned_image_problems


def test_a_pinned_image_at_the_stacks_version_is_fine_in_any_flavour_or_registry():
    documents = [{"version": "v1alpha1", "machine": {"kubelet": {"image": "ghcr.io/siderolabs/kubelet:v1.37.0-slim"}},
                  "cluster": {"apiServer": {"image": "mirror.lab:5000/kube-apiserver:v1.37.0@sha256:" + "0" * 64},
                              "scheduler": {"image": "mirror.lab:5000/kube-scheduler@sha256:" + "1" * 64}}},
                 {"apiVersion": "v1alpha1", "kind": "KubeletConfig", "image": "ghcr.io/siderolabs/kubelet:v1.37.0-fat"}]
    assert pinned_image_problems(documents, "1.37.0") == []


def test_one_at_another_version_is_named_with_the_tag_to_write():
    documents = [{"apiVersion": "v1alpha1", "kind": "KubeletConfig", "image": "ghcr.io/siderolabs/kubelet:v1.36.3-fat"},
                 {"apiVersion": "v1alpha1", "kind": "KubeProxyConfig", "image": "registry.k8s.io/kube-proxy:v1.36.3"}]
    assert pinned_image_problems(documents, "1.37.0") == [
        "KubeletConfig image is pinned at v1.36.3-fat, and cluster.kubernetesVersion is 1.37.0: a pinned kubelet "
        "would stay behind on upgrades (tag it v1.37.0-fat)",
        "KubeProxyConfig image is pinned at v1.36.3, and cluster.kubernetesVersion is 1.37.0: a pinned kube-proxy "
        "would stay behind on upgrades (tag it v1.37.0)"]
