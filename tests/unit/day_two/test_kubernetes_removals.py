"""What a Kubernetes minor version removes (talos_proxmox.day_two.kubernetes_removals): flags and feature
gates in the stack's configs, up to the stack's version, wherever Talos keeps a component's extraArgs; and
the removed API versions an upgrade path crosses, counted as the API server lists them."""

from talos_proxmox.day_two import kubernetes_removals as removals

V1ALPHA1 = {"version": "v1alpha1",
            "machine": {"kubelet": {"extraArgs": {"pod-infra-container-image": "pause:3.10",
                                                  "feature-gates": "PodDisruptionConditions=true, MyGate=false"}}},
            "cluster": {"apiServer": {"extraArgs": {"cloud-config": "/etc/cloud.conf", "v": "2"}},
                        "scheduler": {"extraArgs": {"feature-gates": "HonorPVReclaimPolicy=true"}}}}
KUBELET_DOCUMENT = {"apiVersion": "v1alpha1", "kind": "KubeletConfig",
                    "extraArgs": {"containerd": ["/run/containerd.sock"], "feature-gates": ["GangScheduling=true"]}}


def test_every_removal_up_to_the_stacks_version_is_named_where_it_is_set():
    assert removals.config_problems([V1ALPHA1, KUBELET_DOCUMENT], "1.37.0") == [
        "cluster.apiServer.extraArgs cloud-config: kube-apiserver has no flag --cloud-config: Kubernetes 1.33 "
        "removed it (the stack runs 1.37.0)",
        "cluster.scheduler.extraArgs feature-gates HonorPVReclaimPolicy: kube-scheduler has no feature gate "
        "HonorPVReclaimPolicy: Kubernetes 1.36 removed it (the stack runs 1.37.0)",
        "machine.kubelet.extraArgs feature-gates PodDisruptionConditions: kubelet has no feature gate "
        "PodDisruptionConditions: Kubernetes 1.34 removed it (the stack runs 1.37.0)",
        "machine.kubelet.extraArgs pod-infra-container-image: kubelet has no flag --pod-infra-container-image: "
        "Kubernetes 1.35 removed it (the stack runs 1.37.0)",
        "KubeletConfig extraArgs containerd: kubelet has no flag --containerd: Kubernetes 1.37 removed it (the "
        "stack runs 1.37.0)",
        "KubeletConfig extraArgs feature-gates GangScheduling: kubelet has no feature gate GangScheduling: "
        "Kubernetes 1.37 removed it (the stack runs 1.37.0)"]


def test_what_the_stacks_version_still_has_is_no_problem():
    assert removals.config_problems([V1ALPHA1, KUBELET_DOCUMENT], "1.32.3") == []
    at_1_35 = removals.config_problems([V1ALPHA1, KUBELET_DOCUMENT], "v1.35.0")
    assert [line.split(":")[0] for line in at_1_35] == [
        "cluster.apiServer.extraArgs cloud-config", "machine.kubelet.extraArgs feature-gates PodDisruptionConditions",
        "machine.kubelet.extraArgs pod-infra-container-image"]


def test_an_upgrade_path_crosses_the_apis_the_minors_after_its_start_remove():
    assert removals.removed_apis("1.36.3", "1.37.0") == ("workloads.v1alpha2.scheduling.k8s.io",
                                                         "podgroups.v1alpha2.scheduling.k8s.io")
    assert removals.removed_apis("1.37.0", "1.37.1") == ()  # a patch release removes nothing
    assert removals.removed_apis("1.35.4", "1.36.3") == ()
    assert removals.api_path("podgroups.v1alpha2.scheduling.k8s.io") == "/apis/scheduling.k8s.io/v1alpha2/podgroups"


def test_stored_objects_are_counted_and_an_api_not_served_is_skipped():
    listed = []

    def count(path):
        listed.append(path)
        return {"/apis/scheduling.k8s.io/v1alpha2/workloads": 2}.get(path)  # podgroups: not served (404)

    assert removals.stored_object_problems("1.36.3", "1.37.0", count) == [
        "2 workloads stored as scheduling.k8s.io/v1alpha2, which Kubernetes 1.37.0 no longer serves: move them to a "
        "served version (or delete them) before this upgrade"]
    assert listed == ["/apis/scheduling.k8s.io/v1alpha2/workloads", "/apis/scheduling.k8s.io/v1alpha2/podgroups"]
    assert removals.stored_object_problems("1.36.3", "1.37.0", lambda _path: 0) == []
