"""Bad stacks: each of these variants of the dev stack stops before anything is touched, with one exact line.

Each row runs three ways: through `load_stack` (what both entry points call), through the render command
(exit 1, the line on stderr, no traceback, no file written) and through the program under the Pulumi
runtime (a RunError, no resource registered).
"""

from __future__ import annotations

import copy
import json
import os
import re

import pulumi
import pytest
import yaml

from talos_proxmox.commands import render
from talos_proxmox.settings.credentials import CredentialsError
from talos_proxmox.settings.model import PROJECT, SettingsError
from talos_proxmox.settings.stack import stack_file_values
from talos_proxmox.settings.stack_config import StackConfig, load_stack
from tests.paths import REPO
from tests.program.mocked_program import run_program

DEV = stack_file_values(str(REPO / "stacks" / "Pulumi.dev.yaml"))
RM = lambda path: [{"op": "remove", "path": path}]  # noqa: E731 - a JSON patch removing one path
CP, WORKER = DEV[f"{PROJECT}:nodes"]  # the dev stack's two nodes


def broken(changes: dict) -> dict:
    """The dev stack's config with `changes`: `a.b[0].c` paths under the project, or whole `ns:key` keys;
    a value of None deletes."""
    values = copy.deepcopy(DEV)
    for path, value in changes.items():
        parts = re.findall(r"[^.\[\]]+", path)
        if ":" in parts[0]:
            values[path] = value
            continue
        key = f"{PROJECT}:{parts[0]}"
        if len(parts) == 1:
            values.pop(key, None) if value is None else values.__setitem__(key, value)
            continue
        target = values.setdefault(key, {})
        for part in parts[1:-1]:
            target = target[int(part)] if part.isdigit() else target.setdefault(part, {})
        last = parts[-1]
        if last.isdigit():
            target[int(last)] = value
        elif value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return values


