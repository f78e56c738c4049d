"""Machine configuration rendering: gen-config defaults, the seed's nine nodes, merge rules, refusals."""

import copy

import pytest

from talos_proxmox.talos_config import machine_config as mc
from talos_proxmox.talos_config import go_yaml, secrets_bundle, talos_yaml, v1alpha1_schema
from talos_proxmox.talos_config.machine_config import MachineConfigError, parse_config, render
from tests.support import seed_cluster as seed

DISK = {"machine": {"install": {"disk": "/dev/sda"}}}


@pytest.fixture(scope="module")
def bundle():
    return seed.shared_bundle()


def _render(bundle, role="worker", patches=(DISK,), version=seed.TALOS_VERSION):
    return render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, role, version, seed.KUBERNETES_VERSION, list(patches))


def _v1alpha1(text):
    docs = parse_config(text)
    return next(d for d in docs if "apiVersion" not in d)


def _secret_values(bundle):
    return [s for s in secrets_bundle.secret_strings(bundle) if len(s) >= 8]


# --- defaults ----------------------------------------------------------------------------------


def test_controlplane_defaults_match_gen_config_for_v1_13(bundle):
    text = _render(bundle, "controlplane")
    docs = parse_config(text)
    assert [d.get("kind", "v1alpha1") for d in docs] == ["v1alpha1", "HostnameConfig"]
    assert docs[1] == {"apiVersion": "v1alpha1", "kind": "HostnameConfig", "auto": "stable"}
    cfg = docs[0]
    assert list(cfg) == ["version", "debug", "persist", "machine", "cluster"]
    machine, cluster = cfg["machine"], cfg["cluster"]
    assert list(machine) == ["type", "token", "ca", "certSANs", "kubelet", "install", "features", "nodeLabels"]
    assert machine["type"] == "controlplane"
    assert machine["token"] == bundle["trustdinfo"]["token"]
    assert machine["ca"] == bundle["certs"]["os"]
    assert machine["kubelet"] == {
        "image": "ghcr.io/siderolabs/kubelet:v1.34.1",
        "defaultRuntimeSeccompProfileEnabled": True,
        "disableManifestsDirectory": True,
    }
    assert machine["install"] == {"disk": "/dev/sda", "image": "ghcr.io/siderolabs/installer:v1.13.7",
                                  "wipe": False, "grubUseUKICmdline": True}
    assert machine["features"] == {
        "diskQuotaSupport": True,
        "kubePrism": {"enabled": True, "port": 7445},
        "hostDNS": {"enabled": True, "forwardKubeDNSToHost": True},
    }
    assert machine["nodeLabels"] == {"node.kubernetes.io/exclude-from-external-load-balancers": ""}
    assert list(cluster) == ["id", "secret", "controlPlane", "clusterName", "network", "token",
                             "secretboxEncryptionSecret", "ca", "aggregatorCA", "serviceAccount", "apiServer",
                             "controllerManager", "proxy", "scheduler", "discovery", "etcd"]
    assert cluster["network"] == {"dnsDomain": "cluster.local", "podSubnets": ["10.244.0.0/16"],
                                  "serviceSubnets": ["10.96.0.0/12"]}
    assert cluster["controlPlane"] == {"endpoint": seed.ENDPOINT}
    assert cluster["token"] == bundle["secrets"]["bootstraptoken"]
    assert cluster["secretboxEncryptionSecret"] == bundle["secrets"]["secretboxencryptionsecret"]
    assert cluster["etcd"]["ca"] == bundle["certs"]["etcd"]
    assert cluster["serviceAccount"] == bundle["certs"]["k8sserviceaccount"]
    assert cluster["apiServer"]["image"] == "registry.k8s.io/kube-apiserver:v1.34.1"
    assert cluster["apiServer"]["admissionControl"][0]["name"] == "PodSecurity"
    assert cluster["apiServer"]["auditPolicy"]["rules"] == [{"level": "Metadata"}]
    assert cluster["controllerManager"]["image"] == "registry.k8s.io/kube-controller-manager:v1.34.1"
    assert cluster["scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.34.1"
    assert cluster["proxy"]["image"] == "registry.k8s.io/kube-proxy:v1.34.1"
    assert cluster["discovery"] == {"enabled": True, "registries": {"kubernetes": {"disabled": True}, "service": {}}}


def test_worker_defaults_carry_no_controlplane_secrets(bundle):
    cfg = _v1alpha1(_render(bundle, "worker"))
    assert cfg["machine"]["ca"] == {"crt": bundle["certs"]["os"]["crt"], "key": ""}
    assert cfg["cluster"]["ca"] == {"crt": bundle["certs"]["k8s"]["crt"], "key": ""}
    assert "nodeLabels" not in cfg["machine"]
    assert list(cfg["cluster"]) == ["id", "secret", "controlPlane", "clusterName", "network", "token", "ca", "discovery"]
    text = _render(bundle, "worker")
    for value in (bundle["certs"]["os"]["key"], bundle["certs"]["k8s"]["key"], bundle["certs"]["etcd"]["key"],
                  bundle["certs"]["k8sserviceaccount"]["key"], bundle["secrets"]["secretboxencryptionsecret"]):
        assert value not in text


def test_v1_12_contract_keeps_empty_machine_network(bundle):
    cfg = _v1alpha1(_render(bundle, "worker", version="v1.12.4"))
    assert list(cfg["machine"])[:6] == ["type", "token", "ca", "certSANs", "kubelet", "network"]
    assert cfg["machine"]["network"] == {}
    assert cfg["machine"]["install"]["image"] == "ghcr.io/siderolabs/installer:v1.12.4"


def test_layout_is_talosctl_yaml(bundle):
    text = _render(bundle, "controlplane")
    assert text.startswith("version: v1alpha1\ndebug: false\npersist: true\nmachine:\n    type: controlplane\n")
    assert "    certSANs: []\n" in text
    assert "        podSubnets:\n            - 10.244.0.0/16\n" in text
    assert "            - name: PodSecurity\n              configuration:\n                apiVersion: pod-security" in text
    assert '        node.kubernetes.io/exclude-from-external-load-balancers: ""\n' in text
    assert text.endswith("---\napiVersion: v1alpha1\nkind: HostnameConfig\nauto: stable\n")


# --- the seed's nine nodes ---------------------------------------------------------------------


def _render_seed(bundle, role_patches=None):
    return {
        node["name"]: render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, node["role"], seed.TALOS_VERSION,
                             seed.KUBERNETES_VERSION, seed.node_patches(node, role_patches=role_patches))
        for node in seed.nodes()
    }


