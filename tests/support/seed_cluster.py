"""The seed walkthrough's nine-node test cluster as patch inputs (talos-proxmox-cilium-walkthrough).

3 control planes 10.255.200.201-203, workers .204-.209 of which .204-.206 have the /dev/sdb data
disk. The seed shows only master-1's MAC (bc:24:11:80:a1:9b); the others follow it, as the
test-cluster stack sets them. Shared by the machine-config and provider tests and by bench/render_configs.py.
"""

from __future__ import annotations

import functools

from talos_proxmox.talos_config.secrets_bundle import generate_secrets

CLUSTER_NAME = "test-cluster"
ENDPOINT = "https://10.255.200.201:6443"
TALOS_VERSION = "v1.13.7"
KUBERNETES_VERSION = "1.34.1"
SCHEMATIC = "e142ceb080fb243141b5b6891cfcf0c60bc9430d69be0adf803999d2b62dc885"
INSTALLER = f"factory.talos.dev/installer/{SCHEMATIC}:{TALOS_VERSION}"

PATCH_INSTALL = f"""\
machine:
  install:
    disk: /dev/sda
    image: {INSTALLER}
"""

_KUBESPAN_CNI_PROXY = """\
machine:
  network:
    kubespan:
      enabled: true
      mtu: 1420
      advertiseKubernetesNetworks: false
cluster:
  discovery:
    enabled: true
  network:
    cni:
      name: none
  proxy:
    disabled: true
"""

PATCH_CONTROLPLANE = _KUBESPAN_CNI_PROXY
PATCH_WORKER_WITHOUT_DISK = _KUBESPAN_CNI_PROXY
# patch-worker-with-disk.yaml is the data-disk lines followed by the same KubeSpan/CNI/proxy settings.
_DATA_DISK_LINES = """\
  kernel:
    modules:
      - name: iscsi_tcp
  disks:
    - device: /dev/sdb
      partitions:
        - mountpoint: /var/lib/longhorn
  kubelet:
    extraMounts:
      - destination: /var/lib/longhorn
        type: bind
        source: /var/lib/longhorn
        options:
          - bind
          - rshared
          - rw
"""
PATCH_WORKER_WITH_DISK = "machine:\n" + _DATA_DISK_LINES + _KUBESPAN_CNI_PROXY.removeprefix("machine:\n")


def network_patch(mac: str, address: str) -> str:
    return f"""\
machine:
  network:
    interfaces:
      - deviceSelector:
          hardwareAddr: "{mac}"
        addresses:
          - {address}/24
        routes:
          - network: 0.0.0.0/0
            gateway: 10.255.200.1
        dhcp: false
    nameservers:
      - 9.9.9.9
"""


def nodes() -> list[dict]:
    """name, role, ip, mac, data_disk for each of the nine seed nodes."""
    result = []
    for index in range(9):
        ip = f"10.255.200.{201 + index}"
        role = "controlplane" if index < 3 else "worker"
        name = f"master-{index + 1}" if index < 3 else f"worker-{index - 2}"
        mac = f"bc:24:11:80:a1:{0x9b + index:02x}"  # as in stacks/Pulumi.test-cluster.yaml
        result.append({"name": name, "role": role, "ip": ip, "mac": mac, "data_disk": 3 <= index <= 5})
    return result


def node_patches(node: dict, *, role_patches: dict | None = None) -> list:
    """The patches the seed passes to `talosctl apply-config` for one node, in order."""
    patches = role_patches or {
        "controlplane": PATCH_CONTROLPLANE,
        "worker-disk": PATCH_WORKER_WITH_DISK,
        "worker": PATCH_WORKER_WITHOUT_DISK,
    }
    if node["role"] == "controlplane":
        role_patch = patches["controlplane"]
    else:
        role_patch = patches["worker-disk"] if node["data_disk"] else patches["worker"]
    return [PATCH_INSTALL, role_patch, network_patch(node["mac"], node["ip"])]


# The seed's network and KubeSpan as Talos 1.13's own documents instead of the deprecated
# `machine.network` fields: what a person following today's Talos docs writes by hand.
_KUBESPAN_CONFIG = """\
apiVersion: v1alpha1
kind: KubeSpanConfig
enabled: true
mtu: 1420
advertiseKubernetesNetworks: false
"""


def network_documents(mac: str, address: str) -> str:
    return f"""\
apiVersion: v1alpha1
kind: LinkAliasConfig
name: net0
selector:
  match: mac(link.permanent_addr) == "{mac}"
---
apiVersion: v1alpha1
kind: LinkConfig
name: net0
up: true
addresses:
  - address: {address}/24
routes:
  - gateway: 10.255.200.1
---
apiVersion: v1alpha1
kind: ResolverConfig
nameservers:
  - address: 9.9.9.9
"""


def current_form_patches(node: dict) -> list:
    """`node_patches` with the network and KubeSpan in those documents."""
    cni_proxy = _KUBESPAN_CNI_PROXY[_KUBESPAN_CNI_PROXY.index("cluster:"):]
    role_patch = {"controlplane": cni_proxy, "worker": cni_proxy,
                  "worker-disk": "machine:\n" + _DATA_DISK_LINES + cni_proxy}
    install, role, _network = node_patches(node, role_patches=role_patch)
    return [install, role, _KUBESPAN_CONFIG, network_documents(node["mac"], node["ip"])]


@functools.lru_cache(maxsize=1)
def shared_bundle() -> dict:
    """One generated bundle per test session (RSA-4096 generation is the slow part)."""
    return generate_secrets(TALOS_VERSION)