BAD_STACKS = [
    # cluster
    ({"cluster.name": "Dev"},
     "talos-proxmox:cluster.name: 'Dev' is not a cluster name (expected lowercase letters, digits and '-', at most 63)"),
    ({"cluster.name": "-dev"},
     "talos-proxmox:cluster.name: '-dev' is not a cluster name (expected lowercase letters, digits and '-', at most 63)"),
    ({"cluster.name": "a" * 64},
     "talos-proxmox:cluster.name: 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa' is not a cluster name (expected lowercase letters, digits and '-', at most 63)"),
    ({"cluster.name": 7},
     "talos-proxmox:cluster.name: 7 is not a cluster name (expected lowercase letters, digits and '-', at most 63)"),
    ({"cluster.name": None},
     "talos-proxmox:cluster.name: is required: a cluster name (expected lowercase letters, digits and '-', at most 63)"),
    ({"cluster.endpoint": "10.10.0.50:6443"},
     "talos-proxmox:cluster.endpoint: '10.10.0.50:6443' is not an endpoint with scheme, host and port (expected e.g. https://10.0.0.10:6443)"),
    ({"cluster.endpoint": "https://10.10.0.50"},
     "talos-proxmox:cluster.endpoint: 'https://10.10.0.50' is not an endpoint with scheme, host and port (expected e.g. https://10.0.0.10:6443)"),
    ({"cluster.endpoint": "http://10.10.0.50:6443"},
     "talos-proxmox:cluster.endpoint: 'http://10.10.0.50:6443' is not an endpoint with scheme, host and port (expected e.g. https://10.0.0.10:6443)"),
    ({"cluster.endpoint": "https://10.10.0.50 :6443"},
     "talos-proxmox:cluster.endpoint: 'https://10.10.0.50 :6443' is not an endpoint with scheme, host and port (expected e.g. https://10.0.0.10:6443)"),
    ({"cluster.vip": "10.10.0.51"},
     "talos-proxmox:cluster.vip: '10.10.0.51' equals nodes[0].ip (expected an unused address in the nodes' subnet)"),
    ({"cluster.vip": "10.10.0.1"},
     "talos-proxmox:cluster.vip: '10.10.0.1' is the gateway (expected an unused address in the nodes' subnet)"),
    ({"cluster.vip": "10.10.0.0"},
     "talos-proxmox:cluster.vip: '10.10.0.0' is the network or broadcast address of 10.10.0.0/24 (expected an unused address in the nodes' subnet)"),
    ({"cluster.vip": "10.10.0.255"},
     "talos-proxmox:cluster.vip: '10.10.0.255' is the network or broadcast address of 10.10.0.0/24 (expected an unused address in the nodes' subnet)"),
    ({"cluster.vip": "10.20.0.5"},
     "talos-proxmox:cluster.vip: '10.20.0.5' is outside every control-plane node's subnet (a Layer 2 VIP must share it)"),
    ({"cluster.vip": "10.10.0.500"},
     "talos-proxmox:cluster.vip: '10.10.0.500' is not an IP address"),
    ({"cluster.talosVersion": "v1.11.5"},
     "talos-proxmox:cluster.talosVersion: 'v1.11.5' is not a supported Talos version (expected v1.12.x, v1.13.x or v1.14.x, e.g. v1.13.7)"),
    ({"cluster.talosVersion": "latest"},
     "talos-proxmox:cluster.talosVersion: 'latest' is not a supported Talos version (expected v1.12.x, v1.13.x or v1.14.x, e.g. v1.13.7)"),
    ({"cluster.talosVersion": "v2.0.0"},
     "talos-proxmox:cluster.talosVersion: 'v2.0.0' is not a supported Talos version (expected v1.12.x, v1.13.x or v1.14.x, e.g. v1.13.7)"),
    ({"cluster.kubernetesVersion": "1.30.0"},
     "talos-proxmox:cluster.kubernetesVersion: '1.30.0' is not supported by Talos v1.13 (expected 1.31 to 1.36)"),
    ({"cluster.kubernetesVersion": "1.37.0"},
     "talos-proxmox:cluster.kubernetesVersion: '1.37.0' is not supported by Talos v1.13 (expected 1.31 to 1.36)"),
    ({"cluster.kubernetesVersion": "v1.36"},
     "talos-proxmox:cluster.kubernetesVersion: 'v1.36' is not a Kubernetes version (expected e.g. 1.35.0)"),
    ({"cluster.talosVersion": "v1.12.4", "cluster.kubernetesVersion": "1.36.2"},
     "talos-proxmox:cluster.kubernetesVersion: '1.36.2' is not supported by Talos v1.12 (expected 1.30 to 1.35)"),
    ({"cluster.podSubnets": ["10.10.0.0/16"]},
     "talos-proxmox:cluster.podSubnets: '10.10.0.0/16' overlaps network.subnet 10.10.0.0/24 (expected pod, service and node networks apart)"),
    ({"cluster.serviceSubnets": ["10.244.0.0/16"]},
     "talos-proxmox:cluster.podSubnets: '10.244.0.0/16' overlaps cluster.serviceSubnets 10.244.0.0/16 (expected pod, service and node networks apart)"),
    ({"cluster.podSubnets": ["10.244.0.0/16", "10.244.128.0/17"]},
     "talos-proxmox:cluster.podSubnets: '10.244.0.0/16' overlaps cluster.podSubnets 10.244.128.0/17 (expected pod, service and node networks apart)"),
    ({"cluster.podSubnets": ["10.10.0.0/25", "10.10.0.128/25"]},  # one line for the pair of keys
     "talos-proxmox:cluster.podSubnets: '10.10.0.0/25' overlaps network.subnet 10.10.0.0/24 (expected pod, service and node networks apart)"),
    ({"cluster.podSubnets": []},
     'talos-proxmox:cluster.podSubnets: [] is not a non-empty list of CIDRs'),
    ({"cluster.podSubnets": "10.244.0.0/16"},
     "talos-proxmox:cluster.podSubnets: '10.244.0.0/16' is not a non-empty list of CIDRs"),
    ({"cluster.podSubnets": ["10.244.0.1/16"]},
     "talos-proxmox:cluster.podSubnets: ['10.244.0.1/16'] is not a non-empty list of CIDRs"),
    ({"cluster.serviceSubnets": ["10.96.0.0"]},
     "talos-proxmox:cluster.serviceSubnets: ['10.96.0.0'] is not a non-empty list of CIDRs"),
    ({"cluster.domain": "Cluster.Local"},
     "talos-proxmox:cluster.domain: 'Cluster.Local' is not a DNS domain (expected lowercase labels of letters, digits and '-', e.g. cluster.local)"),
    ({"cluster.domain": "cluster..local"},
     "talos-proxmox:cluster.domain: 'cluster..local' is not a DNS domain (expected lowercase labels of letters, digits and '-', e.g. cluster.local)"),
    ({"cluster.domain": "-x.local"},
     "talos-proxmox:cluster.domain: '-x.local' is not a DNS domain (expected lowercase labels of letters, digits and '-', e.g. cluster.local)"),
    ({"cluster.installDisk": "sda"},
     "talos-proxmox:cluster.installDisk: 'sda' is not a device path (expected /dev/...)"),
    ({"cluster.installDisk": "/dev/"},
     "talos-proxmox:cluster.installDisk: '/dev/' is not a device path (expected /dev/...)"),
    ({"cluster.installDisk": "nvme0n1"},
     "talos-proxmox:cluster.installDisk: 'nvme0n1' is not a device path (expected /dev/...)"),
    ({"cluster.kubespan": "yes"},
     "talos-proxmox:cluster.kubespan: 'yes' is not a mapping"),
    ({"cluster.kubespan.enabled": "true"},
     "talos-proxmox:cluster.kubespan.enabled: 'true' is not true or false"),
    ({"cluster.kubespan.mtu": 70000},
     'talos-proxmox:cluster.kubespan.mtu: 70000 is not an MTU in 68-65535'),
    ({"cluster.kubespan": {"enabled": True, "mtu": 1200}},
     'talos-proxmox:cluster.kubespan.mtu: 1200 is below 1280, the least WireGuard over IPv6 carries'),
    ({"cluster.kubespan.mtuu": 1420},
     'talos-proxmox:cluster.kubespan.mtuu: 1420 is not a known key (expected one of: enabled, mtu, advertiseKubernetesNetworks)'),
    ({"cluster.kubespan.advertiseKubernetesNetworks": "yes"},
     "talos-proxmox:cluster.kubespan.advertiseKubernetesNetworks: 'yes' is not true or false"),
    ({"cluster.discovery": "on"},
     "talos-proxmox:cluster.discovery: 'on' is not true or false"),
    ({"cluster.deletionProtection": "off"},
     "talos-proxmox:cluster.deletionProtection: 'off' is not true or false"),
    ({"cluster.patches": {"machine": {}}},
     "talos-proxmox:cluster.patches: {'machine': {}} is not a list of patches"),
    ({"cluster.patches": ["machine: {}"]},
     "talos-proxmox:cluster.patches[0]: 'machine: {}' is neither a mapping (strategic merge patch) nor a list of JSON patch operations with 'op' and 'path'"),
    ({"cluster.patches": [[{"op": "frobnicate", "path": "/machine"}]]},
     "talos-proxmox:cluster.patches[0]: [{'op': 'frobnicate', 'path': '/machine'}] is neither a mapping (strategic merge patch) nor a list of JSON patch operations with 'op' and 'path'"),
    ({"cluster.patches": [[{"op": "add", "path": "/machine/env", "value": {"HTTP_PROXY": "http://proxy.lab:3128"}}],
                          "machine: {}"]},
     "talos-proxmox:cluster.patches[1]: 'machine: {}' is neither a mapping (strategic merge patch) nor a list of JSON patch operations with 'op' and 'path'"),
    ({"cluster.patches": [RM("/machine/nothere")]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: operation 1 (remove /machine/nothere) cannot be applied to the v1alpha1 document (JsonPatchConflict)'),
    ({"cluster.patches": [[{"op": "replace", "path": "/cluster/nothere", "value": 1}]]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: operation 1 (replace /cluster/nothere) cannot be applied to the v1alpha1 document (JsonPatchConflict)'),
    ({"cluster.patches": [[{"op": "test", "path": "/machine/type", "value": "worker"}]]},
     'talos-proxmox:cluster.patches[0]: node dev-cp-1: operation 1 (test /machine/type) cannot be applied to the v1alpha1 document (JsonPatchTestFailed)'),
    ({"cluster.patches": [[{"op": "add", "path": "/machine/env"}]]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: operation 1 (add /machine/env) cannot be applied to the v1alpha1 document (InvalidJsonPatch)'),
    ({"cluster.patches": [{"machine": {"install": {"disk": ["/dev/sda"]}}}]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: machine.install.disk is a list in the patch but a scalar in the config; expected a scalar'),
    ({"cluster.patches": [{"machine": {"kubelett": {}}}]},
     "talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the machine config invalid: unknown key 'kubelett' at machine; did you mean 'kubelet'?"),
    ({"cluster.patches": [{"machin": {}}]},
     "talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the machine config invalid: unknown key 'machin' at top level of the v1alpha1 document; did you mean 'machine'?"),
    ({"cluster.patches": [{"machine": {"network": {"hostname": "dev-cp"}}}]},
     "talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the machine config invalid: machine.network.hostname of the v1alpha1 document and the HostnameConfig document set the same thing, which Talos refuses; expected it in the HostnameConfig document only"),
    ({"cluster.patches": [{"apiVersion": "v1alpha1", "kind": "HostnameConfig", "hostname": "Dev_CP"}]},
     "talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the machine config invalid: HostnameConfig hostname is not a DNS hostname (expected lowercase letters, digits and '-', at most 63)"),
    ({"cluster.patches": [{"cluster": {"network": {"dnsDomain": "bad_domain"}}}]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the machine config invalid: cluster.network.dnsDomain is not a DNS domain (expected lowercase labels, e.g. cluster.local)'),
    ({"cluster.patches": [{"machine": {"type": "worker"}}]},
     "talos-proxmox:cluster.patches[0]: node dev-cp-1: leaves the machine config invalid: machine.type is 'worker' but this node's role is 'controlplane'; patches must not change the role"),
    ({"cluster.patches": [{"machine": {"install": {"wipe": "yes"}}}]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the machine config invalid: machine.install.wipe: expected true or false, got a string'),
    ({"cluster.patches": [{"machine": {"kubelet": {"extraArgs": ["a"]}}}]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the machine config invalid: machine.kubelet.extraArgs: expected a mapping, got a list'),
    ({"cluster.patches": [{"apiVersion": "v1alpha1", "kind": "HostnameConfig", "hostname": "UPPER"}]},
     "talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the machine config invalid: HostnameConfig hostname is not a DNS hostname (expected lowercase letters, digits and '-', at most 63)"),
    ({"cluster.patches": [{"apiVersion": "v1alpha1", "hostname": "x"}]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: a document with apiVersion needs a kind too'),
    ({"cluster.patches": [{"apiVersion": "v1alpha1", "kind": "Nope", "$patch": "delete"}]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: $patch: delete of document v1alpha1/Nope, which the config does not have'),
    ({"cluster.patches": [{"machine": {"sysctls": ["a=b"]}}]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the machine config invalid: machine.sysctls: expected a mapping, got a list'),
    ({"cluster.patches": [RM("/machine/install")]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the machine config invalid: machine.install.disk is missing; expected a patch setting the install disk, e.g. {machine: {install: {disk: /dev/sda}}} (or machine.install.diskSelector)'),
    ({"cluster.patches": [{"machine": {"kubelet": {}}}, RM("/machine/nope")]},
     'talos-proxmox:cluster.patches[1]: nodes dev-cp-1, dev-worker-1: operation 1 (remove /machine/nope) cannot be applied to the v1alpha1 document (JsonPatchConflict)'),
    ({"cluster.patches": [{"machine": {"time": {"servers": "pool.ntp.org"}}}]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the machine config invalid: machine.time.servers: expected a list, got a scalar'),
    ({"cluster.patches": [{"machine": {"network": {"interfaces": [{"interface": "eth0", "dhcp": "yes"}]}}}]},
     'talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the machine config invalid: machine.network.interfaces[0].dhcp: expected true or false, got a string'),
    ({"cluster.rolePatches": {"master": []}},
     'talos-proxmox:cluster.rolePatches.master: [] is not a known key (expected one of: controlplane, worker)'),
    ({"cluster.rolePatches": "x"},
     "talos-proxmox:cluster.rolePatches: 'x' is not a mapping"),
    ({"cluster.rolePatches.worker": "machine: {}"},
     "talos-proxmox:cluster.rolePatches.worker: 'machine: {}' is not a list of patches"),
    ({"cluster.rolePatches.worker": [RM("/machine/nope")]},
     'talos-proxmox:cluster.rolePatches.worker[0]: node dev-worker-1: operation 1 (remove /machine/nope) cannot be applied to the v1alpha1 document (JsonPatchConflict)'),
    ({"cluster.rolePatches.controlplane": [{"machine": {"kubelet": {"extraArgs": "x"}}}]},
     'talos-proxmox:cluster.rolePatches.controlplane[0]: node dev-cp-1: leaves the machine config invalid: machine.kubelet.extraArgs: expected a mapping, got a scalar'),
    ({"cluster.rolePatches.worker": [{"cluster": {"etcd": {"advertisedSubnets": ["10.10.0.0/24"]}}}]},
     "talos-proxmox:cluster.rolePatches.worker[0]: node dev-worker-1: leaves the machine config invalid: cluster.etcd is only valid on controlplane nodes, but this node's role is worker"),
    ({"cluster.rolePatches.worker": [{"machine": {"type": "controlplane"}}]},
     "talos-proxmox:cluster.rolePatches.worker[0]: node dev-worker-1: leaves the machine config invalid: machine.type is 'controlplane' but this node's role is 'worker'; patches must not change the role"),
    ({"cluster.rolePatches.controlplane": [{"cluster": {"apiServer": {"extraArgs": {"cloud-config": "/etc/kubernetes/cloud.conf"}}}}]},
     "talos-proxmox:cluster.rolePatches.controlplane[0]: node dev-cp-1: leaves the machine config invalid: cluster.apiServer.extraArgs cloud-config: kube-apiserver has no flag --cloud-config: Kubernetes 1.33 removed it (the stack runs 1.36.2)"),
    ({"cluster.rolePatches.worker": [{"machine": {"kubelet": {"extraArgs": {"feature-gates": "PodDisruptionConditions=true,MyGate=false"}}}}]},
     "talos-proxmox:cluster.rolePatches.worker[0]: node dev-worker-1: leaves the machine config invalid: machine.kubelet.extraArgs feature-gates PodDisruptionConditions: kubelet has no feature gate PodDisruptionConditions: Kubernetes 1.34 removed it (the stack runs 1.36.2)"),
    ({"cluster.rolePatches.worker": [{"machine": {"kubelet": {"image": "ghcr.io/siderolabs/kubelet:v1.35.4-fat"}}}]},
     "talos-proxmox:cluster.rolePatches.worker[0]: node dev-worker-1: leaves the machine config invalid: machine.kubelet.image is pinned at v1.35.4-fat, and cluster.kubernetesVersion is 1.36.2: a pinned kubelet would stay behind on upgrades (tag it v1.36.2-fat)"),
    ({"cluster.rolePatches.controlplane": [{"cluster": {"apiServer": {"image": "mirror.lab:5000/kube-apiserver:v1.35.0"}}}]},
     "talos-proxmox:cluster.rolePatches.controlplane[0]: node dev-cp-1: leaves the machine config invalid: cluster.apiServer.image is pinned at v1.35.0, and cluster.kubernetesVersion is 1.36.2: a pinned kube-apiserver would stay behind on upgrades (tag it v1.36.2)"),
    ({"cluster.secretsFile": "missing-secrets.yaml"},
     "talos-proxmox:cluster.secretsFile: 'missing-secrets.yaml' does not exist (expected a secrets bundle written by `talosctl gen secrets`, relative to {REPO})"),
    ({"cluster.secretsFile": "stacks/Pulumi.dev.yaml"},
     "talos-proxmox:cluster.secretsFile: 'stacks/Pulumi.dev.yaml' is not a Talos secrets bundle: unknown top-level key 'config'; expected only certs, cluster, secrets, trustdinfo (and 14 more)"),
    ({"cluster.recoverFrom": "tests/data/etcd/missing.snapshot"},
     "talos-proxmox:cluster.recoverFrom: 'tests/data/etcd/missing.snapshot' cannot be read (No such file or directory: {REPO}/tests/data/etcd/missing.snapshot; expected an etcd snapshot file)"),
    ({"cluster.recoverFrom": "tests/data/etcd/make_snapshots.py"},
     "talos-proxmox:cluster.recoverFrom: 'tests/data/etcd/make_snapshots.py' cannot be recovered from: it is not an etcd snapshot (no bbolt database header)"),
    ({"cluster.recoverFrom": "tests/data/etcd/other-cluster.snapshot"},
     "talos-proxmox:cluster.recoverFrom: 'tests/data/etcd/other-cluster.snapshot' is a snapshot of another cluster: its etcd members are prod-cp-1 (https://10.20.0.11:2380), and none is a control plane of this stack (dev-cp-1 (10.10.0.51))"),
    ({"cluster.recoverFrom": ["a.snapshot"]},
     "talos-proxmox:cluster.recoverFrom: ['a.snapshot'] is not a file path or an object (s3://<backups.bucket>/<key>)"),
    ({"cluster.recoverFrom": "s3://etcd-backups/dev/dev-20261207T130509Z.snap.age"},
     "talos-proxmox:cluster.recoverFrom: 's3://etcd-backups/dev/dev-20261207T130509Z.snap.age' names an object, and the stack has no backups section to reach its bucket with"),
    ({"cluster.recoverFrom": "s3://etcd-backups"},
     "talos-proxmox:cluster.recoverFrom: 's3://etcd-backups' is not an object (expected s3://<backups.bucket>/<key>)"),
    ({"cluster.recoverIdentityFile": 5},
     'talos-proxmox:cluster.recoverIdentityFile: 5 is not a file path'),
    ({"cluster.secretsFile": 5},
     'talos-proxmox:cluster.secretsFile: 5 is not a file path'),
    ({"cluster.unknownKey": 1},
     'talos-proxmox:cluster.unknownKey: 1 is not a known key (expected one of: name, endpoint, vip, talosVersion, kubernetesVersion, podSubnets, serviceSubnets, domain, installDisk, kubespan, discovery, patches, rolePatches, secretsFile, systemDiskEncryption, deletionProtection, allowDowngrade, recoverFrom, recoverIdentityFile)'),
    # network
    ({"network.subnet": "10.10.0.0/33"},
     "talos-proxmox:network.subnet: '10.10.0.0/33' is not a network in CIDR form (expected e.g. 10.255.200.0/24)"),
    ({"network.subnet": "10.10.0.1/24"},
     "talos-proxmox:network.subnet: '10.10.0.1/24' is not a network in CIDR form (expected e.g. 10.255.200.0/24)"),
    ({"network.subnet": "10.10.0.0"},
     "talos-proxmox:network.subnet: '10.10.0.0' is not a network in CIDR form (expected e.g. 10.255.200.0/24)"),
    ({"network.gateway": "10.20.0.1"},
     "talos-proxmox:network.gateway: '10.20.0.1' is outside network.subnet 10.10.0.0/24"),
    ({"network.gateway": "10.10.0.0"},
     "talos-proxmox:network.gateway: '10.10.0.0' is the network or broadcast address of 10.10.0.0/24"),
    ({"network.gateway": "10.10.0.255"},
     "talos-proxmox:network.gateway: '10.10.0.255' is the network or broadcast address of 10.10.0.0/24"),
    ({"network.gateway": None},
     'talos-proxmox:network.gateway: is required: an IP address (expected e.g. 10.255.200.1)'),
    ({"network.gateway": "gw"},
     "talos-proxmox:network.gateway: 'gw' is not an IP address (expected e.g. 10.255.200.1)"),
    ({"network.nameservers": ["1.1.1"]},
     "talos-proxmox:network.nameservers: ['1.1.1'] is not a non-empty list of IP addresses"),
    ({"network.nameservers": []},
     'talos-proxmox:network.nameservers: [] is not a non-empty list of IP addresses'),
    ({"network.nameservers": "1.1.1.1"},
     "talos-proxmox:network.nameservers: '1.1.1.1' is not a non-empty list of IP addresses"),
    ({"network.mtu": 67},
     'talos-proxmox:network.mtu: 67 is not an MTU in 68-65535'),
    ({"network.mtu": 70000},
     'talos-proxmox:network.mtu: 70000 is not an MTU in 68-65535'),
    ({"network.mtu": "1500"},
     "talos-proxmox:network.mtu: '1500' is not an MTU in 68-65535"),
    ({"network.vlan": 10},
     'talos-proxmox:network.vlan: 10 is not a known key (expected one of: subnet, gateway, nameservers, mtu)'),
    ({"network": "10.10.0.0/24"},
     "talos-proxmox:network: '10.10.0.0/24' is not a mapping"),
    # proxmox
    ({"proxmox.node": None},
     'talos-proxmox:proxmox.node: is required: a Proxmox node name (expected e.g. pve)'),
    ({"proxmox.node": "pve 1"},
     "talos-proxmox:proxmox.node: 'pve 1' is not a Proxmox node name (expected e.g. pve)"),
    ({"proxmox.node": "pve_1"},
     "talos-proxmox:proxmox.node: 'pve_1' is not a Proxmox node name (expected e.g. pve)"),
    ({"proxmox.vmDatastore": "local lvm"},
     "talos-proxmox:proxmox.vmDatastore: 'local lvm' is not a Proxmox datastore id (expected e.g. local-lvm: a letter, then letters, digits, '-', '_', '.')"),
    ({"proxmox.vmDatastore": "1local"},
     "talos-proxmox:proxmox.vmDatastore: '1local' is not a Proxmox datastore id (expected e.g. local-lvm: a letter, then letters, digits, '-', '_', '.')"),
    ({"proxmox.isoDatastore": ""},
     "talos-proxmox:proxmox.isoDatastore: '' is not a Proxmox datastore id (expected e.g. local-lvm: a letter, then letters, digits, '-', '_', '.')"),
    ({"proxmox.bridge": "vmbr0 "},
     "talos-proxmox:proxmox.bridge: 'vmbr0 ' is not a Linux bridge name (expected e.g. vmbr0, at most 15 characters)"),
    ({"proxmox.bridge": "averyveryverylongbridge"},
     "talos-proxmox:proxmox.bridge: 'averyveryverylongbridge' is not a Linux bridge name (expected e.g. vmbr0, at most 15 characters)"),
    ({"proxmox.cpuType": "host cpu"},
     "talos-proxmox:proxmox.cpuType: 'host cpu' is not a CPU type the Proxmox provider accepts (expected one of PVE's built-in models, e.g. host or x86-64-v2-AES, or a custom model as custom-<name>)"),
    ({"proxmox.cpuType": "x86-64-v2-aes"},  # the provider's list is case-sensitive
     "talos-proxmox:proxmox.cpuType: 'x86-64-v2-aes' is not a CPU type the Proxmox provider accepts (expected one of PVE's built-in models, e.g. host or x86-64-v2-AES, or a custom model as custom-<name>)"),
    ({"proxmox.cpuType": "custom-"},
     "talos-proxmox:proxmox.cpuType: 'custom-' is not a CPU type the Proxmox provider accepts (expected one of PVE's built-in models, e.g. host or x86-64-v2-AES, or a custom model as custom-<name>)"),
    ({"image.factoryUrl": "https://factory.talos.dev/?mirror=eu"},
     "talos-proxmox:image.factoryUrl: 'https://factory.talos.dev/?mirror=eu' is not an http(s) URL with no query or fragment (expected e.g. https://factory.talos.dev)"),
    ({"image.factoryUrl": "https://factory.talos.dev#top"},
     "talos-proxmox:image.factoryUrl: 'https://factory.talos.dev#top' is not an http(s) URL with no query or fragment (expected e.g. https://factory.talos.dev)"),
    ({"proxmox.tags": ["talos cluster"]},
     "talos-proxmox:proxmox.tags: ['talos cluster'] is not a list of Proxmox tags (letters, digits, '_', '-', '+', '.'; not starting with '-', '+' or '.')"),
    ({"proxmox.tags": ["-talos"]},
     "talos-proxmox:proxmox.tags: ['-talos'] is not a list of Proxmox tags (letters, digits, '_', '-', '+', '.'; not starting with '-', '+' or '.')"),
    ({"proxmox.tags": "talos"},
     "talos-proxmox:proxmox.tags: 'talos' is not a list of Proxmox tags (letters, digits, '_', '-', '+', '.'; not starting with '-', '+' or '.')"),
    ({"proxmox.tags": ["a;b"]},
     "talos-proxmox:proxmox.tags: ['a;b'] is not a list of Proxmox tags (letters, digits, '_', '-', '+', '.'; not starting with '-', '+' or '.')"),
    ({"proxmox.nodes": "pve"},
     "talos-proxmox:proxmox.nodes: 'pve' is not a known key (expected one of: node, vmDatastore, isoDatastore, isoDatastoreShared, bridge, cpuType, tags, datastores)"),
    # image
    ({"image.factoryUrl": "factory.talos.dev"},
     "talos-proxmox:image.factoryUrl: 'factory.talos.dev' is not an http(s) URL with no query or fragment (expected e.g. https://factory.talos.dev)"),
    ({"image.factoryUrl": "https://factory talos.dev"},
     "talos-proxmox:image.factoryUrl: 'https://factory talos.dev' is not an http(s) URL with no query or fragment (expected e.g. https://factory.talos.dev)"),
    ({"image.factoryUrl": "ftp://factory.talos.dev"},
     "talos-proxmox:image.factoryUrl: 'ftp://factory.talos.dev' is not an http(s) URL with no query or fragment (expected e.g. https://factory.talos.dev)"),
    ({"image.platform": "aws"},
     "talos-proxmox:image.platform: 'aws' is not a supported platform (expected metal or nocloud)"),
    ({"image.arch": "arm64"},
     "talos-proxmox:image.arch: 'arm64' is not a supported architecture (expected amd64: the program creates x86-64 Proxmox VMs)"),
    ({"image.arch": "riscv64"},
     "talos-proxmox:image.arch: 'riscv64' is not a supported architecture (expected amd64: the program creates x86-64 Proxmox VMs)"),
    ({"image.secureBoot": "yes"},
     "talos-proxmox:image.secureBoot: 'yes' is not true or false"),
    ({"image.schematic": {"customisation": {}}},
     "talos-proxmox:image.schematic: is not a schematic the Image Factory takes: schematic: unknown key 'customisation'; expected one of: owner, overlay, customization (the Image Factory rejects unknown fields)"),
    ({"image.schematic.customization.systemExtensions.officialExtensions": ["qemu-guest-agent"]},
     "talos-proxmox:image.schematic.customization.systemExtensions.officialExtensions[0]: 'qemu-guest-agent' is not an extension name (expected owner/name, e.g. siderolabs/qemu-guest-agent)"),
    ({"image.schematic.customization.systemExtensions.officialExtensions": ["siderolabs/qemu guest agent"]},
     "talos-proxmox:image.schematic.customization.systemExtensions.officialExtensions[0]: 'siderolabs/qemu guest agent' is not an extension name (expected owner/name, e.g. siderolabs/qemu-guest-agent)"),
    ({"image.schematic.customization.extraKernelArgs": "net.ifnames=0"},
     "talos-proxmox:image.schematic: is not a schematic the Image Factory takes: customization.extraKernelArgs: expected a list of strings, got str 'net.ifnames=0'"),
    ({"image": "metal"},
     "talos-proxmox:image: 'metal' is not a mapping"),
    # nodes
    ({"nodes": "dev-cp-1"},
     "talos-proxmox:nodes: 'dev-cp-1' is not a non-empty list of nodes"),
    ({"nodes": []},
     'talos-proxmox:nodes: [] is not a non-empty list of nodes'),
    ({"nodes[0]": "dev-cp-1"},
     "talos-proxmox:nodes[0]: 'dev-cp-1' is not a mapping"),
    ({"nodes[0].name": "Dev-CP-1"},
     "talos-proxmox:nodes[0].name: 'Dev-CP-1' is not a node name (expected lowercase letters, digits and '-', at most 63)"),
    ({"nodes[0].name": "secrets"},
     "talos-proxmox:nodes[0].name: 'secrets' is a name the render command writes a file of its own under (expected a name other than: cilium-load-balancer, cilium-values, proxmox-ccm-values, proxmox-csi-values, schematic, schematic-id, secrets, talos-ccm-values, talosconfig)"),
    ({"nodes[1].name": "cilium-values"},
     "talos-proxmox:nodes[1].name: 'cilium-values' is a name the render command writes a file of its own under (expected a name other than: cilium-load-balancer, cilium-values, proxmox-ccm-values, proxmox-csi-values, schematic, schematic-id, secrets, talos-ccm-values, talosconfig)"),
    ({"nodes[1].name": "talosconfig"},
     "talos-proxmox:nodes[1].name: 'talosconfig' is a name the render command writes a file of its own under (expected a name other than: cilium-load-balancer, cilium-values, proxmox-ccm-values, proxmox-csi-values, schematic, schematic-id, secrets, talos-ccm-values, talosconfig)"),
    ({"nodes[1].name": "dev-cp-1"},
     "talos-proxmox:nodes[1].name: 'dev-cp-1' duplicates nodes[0].name (expected unique values)"),
    ({"nodes[0].name": None},
     "talos-proxmox:nodes[0].name: is required: a node name (expected lowercase letters, digits and '-', at most 63)"),
    ({"nodes[0].role": "master"},
     "talos-proxmox:nodes[0].role: 'master' is not a role (expected controlplane or worker)"),
    ({"nodes[0].role": "worker"},
     "talos-proxmox:nodes: '2 nodes, 0 with role controlplane' has no control-plane node (expected at least 1)"),
    ({"nodes[0].vmId": 99},
     'talos-proxmox:nodes[0].vmId: 99 is not a Proxmox VM id (expected 100-999999999)'),
    ({"nodes[1].vmId": 9001},
     'talos-proxmox:nodes[1].vmId: 9001 duplicates nodes[0].vmId (expected unique values)'),
    ({"nodes": [CP, {k: v for k, v in WORKER.items() if k != "vmId"},  # Proxmox picks the middle one's id
                dict(WORKER, name="dev-worker-2", vmId=9001, ip="10.10.0.53", mac="bc:24:11:00:00:53")]},
     "talos-proxmox:nodes[2].vmId: 9001 duplicates nodes[0].vmId (expected unique values)"),
    ({"nodes[0].vmId": "9001"},
     "talos-proxmox:nodes[0].vmId: '9001' is not a Proxmox VM id (expected 100-999999999)"),
    ({"nodes[0].vmId": 1000000000},
     'talos-proxmox:nodes[0].vmId: 1000000000 is not a Proxmox VM id (expected 100-999999999)'),
    ({"nodes[0].cpu": 0},
     'talos-proxmox:nodes[0].cpu: 0 is not a number of vCPUs (expected an integer in 1-512)'),
    ({"nodes[0].cpu": 1024},
     'talos-proxmox:nodes[0].cpu: 1024 is not a number of vCPUs (expected an integer in 1-512)'),
    ({"nodes[0].cpu": 2.5},
     'talos-proxmox:nodes[0].cpu: 2.5 is not a number of vCPUs (expected an integer in 1-512)'),
    ({"nodes[0].memory": 512},
     'talos-proxmox:nodes[0].memory: 512 is not a memory size in MiB (expected an integer in 1024-4194304; Talos needs at least 1 GiB)'),
    ({"nodes[0].memory": 99999999},
     'talos-proxmox:nodes[0].memory: 99999999 is not a memory size in MiB (expected an integer in 1024-4194304; Talos needs at least 1 GiB)'),
    ({"nodes[0].memory": "4G"},
     "talos-proxmox:nodes[0].memory: '4G' is not a memory size in MiB (expected an integer in 1024-4194304; Talos needs at least 1 GiB)"),
    ({"nodes[0].disk": 5},
     'talos-proxmox:nodes[0].disk: 5 is not a boot disk size in GB (expected an integer in 10-65536; Talos needs at least 10 GB)'),
    ({"nodes[0].disk": 1000000},
     'talos-proxmox:nodes[0].disk: 1000000 is not a boot disk size in GB (expected an integer in 10-65536; Talos needs at least 10 GB)'),
    ({"nodes[1].dataDisk": {"size": 30, "mount": "/data"}},
     "talos-proxmox:nodes[1].dataDisk.mount: '/data' is not a known key (expected one of: size, device, mountpoint)"),
    ({"nodes[1].dataDisk": {"size": 0}},
     'talos-proxmox:nodes[1].dataDisk.size: 0 is not a size in GB (expected an integer in 1-65536)'),
    ({"nodes[1].dataDisk": {"size": 30, "device": "/dev/sda"}},
     "talos-proxmox:nodes[1].dataDisk.device: '/dev/sda' is the install disk (cluster.installDisk); expected the second disk, e.g. /dev/sdb"),
    ({"nodes[1].dataDisk": {"size": 30, "mountpoint": "/data"}},
     "talos-proxmox:nodes[1].dataDisk.mountpoint: '/data' is outside /var, and Talos's root file system is read-only (expected e.g. /var/lib/longhorn)"),
    ({"nodes[1].dataDisk": {"size": 30, "mountpoint": "/var/lib/etcd"}},
     "talos-proxmox:nodes[1].dataDisk.mountpoint: '/var/lib/etcd' mounts over Talos's system directory /var/lib/etcd (expected a directory of its own, e.g. /var/lib/longhorn)"),
    ({"nodes[1].dataDisk": {"size": 30, "mountpoint": "/var"}},
     "talos-proxmox:nodes[1].dataDisk.mountpoint: '/var' mounts over Talos's system directory /var (expected a directory of its own, e.g. /var/lib/longhorn)"),
    ({"nodes[1].dataDisk": {"size": 30, "mountpoint": "/var/lib/kubelet/pods"}},
     "talos-proxmox:nodes[1].dataDisk.mountpoint: '/var/lib/kubelet/pods' mounts over Talos's system directory /var/lib/kubelet (expected a directory of its own, e.g. /var/lib/longhorn)"),
    ({"nodes[1].dataDisk": {"size": 30, "mountpoint": "var/lib/longhorn"}},
     "talos-proxmox:nodes[1].dataDisk.mountpoint: 'var/lib/longhorn' is not a normalised absolute path (expected e.g. /var/lib/longhorn)"),
    ({"nodes[1].dataDisk": {"size": 30, "mountpoint": "/var/lib/../etc"}},
     "talos-proxmox:nodes[1].dataDisk.mountpoint: '/var/lib/../etc' is not a normalised absolute path (expected e.g. /var/lib/longhorn)"),
    ({"nodes[1].dataDisk": {"size": 30, "mountpoint": "//var/lib/longhorn"}},
     "talos-proxmox:nodes[1].dataDisk.mountpoint: '//var/lib/longhorn' is not a normalised absolute path (expected e.g. /var/lib/longhorn)"),
    ({"cluster.talosVersion": "v1.14.1", "nodes[1].dataDisk": {"size": 30, "mountpoint": "/var/lib/longhorn"}},
     "talos-proxmox:nodes[1].dataDisk.mountpoint: '/var/lib/longhorn' is not where Talos 1.14 mounts a user volume (expected /var/mnt/<name>, the name up to 34 letters, digits or '-', e.g. /var/mnt/longhorn)"),
    ({"nodes[1].dataDisk": {"size": 30, "device": "sdb"}},
     "talos-proxmox:nodes[1].dataDisk.device: 'sdb' is not a device path (expected /dev/...)"),
    ({"nodes[0].ip": "10.10.0.1"},
     "talos-proxmox:nodes[0].ip: '10.10.0.1' is the gateway 10.10.0.1 (expected an address of the node's own)"),
    ({"nodes[0].ip": "10.10.0.0"},
     "talos-proxmox:nodes[0].ip: '10.10.0.0' is the network or broadcast address of 10.10.0.0/24"),
    ({"nodes[0].ip": "10.10.0.255"},
     "talos-proxmox:nodes[0].ip: '10.10.0.255' is the network or broadcast address of 10.10.0.0/24"),
    ({"nodes[0].ip": "10.20.0.5"},
     "talos-proxmox:nodes[0].ip: '10.20.0.5' is outside network.subnet 10.10.0.0/24"),
    ({"nodes[0].ip": "10.10.0.300"},
     "talos-proxmox:nodes[0].ip: '10.10.0.300' is not an IP address or address/prefix (expected e.g. 10.255.200.201)"),
    ({"nodes[0].ip": 10},
     'talos-proxmox:nodes[0].ip: 10 is not an IP address or address/prefix (expected e.g. 10.255.200.201)'),
    ({"cluster.vip": None, "nodes[0].ip": "10.10.0.300"},  # no address for the endpoint either: not a second line
     "talos-proxmox:nodes[0].ip: '10.10.0.300' is not an IP address or address/prefix (expected e.g. 10.255.200.201)"),
    ({"nodes[0].ip": None},
     'talos-proxmox:nodes[0].ip: is required: an IP address or address/prefix (expected e.g. 10.255.200.201)'),
    ({"nodes[1].ip": "10.10.0.51"},
     "talos-proxmox:nodes[1].ip: '10.10.0.51' duplicates nodes[0].ip (expected unique values)"),
    ({"nodes[1].ip": "10.20.0.5/16"},
     "talos-proxmox:nodes[1].gateway: '10.10.0.1' is outside the node's subnet 10.20.0.0/16"),
    ({"nodes[1].ip": "10.20.0.0/16", "nodes[1].gateway": "10.20.0.1"},
     "talos-proxmox:nodes[1].ip: '10.20.0.0/16' is the network or broadcast address of 10.20.0.0/16"),
    ({"nodes[1].ip": "10.244.0.5/24", "nodes[1].gateway": "10.244.0.1"},
     "talos-proxmox:cluster.podSubnets: '10.244.0.0/16' overlaps nodes[1].ip 10.244.0.0/24 (expected pod, service and node networks apart)"),
    ({"nodes[1].gateway": "10.20.0.1"},
     "talos-proxmox:nodes[1].gateway: '10.20.0.1' is outside the node's subnet 10.10.0.0/24"),
    ({"nodes[1].gateway": "10.10.0.52"},
     "talos-proxmox:nodes[1].ip: '10.10.0.52' is the gateway 10.10.0.52 (expected an address of the node's own)"),
    ({"nodes[1].gateway": "gw"},
     "talos-proxmox:nodes[1].gateway: 'gw' is not an IP address"),
    ({"nodes[0].mac": "01:00:5e:00:00:01"},
     "talos-proxmox:nodes[0].mac: '01:00:5e:00:00:01' is not a MAC address (expected e.g. bc:24:11:80:a1:9b)"),
    ({"nodes[0].mac": "ff:ff:ff:ff:ff:ff"},
     "talos-proxmox:nodes[0].mac: 'ff:ff:ff:ff:ff:ff' is not a MAC address (expected e.g. bc:24:11:80:a1:9b)"),
    ({"nodes[0].mac": "00:00:00:00:00:00"},
     "talos-proxmox:nodes[0].mac: '00:00:00:00:00:00' is not a MAC address (expected e.g. bc:24:11:80:a1:9b)"),
    ({"nodes[0].mac": "bc:24:11:00:00"},
     "talos-proxmox:nodes[0].mac: 'bc:24:11:00:00' is not a MAC address (expected e.g. bc:24:11:80:a1:9b)"),
    ({"nodes[0].mac": "bc-24-11-00-00-51"},
     "talos-proxmox:nodes[0].mac: 'bc-24-11-00-00-51' is not a MAC address (expected e.g. bc:24:11:80:a1:9b)"),
    ({"nodes[1].mac": "BC:24:11:00:00:51"},
     "talos-proxmox:nodes[1].mac: 'bc:24:11:00:00:51' duplicates nodes[0].mac (expected unique values)"),
    ({"nodes[0].mtu": 67},
     'talos-proxmox:nodes[0].mtu: 67 is not an MTU in 68-65535'),
    ({"nodes[0].nameservers": ["x"]},
     "talos-proxmox:nodes[0].nameservers: ['x'] is not a non-empty list of IP addresses"),
    ({"nodes[0].kernelModules": ["iscsi tcp"]},
     "talos-proxmox:nodes[0].kernelModules: ['iscsi tcp'] is not a list of kernel module names (letters, digits, '_' and '-')"),
    ({"nodes[0].kernelModules": "iscsi_tcp"},
     "talos-proxmox:nodes[0].kernelModules: 'iscsi_tcp' is not a list of kernel module names (letters, digits, '_' and '-')"),
    ({"nodes[0].patches": [RM("/machine/nope")]},
     'talos-proxmox:nodes[0].patches[0]: node dev-cp-1: operation 1 (remove /machine/nope) cannot be applied to the v1alpha1 document (JsonPatchConflict)'),
    ({"nodes[1].patches": [{"apiVersion": "v1alpha1", "kind": "HostnameConfig", "hostname": "x_y"}]},
     "talos-proxmox:nodes[1].patches[0]: node dev-worker-1: leaves the machine config invalid: HostnameConfig hostname is not a DNS hostname (expected lowercase letters, digits and '-', at most 63)"),
    ({"nodes[1].patches": [{"machine": {}}, "machine: {}"]},
     "talos-proxmox:nodes[1].patches[1]: 'machine: {}' is neither a mapping (strategic merge patch) nor a list of JSON patch operations with 'op' and 'path'"),
    ({"nodes[0].proxmoxNode": "pve 2"},
     "talos-proxmox:nodes[0].proxmoxNode: 'pve 2' is not a Proxmox node name (expected e.g. pve)"),
    ({"nodes[0].hostname": "x"},
     "talos-proxmox:nodes[0].hostname: 'x' is not a known key (expected one of: name, role, vmId, proxmoxNode, cpu, memory, disk, dataDisk, ip, gateway, nameservers, mac, mtu, kernelModules, patches)"),
    # add-ons, health, lifecycle
    ({"cilium.enabled": "yes"},
     "talos-proxmox:cilium.enabled: 'yes' is not true or false"),
    ({"cilium.version": "latest"},
     "talos-proxmox:cilium.version: 'latest' is not a chart version (expected e.g. 1.19.6)"),
    ({"cilium.repository": "helm.cilium.io"},
     "talos-proxmox:cilium.repository: 'helm.cilium.io' is not an http(s) chart repository URL with no query or fragment"),
    ({"cilium.repository": "https://helm.cilium.io /"},
     "talos-proxmox:cilium.repository: 'https://helm.cilium.io /' is not an http(s) chart repository URL with no query or fragment"),
    ({"cilium.values": "x"},
     "talos-proxmox:cilium.values: 'x' is not a mapping of Helm values"),
    ({"cilium.chart": "x"},
     "talos-proxmox:cilium.chart: 'x' is not a known key (expected one of: enabled, version, repository, caFile, values, loadBalancerAddresses, timeoutSeconds)"),
    ({"cilium.timeoutSeconds": 0},
     'talos-proxmox:cilium.timeoutSeconds: 0 is not a timeout in seconds (expected an integer in 1-86400, at most a day)'),
    ({"cilium.caFile": "certs/mirror-ca.pem"},
     "talos-proxmox:cilium.caFile: 'certs/mirror-ca.pem' is not a readable PEM file of CA certificates (expected an absolute path)"),
    ({"cilium.caFile": "/nonexistent/mirror-ca.pem"},
     "talos-proxmox:cilium.caFile: '/nonexistent/mirror-ca.pem' is not a readable PEM file of CA certificates (expected an absolute path)"),
    ({"cilium.caFile": "/etc/hostname"},
     "talos-proxmox:cilium.caFile: '/etc/hostname' is not a readable PEM file of CA certificates (expected an absolute path)"),
    ({"cilium.caFile": "/"},
     "talos-proxmox:cilium.caFile: '/' is not a readable PEM file of CA certificates (expected an absolute path)"),
    ({"cilium.caFile": ["/etc/ssl/ca.pem"]},
     "talos-proxmox:cilium.caFile: ['/etc/ssl/ca.pem'] is not a readable PEM file of CA certificates (expected an absolute path)"),
    ({"hubble.relay": False},
     'talos-proxmox:hubble.ui: true needs hubble.relay: true (the UI reads flows through the relay)'),
    ({"hubble.uiServiceType": "Ingress"},
     "talos-proxmox:hubble.uiServiceType: 'Ingress' is not a Service type (expected ClusterIP, NodePort or LoadBalancer)"),
    ({"hubble.enabled": "no"},
     "talos-proxmox:hubble.enabled: 'no' is not true or false"),
    ({"hubble.relay": "yes"},
     "talos-proxmox:hubble.relay: 'yes' is not true or false"),
    ({"hubble.ui": "yes"},
     "talos-proxmox:hubble.ui: 'yes' is not true or false"),
    ({"hubble": "on"},
     "talos-proxmox:hubble: 'on' is not a mapping"),
    ({"ccm.enabled": "yes"},
     "talos-proxmox:ccm.enabled: 'yes' is not true or false"),
    ({"ccm.values": "logVerbosityLevel: 4"},
     "talos-proxmox:ccm.values: 'logVerbosityLevel: 4' is not a mapping of Helm values"),
    ({"ccm.enabled": True, "ccm.controllers": ["route"]},
     "talos-proxmox:ccm.controllers: ['route'] is not a list of CCM controllers (expected some of: cloud-node, cloud-node-lifecycle, node-csr-approval, node-ipam-controller)"),
    ({"ccm.controllers": []},
     'talos-proxmox:ccm.controllers: [] is not a list of CCM controllers (expected some of: cloud-node, cloud-node-lifecycle, node-csr-approval, node-ipam-controller)'),
    ({"ccm.chart": "ghcr.io/siderolabs/charts/talos-cloud-controller-manager"},
     "talos-proxmox:ccm.chart: 'ghcr.io/siderolabs/charts/talos-cloud-controller-manager' is not an OCI chart reference (expected oci://...)"),
    ({"ccm.chart": "oci://ghcr.io/x y"},
     "talos-proxmox:ccm.chart: 'oci://ghcr.io/x y' is not an OCI chart reference (expected oci://...)"),
    ({"ccm.version": "v"},
     "talos-proxmox:ccm.version: 'v' is not a chart version (expected e.g. 0.5.4)"),
    ({"ccm.replicas": 0},
     'talos-proxmox:ccm.replicas: 0 is not a replica count (positive integer)'),
    ({"ccm.nodeIpam": {"maskSizeIpv4": 33}},
     'talos-proxmox:ccm.nodeIpam.maskSizeIpv4: 33 is not a prefix length in 1-32'),
    ({"ccm.enabled": True, "ccm.nodeIpam": {"maskSizeIpv4": 8}},
     'talos-proxmox:ccm.nodeIpam.maskSizeIpv4: 8 does not fit pod subnet 10.244.0.0/16 (expected 16-32)'),
    ({"ccm.enabled": True, "ccm.nodeIpam": {"maskSizeIpv4": 24}, "cluster.podSubnets": ["10.244.0.0/24"]},
     'talos-proxmox:ccm.nodeIpam.maskSizeIpv4: 24 leaves room for 1 node range(s) in 10.244.0.0/24, fewer than the 2 nodes'),
    ({"ccm.enabled": True, "ccm.nodeIpam": {"maskSizeIpv4": 30}, "cluster.podSubnets": ["172.16.0.0/12"]},
     'talos-proxmox:ccm.nodeIpam.maskSizeIpv4: 30 does not fit pod subnet 172.16.0.0/12 (expected 12-28)'),
    ({"ccm.enabled": True, "ccm.nodeIpam": {"maskSizeIpv4": 29}, "cluster.podSubnets": ["172.16.0.0/12"]},
     'talos-proxmox:ccm.nodeIpam.maskSizeIpv4: 29 does not fit pod subnet 172.16.0.0/12 (expected 12-28)'),
    ({"nodes": [CP, WORKER, dict(WORKER, name="dev-worker-2", vmId=9003, ip="10.10.0.53", mac="bc:24:11:00:00:53")],
      "ccm.enabled": True, "ccm.nodeIpam": {"maskSizeIpv4": 17}},
     'talos-proxmox:ccm.nodeIpam.maskSizeIpv4: 17 leaves room for 2 node range(s) in 10.244.0.0/16, fewer than the 3 nodes'),
    ({"ccm.enabled": True, "ccm.nodeIpam": {}, "cluster.podSubnets": ["10.244.0.0/16", "fd00:10:244::/56"]},
     'talos-proxmox:ccm.nodeIpam.maskSizeIpv6: 80 does not fit pod subnet fd00:10:244::/56 (expected 56-72)'),
    ({"ccm.nodeIpam": {"cidrAllocatorType": "Foo"}},
     "talos-proxmox:ccm.nodeIpam.cidrAllocatorType: 'Foo' is not an allocator (expected CloudAllocator or RangeAllocator)"),
    ({"ccm.nodeIpam": {"maskSizeIpv6": 129}},
     'talos-proxmox:ccm.nodeIpam.maskSizeIpv6: 129 is not a prefix length in 1-128'),
    ({"ccm.nodeIpam": "CloudAllocator"},
     "talos-proxmox:ccm.nodeIpam: 'CloudAllocator' is not a mapping"),
    ({"ccm": "off"},
     "talos-proxmox:ccm: 'off' is not a mapping"),
    ({"ccm.replica": 2},
     'talos-proxmox:ccm.replica: 2 is not a known key (expected one of: enabled, chart, version, replicas, controllers, nodeIpam, values, timeoutSeconds)'),
    ({"ccm.timeoutSeconds": "10m"},
     "talos-proxmox:ccm.timeoutSeconds: '10m' is not a timeout in seconds (expected an integer in 1-86400, at most a day)"),
    ({"health.timeoutSeconds": 0},
     'talos-proxmox:health.timeoutSeconds: 0 is not a timeout in seconds (expected an integer in 1-86400, at most a day)'),
    ({"health.timeoutSeconds": 3153600000},
     'talos-proxmox:health.timeoutSeconds: 3153600000 is not a timeout in seconds (expected an integer in 1-86400, at most a day)'),
    ({"health.wait": "yes"},
     "talos-proxmox:health.wait: 'yes' is not true or false"),
    ({"health.interval": 1},
     'talos-proxmox:health.interval: 1 is not a known key (expected one of: wait, timeoutSeconds)'),
    ({"lifecycle.timeoutSeconds": 999999999},
     'talos-proxmox:lifecycle.timeoutSeconds: 999999999 is not a timeout in seconds (expected an integer in 1-86400, at most a day)'),
    ({"lifecycle.resetOnDelete": "no"},
     "talos-proxmox:lifecycle.resetOnDelete: 'no' is not true or false"),
    ({"lifecycle": "on"},
     "talos-proxmox:lifecycle: 'on' is not a mapping"),
    ({"clustr": {}},
     'talos-proxmox:clustr: is not a known key (expected one of: cluster, network, proxmox, image, nodes, cilium, hubble, ccm, csi, backups, health, lifecycle)'),
    # what would not boot or not work on first boot
    ({"hubble.uiServiceType": "LoadBalancer"},
     "talos-proxmox:hubble.uiServiceType: 'LoadBalancer' needs cilium.loadBalancerAddresses (nothing else gives the Service an address; Helm would wait for one, then uninstall Cilium)"),
    ({"cilium.loadBalancerAddresses": ["10.20.0.60/30"]},
     "talos-proxmox:cilium.loadBalancerAddresses[0]: '10.20.0.60/30' is outside the nodes' subnet (L2 announcements answer ARP only there)"),
    ({"cilium.loadBalancerAddresses": ["10.10.0.48/28"]},
     "talos-proxmox:cilium.loadBalancerAddresses[0]: '10.10.0.48/28' includes nodes[0].ip (expected addresses no node, VIP or gateway uses)"),
    ({"cluster.vip": None, "nodes[0].ip": "fd00:10::51/64", "nodes[0].gateway": "fd00:10::1", "cilium.enabled": True,
      "cilium.loadBalancerAddresses": ["fd00:10::50-fd00:10::59"]},
     "talos-proxmox:cilium.loadBalancerAddresses[0]: 'fd00:10::50-fd00:10::59' includes nodes[0].ip (expected addresses no node, VIP or gateway uses)"),
    ({"cilium.loadBalancerAddresses": ["fd00:10::60-fd00:10::69%eth-0"]},
     "talos-proxmox:cilium.loadBalancerAddresses: ['fd00:10::60-fd00:10::69%eth-0'] is not a list of CIDRs or start-stop address ranges (expected e.g. [10.10.0.60/30] or [10.10.0.60-10.10.0.69])"),
    ({"cilium.loadBalancerAddresses": ["10.10.0.1-10.10.0.9"]},
     "talos-proxmox:cilium.loadBalancerAddresses[0]: '10.10.0.1-10.10.0.9' includes the gateway (expected addresses no node, VIP or gateway uses)"),
    ({"cilium.loadBalancerAddresses": ["10.10.0.40-10.10.0.50"]},
     "talos-proxmox:cilium.loadBalancerAddresses[0]: '10.10.0.40-10.10.0.50' includes cluster.vip (expected addresses no node, VIP or gateway uses)"),
    ({"cilium.loadBalancerAddresses": ["10.10.0.52-10.10.0.60"]},
     "talos-proxmox:cilium.loadBalancerAddresses[0]: '10.10.0.52-10.10.0.60' includes nodes[1].ip (expected addresses no node, VIP or gateway uses)"),
    ({"cilium.loadBalancerAddresses": ["10.10.0.200-10.10.1.10"]},
     "talos-proxmox:cilium.loadBalancerAddresses[0]: '10.10.0.200-10.10.1.10' is outside the nodes' subnet (L2 announcements answer ARP only there)"),
    ({"cilium.loadBalancerAddresses": ["10.10.0.250-10.10.0.255"]},
     "talos-proxmox:cilium.loadBalancerAddresses[0]: '10.10.0.250-10.10.0.255' includes the subnet's network or broadcast address"),
    ({"cilium.loadBalancerAddresses": ["10.10.0.70-10.10.0.60"]},
     "talos-proxmox:cilium.loadBalancerAddresses: ['10.10.0.70-10.10.0.60'] is not a list of CIDRs or start-stop address ranges (expected e.g. [10.10.0.60/30] or [10.10.0.60-10.10.0.69])"),
    ({"cilium.enabled": False, "cilium.loadBalancerAddresses": ["10.10.0.60/30"]},
     "talos-proxmox:cilium.loadBalancerAddresses: needs cilium.enabled: true (the pool is Cilium's LB-IPAM)"),
    ({"cluster.systemDiskEncryption": "tpm"},
     "talos-proxmox:cluster.systemDiskEncryption: 'tpm' needs image.secureBoot: true (the key is sealed to the Secure Boot state, PCR 7)"),
    ({"cluster.systemDiskEncryption": "luks"},
     "talos-proxmox:cluster.systemDiskEncryption: 'luks' is not a disk encryption (expected none or tpm)"),
    ({"proxmox.isoDatastoreShared": "yes"},
     "talos-proxmox:proxmox.isoDatastoreShared: 'yes' is not true or false"),
    ({"lifecycle.etcdSnapshots": {"keep": 0}},
     "talos-proxmox:lifecycle.etcdSnapshots.keep: 0 is not a number of snapshots to keep (expected 1-1000)"),
    ({"lifecycle.etcdSnapshots": {"keep": 1001}},
     'talos-proxmox:lifecycle.etcdSnapshots.keep: 1001 is not a number of snapshots to keep (expected 1-1000)'),
    ({"lifecycle.etcdSnapshots": {"directory": ""}},
     "talos-proxmox:lifecycle.etcdSnapshots.directory: '' is not a directory path"),
    ({"lifecycle.etcdSnapshots": {"enabled": "no"}},
     "talos-proxmox:lifecycle.etcdSnapshots.enabled: 'no' is not true or false"),
    ({"lifecycle.etcdSnapshots": {"dir": "/backups"}},
     "talos-proxmox:lifecycle.etcdSnapshots.dir: '/backups' is not a known key (expected one of: enabled, directory, keep)"),
    # csi
    ({"ccm.enabled": True, "csi": {"enabled": True, "storageClasses": [{"name": "data", "datastore": "ceph"}]}},
     "talos-proxmox:csi.storageClasses[0].datastore: 'ceph' is not a datastore the stack's Proxmox hosts have (expected proxmox.vmDatastore 'local-lvm' or one of proxmox.datastores; add it there if every host has it)"),
    ({"ccm.enabled": True, "proxmox.datastores": ["ceph"],
      "csi": {"enabled": True, "storageClasses": [{"name": "fast", "datastore": "ceph", "default": True},
                                                  {"name": "slow", "datastore": "local-lvm", "default": True}]}},
     "talos-proxmox:csi.storageClasses[1].default: true makes a second default StorageClass (csi.storageClasses[0] is one already; Kubernetes then picks either)"),
    ({"ccm.enabled": True, "csi": {"enabled": True, "storageClasses": [{"name": "data", "datastore": "local-lvm"},
                                                                       {"name": "data", "datastore": "local-lvm"}]}},
     "talos-proxmox:csi.storageClasses[1].name: 'data' is also csi.storageClasses[0].name (expected unique names)"),
    ({"csi": {"enabled": True, "storageClasses": [{"name": "data", "datastore": "local-lvm"}]}},
     "talos-proxmox:csi.topologyLabels: 'talos-ccm' needs ccm.enabled: true (the Talos CCM makes the kubelets wait for a cloud provider and sets or leaves the labels)"),
    ({"ccm.enabled": True, "csi": {"enabled": True, "topologyLabels": "proxmox-ccm",
                                   "storageClasses": [{"name": "data", "datastore": "local-lvm"}]}},
     "talos-proxmox:csi.topologyLabels: 'proxmox-ccm' runs the Proxmox CCM's cloud-node controller, and the Talos CCM's would initialize the same nodes (expected ccm.controllers without cloud-node, e.g. [node-csr-approval])"),
    ({"ccm.enabled": True, "csi": {"enabled": True, "topologyLabels": "kubectl",
                                   "storageClasses": [{"name": "data", "datastore": "local-lvm"}]}},
     "talos-proxmox:csi.topologyLabels: 'kubectl' is not a topology label source (expected one of: talos-ccm, proxmox-ccm)"),
    ({"ccm.enabled": True, "csi": {"enabled": True}},
     "talos-proxmox:csi.storageClasses: is empty: with csi.enabled: true, expected at least one StorageClass (e.g. [{name: proxmox-data, datastore: local-lvm}])"),
    ({"csi": {"storageClasses": [{"name": "data", "datastore": "local-lvm", "fsType": "btrfs"}]}},
     "talos-proxmox:csi.storageClasses[0].fsType: 'btrfs' is not a filesystem the plugin formats (expected one of: ext4, xfs)"),
    ({"csi": {"storageClasses": [{"name": "data", "datastore": "local-lvm", "reclaimPolicy": "Recycle"}]}},
     "talos-proxmox:csi.storageClasses[0].reclaimPolicy: 'Recycle' is not a reclaim policy (expected Delete or Retain)"),
    ({"csi": {"storageClasses": [{"name": "data", "datastore": "local-lvm", "cache": "writearound"}]}},
     "talos-proxmox:csi.storageClasses[0].cache: 'writearound' is not a Proxmox disk cache mode (expected one of: none, directsync, writethrough, writeback, unsafe)"),
    ({"csi": {"storageClasses": [{"name": "Data", "datastore": "local-lvm"}]}},
     "talos-proxmox:csi.storageClasses[0].name: 'Data' is not a StorageClass name (expected lowercase letters, digits, '-' and '.', e.g. proxmox-data)"),
    ({"csi": {"storageClasses": [{"name": "data"}]}},
     "talos-proxmox:csi.storageClasses[0].datastore: is required: a Proxmox datastore id (expected e.g. local-lvm: a letter, then letters, digits, '-', '_', '.')"),
    ({"csi": {"storageClasses": [{"name": "data", "datastore": "local-lvm", "iothread": True}]}},
     "talos-proxmox:csi.storageClasses[0].iothread: True is not a known key (expected one of: name, datastore, reclaimPolicy, fsType, cache, ssd, default)"),
    ({"csi": {"storageClasses": {"name": "data"}}},
     "talos-proxmox:csi.storageClasses: {'name': 'data'} is not a list of StorageClasses"),
    ({"cluster.name": "a" * 57, "ccm.enabled": True,
      "csi": {"enabled": True, "storageClasses": [{"name": "data", "datastore": "local-lvm"}]}},
     "talos-proxmox:cluster.name: '" + "a" * 57 + "' is too long for the CSI plugin's Proxmox user " + "a" * 57 + "-csi@pve (PVE takes user ids of at most 64 characters; expected a name of at most 56)"),
    ({"csi": {"region": "pve cluster"}},
     "talos-proxmox:csi.region: 'pve cluster' is not a label value (expected the Proxmox cluster's name, e.g. pve-cluster)"),
    ({"csi": {"chart": "https://example.com/proxmox-csi-plugin"}},
     "talos-proxmox:csi.chart: 'https://example.com/proxmox-csi-plugin' is not an OCI chart reference (expected oci://...)"),
    ({"csi": {"storageclasses": []}},
     "talos-proxmox:csi.storageclasses: [] is not a known key (expected one of: enabled, chart, version, region, topologyLabels, proxmoxCcmChart, proxmoxCcmVersion, storageClasses, values, timeoutSeconds)"),
    ({"proxmox.datastores": ["ceph rbd"]},
     "talos-proxmox:proxmox.datastores: ['ceph rbd'] is not a list of Proxmox datastore ids (datastores besides vmDatastore that every Proxmox host of the stack has, e.g. [ceph-rbd])"),
    # backups
    ({"backups": {"bucket": "etcd-backups", "accessKeyId": "backup", "secretAccessKey": "plain-text-key",
                  "ageRecipient": "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"}},
     "talos-proxmox:backups.secretAccessKey: a credential in plain text; expected a secret (`pulumi config set --secret --path 'talos-proxmox:backups.secretAccessKey' ...`)"),
    # keys outside the project's namespace
    ({"talos-proxmx:ccm": {"enabled": True}},
     "talos-proxmx:ccm: namespace 'talos-proxmx' is not one this program reads, so the key would be ignored (expected talos-proxmox:ccm)"),
    ({"talosproxmox:nodes": []},
     "talosproxmox:nodes: namespace 'talosproxmox' is not one this program reads, so the key would be ignored (expected talos-proxmox:nodes)"),
    ({"proxmox-ve:endpoint": "https://pve:8006/"},
     "proxmox-ve:endpoint: namespace 'proxmox-ve' is not one this program reads, so the key would be ignored (expected proxmoxve:endpoint)"),
    ({"proxmoxve:apiToken": "root@pam!ci=0b5e2d1c-1111-2222-3333-444455556666"},
     'proxmoxve:apiToken: a credential in plain text; expected a secret (`pulumi config set --secret proxmoxve:apiToken ...` or the PROXMOX_VE_API_TOKEN environment variable)'),
    ({"cluster.patches": [{"machine": {"registries": {"config": {"r.lab": {"auth": {"password": "hunter22"}}}}}}]},
     "talos-proxmox:cluster.patches[0].machine.registries.config.r.lab.auth.password: a credential in plain text; expected a secret (`pulumi config set --secret --path 'talos-proxmox:cluster.patches[0].machine.registries.config.r.lab.auth.password' ...`)"),
]


def row_id(changes: dict) -> str:
    """A table row's test id: its changes, cut to 80 characters."""
    return ",".join(f"{k}={v!r}" for k, v in changes.items())[:80]


IDS = [row_id(changes) for changes, _ in BAD_STACKS]


def expected(message: str) -> str:
    return message.replace("{REPO}", str(REPO))


def heading(message: str) -> str:
    return "credentials in plain text in the stack config" if "a credential in plain text" in message \
        else "invalid stack config"


def test_the_table_is_large_and_every_row_distinct():
    assert len(BAD_STACKS) >= 150
    assert len({json.dumps(changes, sort_keys=True) for changes, _ in BAD_STACKS}) == len(BAD_STACKS)


def test_the_dev_stack_itself_loads():
    settings = load_stack(StackConfig(copy.deepcopy(DEV), frozenset()), base_dir=REPO)
    assert [n.name for n in settings.nodes] == ["dev-cp-1", "dev-worker-1"]


@pytest.mark.parametrize("changes, message", BAD_STACKS, ids=IDS)
def test_load_stack_refuses_it_with_one_exact_line(changes, message):
    with pytest.raises((SettingsError, CredentialsError)) as err:
        load_stack(StackConfig(broken(changes), frozenset()), base_dir=REPO)
    assert err.value.problems == [expected(message)]


@pytest.mark.parametrize("changes, message", BAD_STACKS, ids=IDS)
def test_the_render_command_refuses_it_and_writes_nothing(changes, message, tmp_path, capsys):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.broken.yaml").write_text(yaml.safe_dump({"config": broken(changes)}))
    out = tmp_path / "out"
    assert render.main(["--stack", "broken", "--out", str(out), "--stacks-dir", str(stacks)]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"error: {heading(message)}:\n  - {expected(message)}\n"
    assert captured.out == ""
    assert not out.exists()


def _runtime_config(values: dict) -> tuple[dict, dict]:
    """Project keys (prefix stripped, as run_program takes them) and every other key as JSON text."""
    prefix = f"{PROJECT}:"
    project = {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}
    other = {k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items() if not k.startswith(prefix)}
    return project, other


@pytest.mark.parametrize("changes, message", BAD_STACKS, ids=IDS)
def test_the_program_refuses_it_registering_nothing(changes, message):
    project, other = _runtime_config(broken(changes))
    with pytest.raises(pulumi.RunError) as err:
        run_program(project, stack="dev", other_config=other)
    assert str(err.value) == f"{heading(message)}:\n  - {expected(message)}"
    assert err.value.program_run.registrations == []


def test_as_a_process_the_command_prints_the_lines_and_no_traceback(tmp_path):
    """The same as a user runs it: a real interpreter, every row's stack in one directory, one after another."""
    import subprocess
    import sys

    stacks = tmp_path / "stacks"
    stacks.mkdir()
    sample = BAD_STACKS[::20]
    for i, (changes, _) in enumerate(sample):
        (stacks / f"Pulumi.bad{i}.yaml").write_text(yaml.safe_dump({"config": broken(changes)}))
    script = "; ".join(
        f"print(main(['--stack', 'bad{i}', '--out', {str(tmp_path / 'out')!r}, '--stacks-dir', {str(stacks)!r}]))"
        for i in range(len(sample)))
    env = dict(os.environ)
    if env.get("MUTANT_UNDER_TEST") == "stats":  # mutmut's coverage pass records in-process only: run the original
        env["MUTANT_UNDER_TEST"] = ""
    result = subprocess.run([sys.executable, "-c", f"from talos_proxmox.commands.render import main; {script}"],
                            cwd=REPO, capture_output=True, text=True, env=env)
    assert result.stdout.split() == ["1"] * len(sample)
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[1::2] == [f"  - {expected(message)}" for _, message in sample]
    assert not (tmp_path / "out").exists()