def test_seed_nine_nodes_render_what_the_walkthrough_applies(bundle):
    configs = _render_seed(bundle)
    assert len(configs) == 9
    for node in seed.nodes():
        cfg = _v1alpha1(configs[node["name"]])
        machine, cluster = cfg["machine"], cfg["cluster"]
        assert machine["type"] == node["role"]
        assert machine["install"]["disk"] == "/dev/sda"
        assert machine["install"]["image"] == seed.INSTALLER
        assert machine["network"]["kubespan"] == {"enabled": True, "advertiseKubernetesNetworks": False, "mtu": 1420}
        assert machine["network"]["interfaces"] == [{
            "deviceSelector": {"hardwareAddr": node["mac"]},
            "addresses": [f"{node['ip']}/24"],
            "routes": [{"network": "0.0.0.0/0", "gateway": "10.255.200.1"}],
            "dhcp": False,
        }]
        assert machine["network"]["nameservers"] == ["9.9.9.9"]
        assert cluster["network"]["cni"] == {"name": "none"}
        assert cluster["proxy"]["disabled"] is True
        assert cluster["discovery"]["enabled"] is True
        assert cluster["controlPlane"]["endpoint"] == "https://10.255.200.201:6443"
        assert cluster["clusterName"] == "test-cluster"
        if node["data_disk"]:
            assert machine["kernel"] == {"modules": [{"name": "iscsi_tcp"}]}
            assert machine["disks"] == [{"device": "/dev/sdb", "partitions": [{"mountpoint": "/var/lib/longhorn"}]}]
            assert machine["kubelet"]["extraMounts"] == [{
                "destination": "/var/lib/longhorn", "type": "bind", "source": "/var/lib/longhorn",
                "options": ["bind", "rshared", "rw"],
            }]
        else:
            assert "kernel" not in machine and "disks" not in machine and "extraMounts" not in machine["kubelet"]
        if node["role"] == "controlplane":
            assert cluster["proxy"] == {"disabled": True, "image": "registry.k8s.io/kube-proxy:v1.34.1"}
            assert "etcd" in cluster and "apiServer" in cluster
        else:
            assert cluster["proxy"] == {"disabled": True}
    # Struct order as Talos writes it: network before disks before install; kernel after features.
    worker1 = _v1alpha1(configs["worker-1"])["machine"]
    assert list(worker1) == ["type", "token", "ca", "certSANs", "kubelet", "network", "disks", "install", "features", "kernel"]
    assert list(worker1["network"]) == ["interfaces", "nameservers", "kubespan"]
    assert '                hardwareAddr: bc:24:11:80:a1:9b\n' not in configs["worker-1"]  # master-1 has that MAC
    assert '                hardwareAddr: bc:24:11:80:a1:9b\n' in configs["master-1"]


def test_render_is_deterministic_and_independent_of_patch_key_order(bundle):
    node = seed.nodes()[3]
    first = render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, "worker", seed.TALOS_VERSION, seed.KUBERNETES_VERSION,
                   seed.node_patches(node))
    second = render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, "worker", seed.TALOS_VERSION, seed.KUBERNETES_VERSION,
                    seed.node_patches(node))
    assert first == second
    reordered = [talos_yaml.load_documents(p)[0] for p in seed.node_patches(node)]
    reordered = [dict(reversed(list(p.items()))) for p in reordered]
    assert render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, "worker", seed.TALOS_VERSION,
                  seed.KUBERNETES_VERSION, reordered) == first
    assert parse_config(first) == mc.render_documents(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, "worker",
                                                      seed.TALOS_VERSION, seed.KUBERNETES_VERSION,
                                                      seed.node_patches(node))


def test_changing_one_patch_changes_only_the_nodes_that_use_it(bundle):
    before = _render_seed(bundle)
    changed = {
        "controlplane": seed.PATCH_CONTROLPLANE,
        "worker-disk": seed.PATCH_WORKER_WITH_DISK.replace("/var/lib/longhorn", "/var/mnt/longhorn"),
        "worker": seed.PATCH_WORKER_WITHOUT_DISK,
    }
    after = _render_seed(bundle, role_patches=changed)
    differing = sorted(name for name in before if before[name] != after[name])
    assert differing == ["worker-1", "worker-2", "worker-3"]
    assert "/var/mnt/longhorn" in after["worker-2"] and "/var/mnt/longhorn" not in after["worker-4"]


# --- merge rules -------------------------------------------------------------------------------


def test_interfaces_merge_by_device_selector_and_by_name(bundle):
    cfg = _v1alpha1(_render(bundle, patches=[
        DISK,
        {"machine": {"network": {"interfaces": [
            {"deviceSelector": {"hardwareAddr": "bc:24:11:00:00:01"}, "addresses": ["10.0.0.2/24"]},
            {"interface": "eth1", "dhcp": True},
        ]}}},
        {"machine": {"network": {"interfaces": [
            {"deviceSelector": {"hardwareAddr": "bc:24:11:00:00:01"}, "addresses": ["10.0.0.3/24"], "mtu": 9000},
            {"interface": "eth1", "dhcp": False},
            {"deviceSelector": {"hardwareAddr": "bc:24:11:00:00:02"}, "dhcp": True},
        ]}}},
    ]))
    assert cfg["machine"]["network"]["interfaces"] == [
        {"deviceSelector": {"hardwareAddr": "bc:24:11:00:00:01"}, "addresses": ["10.0.0.2/24", "10.0.0.3/24"], "mtu": 9000},
        {"interface": "eth1", "dhcp": False},
        {"deviceSelector": {"hardwareAddr": "bc:24:11:00:00:02"}, "dhcp": True},
    ]


def test_lists_append_but_subnets_and_audit_policy_replace(bundle):
    cfg = _v1alpha1(_render(bundle, "controlplane", patches=[
        DISK,
        {"machine": {"certSANs": ["a.example"]}},
        {"machine": {"certSANs": ["b.example"]}},
        {"cluster": {"network": {"podSubnets": ["10.42.0.0/16"], "serviceSubnets": ["10.43.0.0/16"]}}},
        {"cluster": {"apiServer": {"auditPolicy": {"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                                                   "rules": [{"level": "None"}]}}}},
    ]))
    assert cfg["machine"]["certSANs"] == ["a.example", "b.example"]
    assert cfg["cluster"]["network"]["podSubnets"] == ["10.42.0.0/16"]
    assert cfg["cluster"]["network"]["serviceSubnets"] == ["10.43.0.0/16"]
    assert cfg["cluster"]["apiServer"]["auditPolicy"]["rules"] == [{"level": "None"}]


def test_ccm_shaped_patches_merge(bundle):
    ccm_all = {"machine": {"kubelet": {"extraArgs": {"cloud-provider": "external", "rotate-server-certificates": True}}},
               "cluster": {"externalCloudProvider": {"enabled": True}}}
    ccm_cp = """\
machine:
  features:
    kubernetesTalosAPIAccess:
      enabled: true
      allowedRoles:
        - os:reader
      allowedKubernetesNamespaces:
        - kube-system
"""
    override = {"machine": {"kubelet": {"extraArgs": {"rotate-server-certificates": "true", "node-labels": "a=b"}}}}
    cfg = _v1alpha1(_render(bundle, "controlplane", patches=[DISK, ccm_all, ccm_cp, override]))
    kubelet = cfg["machine"]["kubelet"]
    assert kubelet["extraArgs"] == {"cloud-provider": "external", "node-labels": "a=b", "rotate-server-certificates": "true"}
    assert list(kubelet) == ["image", "extraArgs", "defaultRuntimeSeccompProfileEnabled", "disableManifestsDirectory"]
    assert cfg["machine"]["features"]["kubernetesTalosAPIAccess"] == {
        "enabled": True, "allowedRoles": ["os:reader"], "allowedKubernetesNamespaces": ["kube-system"]}
    assert list(cfg["machine"]["features"])[:2] == ["kubernetesTalosAPIAccess", "diskQuotaSupport"]
    assert cfg["cluster"]["externalCloudProvider"] == {"enabled": True}


def test_admission_plugins_merge_by_name_and_vlans_by_id(bundle):
    cfg = _v1alpha1(_render(bundle, "controlplane", patches=[
        DISK,
        {"cluster": {"apiServer": {"admissionControl": [
            {"name": "PodSecurity", "configuration": {"defaults": {"enforce": "restricted"}}}]}}},
        {"machine": {"network": {"interfaces": [{"interface": "eth0", "vlans": [{"vlanId": 10, "dhcp": True}]}]}}},
        {"machine": {"network": {"interfaces": [{"interface": "eth0", "vlans": [{"vlanId": 10, "mtu": 1400},
                                                                                {"vlanId": 20, "dhcp": True}]}]}}},
    ]))
    plugins = cfg["cluster"]["apiServer"]["admissionControl"]
    assert len(plugins) == 1 and plugins[0]["configuration"]["defaults"]["enforce"] == "restricted"
    assert plugins[0]["configuration"]["defaults"]["audit"] == "restricted"
    # Vlan.routes and vlanId have no omitempty in Talos: written out even when not given.
    assert cfg["machine"]["network"]["interfaces"][0]["vlans"] == [
        {"routes": [], "dhcp": True, "vlanId": 10, "mtu": 1400}, {"routes": [], "dhcp": True, "vlanId": 20}]


def test_patch_delete_removes_keys_list_items_and_documents(bundle):
    text = _render(bundle, patches=[
        DISK,
        {"machine": {"network": {"interfaces": [{"interface": "eth0", "dhcp": True}, {"interface": "eth1", "dhcp": True}]}}},
        """\
machine:
  features:
    hostDNS:
      $patch: delete
  network:
    interfaces:
      - interface: eth0
        $patch: delete
---
apiVersion: v1alpha1
kind: HostnameConfig
$patch: delete
""",
    ])
    docs = parse_config(text)
    assert len(docs) == 1
    assert "hostDNS" not in docs[0]["machine"]["features"]
    assert docs[0]["machine"]["network"]["interfaces"] == [{"interface": "eth1", "dhcp": True}]


def test_patch_adds_and_patches_other_documents(bundle):
    docs = parse_config(_render(bundle, patches=[
        DISK,
        "apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: worker-1\nauto: \"off\"\n",
        "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: tailscale\nenvironment:\n  - TS_AUTHKEY=x\n",
    ]))
    assert docs[1] == {"apiVersion": "v1alpha1", "kind": "HostnameConfig", "auto": "off", "hostname": "worker-1"}
    assert docs[2]["kind"] == "ExtensionServiceConfig" and docs[2]["name"] == "tailscale"
    assert list(docs[2])[:3] == ["apiVersion", "kind", "name"]


def test_json6902_patches_address_the_v1alpha1_document(bundle):
    cfg = _v1alpha1(_render(bundle, patches=[
        DISK,
        [{"op": "add", "path": "/machine/install/extraKernelArgs", "value": ["net.ifnames=0"]},
         {"op": "replace", "path": "/cluster/network/dnsDomain", "value": "k8s.internal"}],
        "- op: remove\n  path: /machine/features/hostDNS\n",
    ]))
    assert cfg["machine"]["install"]["extraKernelArgs"] == ["net.ifnames=0"]
    assert list(cfg["machine"]["install"]) == ["disk", "extraKernelArgs", "image", "wipe", "grubUseUKICmdline"]
    assert cfg["cluster"]["network"]["dnsDomain"] == "k8s.internal"
    assert "hostDNS" not in cfg["machine"]["features"]


def test_yaml_1_1_lookalikes_stay_strings(bundle):
    text = _render(bundle, patches=[DISK, "machine:\n  network:\n    interfaces:\n"
                                          "      - deviceSelector:\n          hardwareAddr: 10:11:22:33:44:55\n"
                                          "        dhcp: true\n"])
    assert "                hardwareAddr: '10:11:22:33:44:55'\n" in text  # Go quotes base-60 lookalikes
    assert _v1alpha1(text)["machine"]["network"]["interfaces"][0]["deviceSelector"]["hardwareAddr"] == "10:11:22:33:44:55"


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("role, patches, expected", [
    ("worker", [DISK, {"kubernetes": {"x": 1}}], "unknown key 'kubernetes' at top level of the v1alpha1 document"),
    ("worker", [DISK, {"machine": {"network": {"kubeSpan": {"enabled": True}}}}],
     "unknown key 'kubeSpan' at machine.network; did you mean 'kubespan'?"),
    ("worker", [DISK, {"machine": {"type": "controlplane"}}], "machine.type is 'controlplane' but this node's role is 'worker'"),
    ("controlplane", [DISK, [{"op": "replace", "path": "/machine/type", "value": "worker"}]],
     "machine.type is 'worker' but this node's role is 'controlplane'"),
    ("worker", [DISK, {"cluster": {"apiServer": {"certSANs": ["x"]}}}], "cluster.apiServer is only valid on controlplane nodes"),
    ("worker", [DISK, {"cluster": {"etcd": {"advertisedSubnets": ["10.0.0.0/8"]}}}], "cluster.etcd is only valid on controlplane"),
    ("worker", [], "machine.install.disk is missing"),
    ("worker", [DISK, {"machine": {"network": {"interfaces": [{"interface": "eth0", "deviceSelector": {"driver": "virtio"}}]}}}],
     "machine.network.interfaces[0]: expected exactly one of interface or deviceSelector"),
    ("worker", [DISK, {"machine": {"network": {"nameservers": "9.9.9.9"}}}], "machine.network.nameservers: expected a list, got a scalar"),
    ("worker", [DISK, {"machine": {"certSANs": "a.example"}}], "machine.certSANs is a scalar in the patch but a list in the config"),
    ("worker", [DISK, {"machine": {"disks": {"device": "/dev/sdb"}}}], "machine.disks: expected a list, got a mapping"),
    ("worker", [DISK, "machine: [unclosed"], "patch 2: not valid YAML at line "),
    ("worker", [DISK, [{"op": "remove", "path": "/machine/nothing"}]], "patch 2: operation 1 (remove /machine/nothing) cannot be applied"),
    ("worker", [DISK, [{"op": "frobnicate", "path": "/x"}]], "patch 2: operation 1 is not an RFC 6902 operation"),
    ("worker", [DISK, "machine:\n  features:\n    imageCache:\n      $patch: delete\n"],
     "patch 2: $patch: delete of machine.features.imageCache, which the config does not have"),
    ("worker", [DISK, "version: v1alpha1\n$patch: delete\n"], "patch 2: the v1alpha1 document cannot be deleted"),
    ("worker", [DISK, 42], "patch 2: is a int; expected a mapping"),
    ("worker", [DISK, {"machine": {"features": {"kubePrism": {"qqq": 1}}}}],
     "unknown key 'qqq' at machine.features.kubePrism; expected one of: enabled, port"),
    ("worker", [DISK, [{"op": "replace", "path": "/version", "value": "v1alpha2"}]], "version: expected 'v1alpha1'"),
    ("worker", [DISK, {"cluster": {"ca": {"key": "a-key"}}}],
     "cluster.ca.key must be empty on a worker (the CA key stays on control planes)"),
    ("worker", [DISK, [{"op": "replace", "path": "/machine/ca", "value": "a-ca"}]],
     "machine.ca: expected a mapping, got a scalar"),
    ("worker", [DISK, {"cluster": {"controlPlane": {"endpoint": "http://10.255.200.201:6443"}}}],
     "cluster.controlPlane.endpoint: expected an https:// URL of the Kubernetes API"),
    ("worker", [DISK, {"machine": {"network": {"interfaces": [
        "eth0", {"interface": "eth1", "deviceSelector": {"driver": "virtio"}}]}}}],
     "machine.network.interfaces[0]: expected a mapping, got a scalar\n"
     "  - machine.network.interfaces[1]: expected exactly one of interface or deviceSelector"),
])
def test_invalid_results_are_refused_with_clear_messages(bundle, role, patches, expected):
    with pytest.raises(MachineConfigError) as err:
        _render(bundle, role, patches)
    assert expected in str(err.value)


INTERFACE = {"interface": "eth0", "dhcp": True}


@pytest.mark.parametrize("patch, expected", [
    ({"machine": {"install": {"wipe": "yes"}}}, "machine.install.wipe: expected true or false, got a string"),
    ({"machine": {"network": {"interfaces": [{**INTERFACE, "dhcp": 1}]}}},
     "machine.network.interfaces[0].dhcp: expected true or false, got an integer"),
    ({"machine": {"network": {"interfaces": [{**INTERFACE, "mtu": "1500"}]}}},
     "machine.network.interfaces[0].mtu: expected an integer, got a string"),
    ({"machine": {"network": {"interfaces": [{**INTERFACE, "mtu": 1500.5}]}}},
     "machine.network.interfaces[0].mtu: expected an integer, got a number"),
    ({"machine": {"network": {"interfaces": [{**INTERFACE, "mtu": {"value": 1500}}]}}},
     "machine.network.interfaces[0].mtu: expected an integer, got a mapping"),
    ({"machine": {"features": {"kubePrism": {"port": True}}}},
     "machine.features.kubePrism.port: expected an integer, got a boolean"),
    ({"machine": {"network": {"interfaces": [{**INTERFACE, "cidr": ["10.0.0.5/24"]}]}}},
     "machine.network.interfaces[0].cidr: expected a string, got a list"),
])
def test_a_value_of_the_wrong_type_is_refused_as_gos_decoder_would(bundle, patch, expected):
    with pytest.raises(MachineConfigError) as err:
        _render(bundle, "worker", [DISK, patch])
    assert str(err.value) == f"machine configuration is invalid:\n  - {expected}"


def test_worker_patch_leaking_a_ca_key_is_refused_without_echoing_it(bundle):
    leak = {"machine": {"ca": {"key": bundle["certs"]["os"]["key"]}}}
    with pytest.raises(MachineConfigError, match="machine.ca.key must be empty on a worker") as err:
        _render(bundle, "worker", [DISK, leak])
    for secret in _secret_values(bundle):
        assert secret not in str(err.value)


def test_failed_json_test_op_does_not_echo_secret_values(bundle):
    op = [{"op": "test", "path": "/cluster/secret", "value": "definitely-not-it"}]
    with pytest.raises(MachineConfigError, match=r"operation 1 \(test /cluster/secret\)") as err:
        _render(bundle, "worker", [DISK, op])
    for secret in _secret_values(bundle):
        assert secret not in str(err.value)


@pytest.mark.parametrize("kwargs, expected", [
    ({"role": "init"}, "role 'init' is not a node role; expected one of controlplane, worker"),
    ({"talos_version": "v1.11.5"},
     "talos_version 'v1.11.5': contract v1.11 is not supported; expected one of v1.12, v1.13, v1.14"),
    ({"talos_version": "v1.15.0"},
     "talos_version 'v1.15.0': contract v1.15 is not supported; expected one of v1.12, v1.13, v1.14"),
    ({"talos_version": "1.13"}, "talos_version '1.13' is not a full Talos version; expected e.g. 'v1.13.7'"),
    ({"endpoint": "10.255.200.201:6443"},
     "endpoint '10.255.200.201:6443' is not a Kubernetes API URL; expected e.g. 'https://10.255.200.201:6443'"),
    ({"endpoint": "http://10.255.200.201:6443"},
     "endpoint 'http://10.255.200.201:6443' is not a Kubernetes API URL; expected e.g. 'https://10.255.200.201:6443'"),
    ({"endpoint": "https://:6443"},
     "endpoint 'https://:6443' is not a Kubernetes API URL; expected e.g. 'https://10.255.200.201:6443'"),
    ({"kubernetes_version": "latest"}, "kubernetes_version 'latest' is not a Kubernetes version; expected e.g. '1.34.1'"),
    ({"kubernetes_version": "X1.34.1"}, "kubernetes_version 'X1.34.1' is not a Kubernetes version; expected e.g. '1.34.1'"),
    ({"cluster_name": " "}, "cluster_name must be a non-empty string"),
    ({"cluster_name": 42}, "cluster_name must be a non-empty string"),
])
def test_bad_inputs_are_refused(bundle, kwargs, expected):
    args = dict(secrets=bundle, cluster_name=seed.CLUSTER_NAME, endpoint=seed.ENDPOINT, role="worker",
                talos_version=seed.TALOS_VERSION, kubernetes_version=seed.KUBERNETES_VERSION, patches=[DISK])
    args.update(kwargs)
    with pytest.raises(MachineConfigError) as err:
        render(**args)
    assert str(err.value) == expected


@pytest.mark.parametrize("talos_version, kubernetes_version, installer, kubelet", [
    (" v1.13.7\n", " v1.34.1 ", "ghcr.io/siderolabs/installer:v1.13.7", "ghcr.io/siderolabs/kubelet:v1.34.1"),
    ("1.12.4", "1.35.0-alpha.1", "ghcr.io/siderolabs/installer:v1.12.4", "ghcr.io/siderolabs/kubelet:v1.35.0-alpha.1"),
    ("v1.13.0-beta.0", "1.35.0-RC.1", "ghcr.io/siderolabs/installer:v1.13.0-beta.0",
     "ghcr.io/siderolabs/kubelet:v1.35.0-RC.1"),
])
def test_versions_are_taken_with_or_without_v_and_surrounding_space(bundle, talos_version, kubernetes_version,
                                                                     installer, kubelet):
    machine = _v1alpha1(render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, "worker", talos_version, kubernetes_version,
                               [DISK]))["machine"]
    assert (machine["install"]["image"], machine["kubelet"]["image"]) == (installer, kubelet)


def _without(bundle, path):
    broken = copy.deepcopy(bundle)
    *parents, last = path.split(".")
    node = broken
    for part in parents:
        node = node[part]
    del node[last]
    return broken


def _with(bundle, path, value):
    broken = copy.deepcopy(bundle)
    *parents, last = path.split(".")
    node = broken
    for part in parents:
        node = node[part]
    node[last] = value
    return broken


@pytest.mark.parametrize("version", ["v1.13.7", "v1.14.0"])
@pytest.mark.parametrize("broken, expected", [
    (lambda b: _without(b, "certs.os.key"), "secrets bundle: certs.os.key is required"),
    (lambda b: _with(b, "certs.os.crt", ""), "secrets bundle: certs.os.crt is required"),
    (lambda b: _with(b, "trustdinfo.token", 12345678), "secrets bundle: trustdinfo.token is required"),
    (lambda b: _with(b, "certs.etcd", "not a mapping"), "secrets bundle: certs.etcd.crt is required"),
    (lambda b: _without(b, "secrets.secretboxencryptionsecret"),
     "secrets bundle: secrets.secretboxencryptionsecret is required"),
])
def test_an_incomplete_bundle_is_named_not_echoed(bundle, version, broken, expected):
    with pytest.raises(secrets_bundle.SecretsBundleError) as err:
        render(broken(bundle), seed.CLUSTER_NAME, seed.ENDPOINT, "controlplane", version, seed.KUBERNETES_VERSION)
    assert str(err.value) == expected
    for secret in _secret_values(bundle):
        assert secret not in str(err.value)


# --- Talos' encoding of the patched result -----------------------------------------------------


def test_empty_values_are_encoded_as_talos_does(bundle):
    cfg = _v1alpha1(_render(bundle, "controlplane", patches=[
        DISK,
        # Deleting the only label / admission plugin leaves empty omitempty fields: Talos drops them.
        "machine:\n  nodeLabels:\n    node.kubernetes.io/exclude-from-external-load-balancers:\n      $patch: delete\n",
        "cluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n        $patch: delete\n",
        # Route.gateway has no omitempty; Route.metric does.
        {"machine": {"network": {"interfaces": [{"interface": "eth0", "routes": [{"network": "10.0.0.0/8", "metric": 0}]}]}}},
        {"machine": {"install": {"extraKernelArgs": []}, "kubelet": {"extraArgs": {}}}},
    ]))
    assert "nodeLabels" not in cfg["machine"]
    assert "admissionControl" not in cfg["cluster"]["apiServer"]
    assert cfg["machine"]["network"]["interfaces"][0]["routes"] == [{"network": "10.0.0.0/8", "gateway": ""}]
    assert "extraKernelArgs" not in cfg["machine"]["install"] and "extraArgs" not in cfg["machine"]["kubelet"]
    assert cfg["machine"]["install"]["wipe"] is False  # a pointer: false is still written


ETH0 = {"interface": "eth0", "dhcp": True}


@pytest.mark.parametrize("patch, path, expected", [
    # Fields without omitempty are written when unset, as Go's zero value (checked against Talos's machinery):
    # an integer 0, an Unstructured {} and a struct its own zero; a null is the unset value.
    ({"machine": {"network": {"interfaces": [{**ETH0, "dhcpOptions": {"ipv4": True}}]}}},
     ("machine", "network", "interfaces", 0, "dhcpOptions"), {"routeMetric": 0, "ipv4": True}),
    ({"machine": {"network": {"interfaces": [{**ETH0, "dhcpOptions": {"ipv4": True, "routeMetric": None}}]}}},
     ("machine", "network", "interfaces", 0, "dhcpOptions"), {"routeMetric": 0, "ipv4": True}),
    ({"cluster": {"apiServer": {"admissionControl": [{"name": "EventRateLimit"}]}}},
     ("cluster", "apiServer", "admissionControl", 1), {"name": "EventRateLimit", "configuration": {}}),
    ({"machine": {"seccompProfiles": [{"name": "audit.json", "value": None}]}},
     ("machine", "seccompProfiles", 0), {"name": "audit.json", "value": {}}),
    ("cluster:\n  discovery:\n    registries:\n      kubernetes:\n        $patch: delete\n",
     ("cluster", "discovery", "registries"), {"kubernetes": {}, "service": {}}),
    # A null list is an empty one: written as [] without omitempty, dropped with it; so is an empty string.
    ({"machine": {"network": {"interfaces": [{**ETH0, "addresses": None, "cidr": "",
                                              "vlans": [{"vlanId": 5, "routes": None}]}]}}},
     ("machine", "network", "interfaces", 0), {"interface": "eth0", "vlans": [{"routes": [], "vlanId": 5}], "dhcp": True}),
    # A bool that is not a pointer is dropped when false; a struct that is not a pointer when all empty.
    ({"cluster": {"apiServer": {"extraVolumes": [{"hostPath": "/var/a", "mountPath": "/var/a", "readonly": True},
                                                 {"hostPath": "/var/b", "mountPath": "/var/b", "readonly": False}]}}},
     ("cluster", "apiServer", "extraVolumes"),
     [{"hostPath": "/var/a", "mountPath": "/var/a", "readonly": True}, {"hostPath": "/var/b", "mountPath": "/var/b"}]),
    ({"machine": {"registries": {}}}, ("machine", "registries"), None),
    ({"machine": {"registries": {"mirrors": {"docker.io": {"endpoints": ["https://mirror.example"]}}}}},
     ("machine", "registries"), {"mirrors": {"docker.io": {"endpoints": ["https://mirror.example"]}}}),
])
def test_unset_null_and_empty_fields_are_encoded_as_talos_does(bundle, patch, path, expected):
    node = _v1alpha1(_render(bundle, "controlplane", [DISK, patch]))
    for part in path:
        node = node[part] if isinstance(node, list) or part in node else None
    assert node == expected
    if isinstance(expected, dict):
        assert list(node) == list(expected)  # and in Talos's field order


@pytest.mark.parametrize("layout, zero", [
    ("list[]!a", []),
    ("map{}!a", {}),
    ("pointer=PEMKey!a!p", None),
    ("mapping=LinuxIDMapping!a", {"containerID": 0, "hostID": 0, "size": 0}),
    ("text!a!s", ""),
    ("flag!a!b", False),
    ("number!a!i", 0),
    ("mode!a!m", go_yaml.OctalInt(0)),
    ("unstructured!a", {}),
])
def test_an_unset_field_without_omitempty_is_gos_zero_value(layout, zero):
    # Every kind of field the layout can declare, including kinds no Talos struct has without omitempty yet.
    [field] = v1alpha1_schema._parse({"Struct": layout})["Struct"].values()
    errors = []
    value = mc._zero(field, ("at",), errors)
    assert (value, type(value), errors) == (zero, type(zero), [])


def test_a_file_mode_is_written_in_octal_and_a_scalar_in_a_string_field_as_quoted_text(bundle):
    # Talos's FileMode marshals as `0o644`; Go's decoder keeps a number's or boolean's text in a string
    # field, which its encoder then quotes (both checked against Talos's machinery in test_talos_oracle).
    files = [{"content": 1234, "permissions": 420, "path": "/var/a", "op": "create"},
             {"content": True, "permissions": 0, "path": "/var/b", "op": "create"},
             {"content": 1.5, "permissions": 0o4755, "path": "/var/c", "op": "create"},
             {"content": 2**70, "permissions": 0o600, "path": "/var/d", "op": "create"}]
    text = _render(bundle, "worker", [DISK, {"machine": {"files": files}}])
    assert ("    files:\n"
            "        - content: \"1234\"\n          permissions: 0o644\n          path: /var/a\n          op: create\n"
            "        - content: \"true\"\n          permissions: 0o0\n          path: /var/b\n          op: create\n"
            "        - content: \"1.5\"\n          permissions: 0o4755\n          path: /var/c\n          op: create\n"
            f"        - content: \"{2**70}\"\n          permissions: 0o600\n") in text
    assert [f["permissions"] for f in _v1alpha1(text)["machine"]["files"]] == [420, 0, 0o4755, 0o600]


@pytest.mark.parametrize("permissions, got", [("0o644", "a string"), (True, "a boolean"), (4.5, "a number")])
def test_a_file_mode_that_is_no_integer_is_refused(bundle, permissions, got):
    files = [{"content": "x", "permissions": permissions, "path": "/var/a", "op": "create"}]
    with pytest.raises(MachineConfigError) as refused:
        _render(bundle, "worker", [DISK, {"machine": {"files": files}}])
    assert str(refused.value).endswith(f"\n  - machine.files[0].permissions: expected an integer, got {got}")


def test_inline_manifest_leading_newlines_are_trimmed_like_talos(bundle):
    patch = "cluster:\n  inlineManifests:\n    - name: cilium\n      contents: |\n\n        ---\n        kind: ServiceAccount\n"
    text = _render(bundle, "controlplane", patches=[DISK, patch])
    assert _v1alpha1(text)["cluster"]["inlineManifests"] == [{"name": "cilium", "contents": "---\nkind: ServiceAccount\n"}]
    assert "          contents: |\n            ---\n            kind: ServiceAccount\n" in text


def test_other_documents_follow_their_own_merge_rules(bundle):
    service = "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: foo\nconfigFiles:\n" \
              "  - content: hello\n    mountPath: /etc/foo\n"
    update = "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: foo\nconfigFiles:\n" \
             "  - content: hello world\n    mountPath: /etc/foo\n  - content: other\n    mountPath: /etc/bar\n"
    rule = {"apiVersion": "v1alpha1", "kind": "NetworkRuleConfig", "name": "kubelet",
            "portSelector": {"ports": [10250], "protocol": "tcp"}, "ingress": [{"subnet": "10.0.0.0/8"}]}
    rule_update = {"apiVersion": "v1alpha1", "kind": "NetworkRuleConfig", "name": "kubelet",
                   "portSelector": {"ports": [10255]}, "ingress": [{"subnet": "192.168.0.0/16"}]}
    docs = parse_config(_render(bundle, patches=[DISK, service, update, rule, rule_update]))
    by_kind = {d.get("kind"): d for d in docs}
    assert by_kind["ExtensionServiceConfig"]["configFiles"] == [
        {"content": "hello world", "mountPath": "/etc/foo"}, {"content": "other", "mountPath": "/etc/bar"}]
    assert by_kind["NetworkRuleConfig"]["portSelector"] == {"ports": [10255], "protocol": "tcp"}
    assert by_kind["NetworkRuleConfig"]["ingress"] == [{"subnet": "192.168.0.0/16"}]


def test_empty_strings_and_zeros_do_not_clear_set_fields_but_false_does(bundle):
    cfg = _v1alpha1(_render(bundle, "controlplane", patches=[
        DISK,
        {"machine": {"install": {"disk": "", "wipe": True}, "nodeLabels": {"zone": "a"}}},
        {"machine": {"nodeLabels": {"zone": ""}, "features": {"kubePrism": {"port": 0}}},
         "cluster": {"network": {"dnsDomain": ""}}},
        {"machine": {"install": {"wipe": False}}},
    ]))
    assert cfg["machine"]["install"]["disk"] == "/dev/sda"
    assert cfg["machine"]["install"]["wipe"] is False
    assert cfg["machine"]["nodeLabels"]["zone"] == "a"
    assert cfg["machine"]["features"]["kubePrism"]["port"] == 7445
    assert cfg["cluster"]["network"]["dnsDomain"] == "cluster.local"


# --- how patches find, add, merge and refuse documents, pinned ---------------------------------------


def _documents(bundle, *patches):
    return parse_config(_render(bundle, "worker", [DISK, *patches]))


def test_documents_are_matched_by_kind_and_name():
    bundle = seed.shared_bundle()
    first = "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: a\nenvironment: [X=1]\n"
    second = "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: b\nenvironment: [Y=2]\n"
    again = "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: a\nenvironment: [Z=3]\n"
    services = [d for d in _documents(bundle, first, second, again) if d.get("kind") == "ExtensionServiceConfig"]
    assert [(d["name"], d["environment"]) for d in services] == [("a", ["X=1", "Z=3"]), ("b", ["Y=2"])]


def test_the_callers_patches_are_left_as_they_were():
    bundle = seed.shared_bundle()
    patch = {"machine": {"nodeLabels": {"zone": "w1"}, "install": {"disk": "/dev/sdb"}}}
    text_patch = "machine:\n  sysctls:\n    vm.max_map_count: '262144'\n"
    before = copy.deepcopy(patch)
    _render(bundle, "worker", [patch, text_patch])
    again = _render(bundle, "worker", [patch, text_patch])
    assert patch == before and _v1alpha1(again)["machine"]["install"]["disk"] == "/dev/sdb"


@pytest.mark.parametrize("patch, expected", [
    ("apiVersion: v1alpha1\nname: x\n", "patch 2: a document with apiVersion needs a kind too"),
    ("machine: {}\n---\n- just\n- a list\n", "patch 2: document 2 is a list; expected a mapping (strategic merge) "
                                              "or one list of RFC 6902 operations"),
    ("", "patch 2: is empty"),
    (42, "patch 2: is a int; expected a mapping, YAML text or a list of RFC 6902 operations"),
    ([{"op": "remove", "path": "/machine/nothing"}],
     "patch 2: operation 1 (remove /machine/nothing) cannot be applied to the v1alpha1 document (JsonPatchConflict)"),
    ([{"op": "replace", "path": "", "value": ["x"]}], "patch 2: the v1alpha1 document is no longer a mapping"),
    ([{"op": "nope", "path": "/machine"}], "patch 2: operation 1 is not an RFC 6902 operation"),
    ("apiVersion: v1alpha1\nkind: Nope\n$patch: delete\n",
     "patch 2: $patch: delete of document v1alpha1/Nope, which the config does not have"),
    ("apiVersion: v1alpha1\nkind: Nope\nsome:\n  $patch: delete\n",
     "patch 2: $patch: delete inside document v1alpha1/Nope, which the config does not have"),
])
def test_patches_that_cannot_apply_are_refused_naming_the_patch(patch, expected):
    with pytest.raises(MachineConfigError) as refused:
        _render(seed.shared_bundle(), "worker", [DISK, patch])
    assert str(refused.value).startswith(expected)


def test_a_document_added_twice_is_refused():
    doc = {"apiVersion": "v1alpha1", "kind": "Other", "name": "n"}
    with pytest.raises(MachineConfigError, match="document v1alpha1/Other named 'n' appears twice"):
        mc.finalize([*mc.default_documents(seed.shared_bundle(), seed.CLUSTER_NAME, seed.ENDPOINT, "worker",
                                           seed.TALOS_VERSION, seed.KUBERNETES_VERSION), doc, dict(doc)], "worker")


def test_a_document_without_a_kind_is_refused():
    doc = {"apiVersion": "v1alpha1", "name": "n"}
    with pytest.raises(MachineConfigError) as err:
        mc.finalize([*mc.default_documents(seed.shared_bundle(), seed.CLUSTER_NAME, seed.ENDPOINT, "worker",
                                           seed.TALOS_VERSION, seed.KUBERNETES_VERSION), doc], "worker")
    assert str(err.value).splitlines()[1:] == ["  - a document with apiVersion 'v1alpha1' has no kind",
                                               "  - machine.install.disk is missing; expected a patch setting the "
                                               "install disk, e.g. {machine: {install: {disk: /dev/sda}}} (or "
                                               "machine.install.diskSelector)"]


@pytest.mark.parametrize("patch, expected", [
    ({"machine": {"nodeLabels": {1: "a", "zone": "b"}}}, "machine.nodeLabels: map key 1 must be a string"),
    ({"cluster": {"apiServer": {"auditPolicy": {"rules": [{"level": "None"}], 2: "b"}}}},
     "cluster.apiServer.auditPolicy: map key 2 must be a string"),
])
def test_a_map_key_that_is_not_a_string_is_refused_naming_where(bundle, patch, expected):
    with pytest.raises(go_yaml.GoYamlError) as err:
        _render(bundle, "controlplane", [DISK, patch])
    assert str(err.value) == expected


def test_a_json6902_patch_targets_the_v1alpha1_document_only():
    bundle = seed.shared_bundle()
    docs = _documents(bundle, [{"op": "add", "path": "/machine/sysctls", "value": {"a.b": "1"}}])
    assert _v1alpha1(talos_yaml.dump_documents(docs))["machine"]["sysctls"] == {"a.b": "1"}
    assert [d.get("kind") for d in docs[1:]] == ["HostnameConfig"]


def test_a_documents_bytes_do_not_depend_on_the_order_its_patch_keys_arrive_in(bundle):
    """The engine hands a dynamic provider each mapping in its own key order: the documents we write come
    out in Talos's field order, any other document with its keys sorted throughout."""
    link = {"apiVersion": "v1alpha1", "kind": "LinkConfig", "name": "net0", "up": True, "mtu": 1450,
            "addresses": [{"address": "10.0.0.5/24", "routePriority": 10}], "routes": [{"gateway": "10.0.0.1"}]}
    volume = {"apiVersion": "v1alpha1", "kind": "UserVolumeConfig", "name": "data",
              "provisioning": {"minSize": "10GiB", "diskSelector": {"match": "!system_disk"}}}

    def reversed_keys(value):
        if isinstance(value, dict):
            return {k: reversed_keys(value[k]) for k in reversed(list(value))}
        return [reversed_keys(v) for v in value] if isinstance(value, list) else value

    as_written = _render(bundle, patches=(DISK, link, volume))
    assert _render(bundle, patches=(DISK, reversed_keys(link), reversed_keys(volume))) == as_written
    documents = as_written.split("---\n")
    [link_text] = [d for d in documents if "kind: LinkConfig" in d]
    assert link_text == ("apiVersion: v1alpha1\nkind: LinkConfig\nname: net0\nup: true\nmtu: 1450\naddresses:\n"
                         "    - address: 10.0.0.5/24\n      routePriority: 10\nroutes:\n    - gateway: 10.0.0.1\n")
    [volume_text] = [d for d in documents if "kind: UserVolumeConfig" in d]
    assert volume_text == ("apiVersion: v1alpha1\nkind: UserVolumeConfig\nname: data\nprovisioning:\n"
                           "    diskSelector:\n        match: '!system_disk'\n    minSize: 10GiB\n")


# --- v1.14: documents Talos refuses next to their legacy v1alpha1 fields -----------------------------------

V1_14_DISK = {"apiVersion": "v1alpha1", "kind": "UnattendedInstallConfig",
              "provisioning": {"diskSelector": {"match": 'disk.dev_path == "/dev/sda"'}}}


def _render_v1_14(bundle, role, *patches):
    return render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, role, "v1.14.0", "1.37.0", [V1_14_DISK, *patches])


@pytest.mark.parametrize("patch, expected", [
    ({"machine": {"kubelet": {"extraArgs": {"max-pods": "150"}}}},
     "machine.kubelet of the v1alpha1 document and the KubeletConfig document set the same thing, which Talos "
     "refuses; expected it in the KubeletConfig document only"),
    ({"machine": {"install": {"disk": "/dev/sda"}}},
     "machine.install of the v1alpha1 document and the UnattendedInstallConfig document set the same thing"),
    ({"cluster": {"network": {"cni": {"name": "none"}}}},
     "cluster.network of the v1alpha1 document and the KubeNetworkConfig document set the same thing"),
    ({"cluster": {"clusterName": "other"}},
     "cluster.clusterName of the v1alpha1 document and the KubeClusterConfig document set the same thing"),
    ({"machine": {"nodeLabels": {"a": "b"}}},
     "machine.nodeLabels of the v1alpha1 document and the KubeNodeConfig document set the same thing"),
])
def test_v1_14_refuses_a_legacy_field_beside_its_document(bundle, patch, expected):
    with pytest.raises(MachineConfigError) as err:
        _render_v1_14(bundle, "controlplane", patch)
    assert expected in str(err.value)


def test_v1_14_the_same_setting_in_its_document_is_taken(bundle):
    text = _render_v1_14(bundle, "worker", {"apiVersion": "v1alpha1", "kind": "KubeletConfig",
                                            "extraArgs": {"max-pods": "150"}})
    kubelet = next(d for d in parse_config(text) if d.get("kind") == "KubeletConfig")
    assert kubelet["extraArgs"] == {"max-pods": "150"} and kubelet["image"] == "ghcr.io/siderolabs/kubelet:v1.37.0"


@pytest.mark.parametrize("patch, expected", [
    ({"apiVersion": "v1alpha1", "kind": "KubeServiceAccountConfig", "issuer": {"privateKey": "x"}},
     "the KubeServiceAccountConfig document is only valid on controlplane nodes, but this node's role is worker"),
    ({"apiVersion": "v1alpha1", "kind": "KubeAPIServerCAConfig", "issuingCA": {"cert": "c", "key": "k"}},
     "KubeAPIServerCAConfig issuingCA.key must be empty on a worker"),
])
def test_v1_14_worker_refuses_control_plane_keys(bundle, patch, expected):
    with pytest.raises(MachineConfigError) as err:
        _render_v1_14(bundle, "worker", patch)
    assert expected in str(err.value)


def test_v1_14_an_empty_install_disk_match_is_missing(bundle):
    with pytest.raises(MachineConfigError) as err:
        render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, "worker", "v1.14.0", "1.37.0",
               [{"apiVersion": "v1alpha1", "kind": "UnattendedInstallConfig",
                 "provisioning": {"diskSelector": {"match": ""}}}])
    assert str(err.value).splitlines()[1:] == [
        '  - UnattendedInstallConfig provisioning.diskSelector.match is missing; expected the install disk, '
        'e.g. disk.dev_path == "/dev/sda"']


def test_v1_14_install_and_endpoint_are_checked_in_their_documents(bundle):
    with pytest.raises(MachineConfigError) as err:
        render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, "worker", "v1.14.0", "1.37.0",
               [{"apiVersion": "v1alpha1", "kind": "UnattendedInstallConfig", "installer": {"image": "x"}},
                {"apiVersion": "v1alpha1", "kind": "KubeClusterConfig", "endpoint": "http://10.0.0.1:6443"}])
    assert str(err.value).splitlines()[1:] == [
        '  - UnattendedInstallConfig provisioning.diskSelector.match is missing; expected the install disk, '
        'e.g. disk.dev_path == "/dev/sda"',
        "  - KubeClusterConfig endpoint: expected an https:// URL of the Kubernetes API"]


def test_v1_14_keeps_an_aescbc_only_bundles_key_as_talosctl_does(bundle):
    # Bundles from before secretbox carry an AES-CBC key instead; gen config (v1.14 machinery) writes it
    # as the one provider key `key1`, so etcd's existing data still decrypts.
    aescbc = _with(_without(bundle, "secrets.secretboxencryptionsecret"), "secrets.aescbcencryptionsecret",
                   bundle["secrets"]["secretboxencryptionsecret"])
    docs = parse_config(_render_v1_14(aescbc, "controlplane"))
    [encryption] = [d for d in docs if d.get("kind") == "KubeEtcdEncryptionConfig"]
    assert encryption["config"] == {"resources": [{"providers": [{"secretbox": {"keys": [
        {"name": "key1", "secret": bundle["secrets"]["secretboxencryptionsecret"]}]}}], "resources": ["secrets"]}]}
