"""The far side of the engine tier: Image Factory, Proxmox VE and one Talos node per VM, as network servers.

Everything a `pulumi up` reaches runs here, in the test's process, on loopback: the factory stand-in
(HTTP), fakepve (the PVE JSON API over HTTPS, with the stack's API token), a FakeTalosNode for each
node at its stack address, 127.0.0.x:50000, and a real Kubernetes control plane behind them
(tests/stand_ins/kubernetes_cluster.py: etcd, API server, controllers, scheduler, kwok as the kubelets).
A node is powered off until the PVE stand-in starts the VM named after it; then it boots the ISO
(maintenance mode) and answers the first, insecure apply, as on a real host. The control planes share
one etcd member list.

The control plane runs under the stack's own Kubernetes CA from the bundle the stack adopts: each control
plane's Kubeconfig RPC hands out an admin kubeconfig for it (client certificate O=system:masters CN=admin
issued by that CA, as Talos signs it), and what the program does with it is in the API server's audit log
(KubeCluster.changes()); each node registers its Node once configured (control planes labelled and
tainted as Talos's kubelet registers them, with their static pods' mirror pods) and gets a workload, a
one-pod Deployment `app-<node>` pinned to it, which drains evict. Each control plane serves the Manifests
resources Talos renders (`talos_manifests`: kube-proxy, CoreDNS at its Talos line's version), and the
Bootstrap RPC creates their objects once, as Talos does. The kubelets are played where a Kubernetes upgrade
looks: a Node registers with its address and the kubelet version of its configuration (updated when a new
configuration changes the kubelet's image), and a control plane's mirror pods carry the image and the
`talos.dev/config-version` of the static pod Talos last rendered; like the real kubelet's, the played
kubelets' sync is level-driven, so a node back from a reboot or a fault shows what its configuration says. Two controllers of the charts are played
too, as no container runs: Cilium's operator registers its LB-IPAM CRDs (Cilium's own CRD files at the
chart's release, .tools/cilium-crds) once its pod is scheduled, and the CCM's node controller lifts the
`node.cloudprovider.kubernetes.io/uninitialized` taint, which each node registers with when the stack runs
an external cloud provider (Talos then starts its kubelet with `--cloud-provider=external`), once a CCM
pod is Ready, giving it first the labels its node transformations say (the `ccm-config.yaml` the chart
rendered into its ConfigMap: `platformMetadata` Region and Zone as the topology labels, for rules selecting
hostnames with `In`; the real CCM has more operators and keys). The charts come from mirrors the test
serves over HTTPS (tests/stand_ins/chart_sources.py): Cilium from a Helm repository whose CA the stack
names in `cilium.caFile`, the CCM from an OCI registry whose CA the CLI's processes trust through
SSL_CERT_FILE (the Kubernetes provider's OCI pulls take no CA file: see KubernetesWiring).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

import pytest

import grpc
import requests
import yaml

from talos_proxmox.commands import render
from talos_proxmox.settings.model import PROJECT
from talos_proxmox.talos_api.generated.machine import machine_pb2
from talos_proxmox.talos_config import secrets_bundle
from talos_proxmox.talos_config import pki
from tests.stand_ins import kubernetes_cluster as kube
from tests.stand_ins.chart_sources import CHARTS, ChartCa, HelmRepository, OciRegistry
from tests.engine.pulumi_cli import CliRun, PulumiProject, missing_tools
from tests.stand_ins.image_factory import StandInFactory
from tests.program.mocked_program import stack_config
from tests.stand_ins.proxmox_ve import ProxmoxStandIn, serve_proxmox
from tests.stand_ins.talos_api import FakeTalosNode, RecordedCall, config_images

TALOS_API_PORT = 50000
# Where the stacks' lifecycles keep etcd snapshots (lifecycle.etcdSnapshots.directory).
SNAPSHOT_DIR = tempfile.mkdtemp(prefix="e2e-etcd-snapshots-")


def e2e_config(factory_url: str, nodes, talos_version: str, *, patches: Optional[Mapping[str, list]] = None,
               kubernetes_version: Optional[str] = None, health: Optional[dict] = None,
               hardware: Optional[Mapping[str, int]] = None) -> dict:
    """stacks/Pulumi.dev.yaml moved onto loopback: `nodes` [(name, role, ip)] at 127.0.0.x, the factory
    stand-in, per-node `patches` by name, no health wait unless `health` says otherwise, and every
    node's `hardware` ({cpu, memory}) as given instead of the dev stack's."""
    config = stack_config("dev")
    config["cluster"].update(vip="127.0.0.100", talosVersion=talos_version)
    if kubernetes_version is not None:
        config["cluster"]["kubernetesVersion"] = kubernetes_version
    config["network"].update(subnet="127.0.0.0/24", gateway="127.0.0.1")
    config["image"]["factoryUrl"] = factory_url
    config["health"] = health or {"wait": False}
    config["lifecycle"] = {"etcdSnapshots": {"directory": SNAPSHOT_DIR, "keep": 3}}
    templates = {node["role"]: node for node in config["nodes"]}
    # VM id and MAC follow the address, so that taking a node out leaves every other node's alone
    config["nodes"] = [
        {**templates[role], "name": name, "ip": ip, "vmId": 9100 + host, "mac": f"bc:24:11:00:01:{host:02x}",
         **(hardware or {}), **({"patches": list(patches[name])} if patches and name in patches else {})}
        for name, role, ip in nodes for host in [int(ip.rsplit(".", 1)[1])]]
    return config



def rendered_configs(config: dict, secrets_yaml: str, directory: Path) -> dict[str, bytes]:
    """What `python -m talos_proxmox.commands.render --stack e2e --secrets <bundle>` writes for each node."""
    stacks, out = directory / "stacks", directory / "out"
    stacks.mkdir(parents=True)
    (stacks / "Pulumi.e2e.yaml").write_text(
        yaml.safe_dump({"config": {f"{PROJECT}:{k}": v for k, v in config.items()}}))
    (directory / "secrets.yaml").write_text(secrets_yaml)
    assert render.main(["--stack", "e2e", "--out", str(out), "--secrets", str(directory / "secrets.yaml"),
                        "--stacks-dir", str(stacks)]) == 0
    return {node["name"]: (out / f"{node['name']}.yaml").read_bytes() for node in config["nodes"]}



class StandInCluster:
    """The factory stand-in, the Proxmox stand-in and one FakeTalosNode per node [(name, role, ip)] on
    ip:50000, in maintenance mode until configured, running in the VM its VmLegacy makes. The control
    planes share one etcd member list, as one etcd cluster does: a member that leaves, or is removed
    through any of them, is gone for all."""

    def __init__(self, factory: StandInFactory, pve: ProxmoxStandIn, nodes, talos_version: str,
                 install_seconds: float = 0.2):
        self.factory, self.pve = factory, pve
        self.nodes: dict[str, FakeTalosNode] = {}
        self.control_planes = [name for name, role, _ in nodes if role == "controlplane"]
        try:
            for name, _, ip in nodes:
                self.nodes[name] = FakeTalosNode(None, mode="maintenance", hostname=name, host=ip,
                                                 port=TALOS_API_PORT, install_downtime=install_seconds, trustd=self._trustd,
                                                 version_tag=talos_version)
        except OSError:
            self.stop()
            raise
        members = [machine_pb2.EtcdMember(id=0x100 + i, hostname=name, peer_urls=[f"https://{ip}:2380"],
                                          client_urls=[f"https://{ip}:2379"])
                   for i, (name, role, ip) in enumerate(nodes) if role == "controlplane"]
        for name, role, _ in nodes:  # what a healthy node reports once the cluster runs
            fake = self.nodes[name]
            fake.etcd_members = list(members) if role == "controlplane" else []
            fake.services = [s for s in fake.services if role == "controlplane" or s.id != "etcd"]
            if role == "controlplane":
                fake.behaviours.update(EtcdLeaveCluster=self._leave, EtcdRemoveMemberByID=self._remove)
            fake.behaviours["ApplyConfiguration"] = functools.partial(self._apply, role)
        self._next_member_id = 0x100 + len(nodes)

    def _forget(self, gone) -> None:
        for name in self.control_planes:
            self.nodes[name].etcd_members = [m for m in self.nodes[name].etcd_members if not gone(m)]

    def _leave(self, node: FakeTalosNode, _request, _context):
        self._forget(lambda member: member.hostname == node.hostname)
        return machine_pb2.EtcdLeaveClusterResponse(messages=[machine_pb2.EtcdLeaveCluster()])

    def _remove(self, node: FakeTalosNode, request, context):
        if not any(m.id == request.member_id for m in node.etcd_members):
            context.abort(grpc.StatusCode.NOT_FOUND, f"member {request.member_id:x} not found")
        self._forget(lambda member: member.id == request.member_id)
        return machine_pb2.EtcdRemoveMemberByIDResponse(messages=[machine_pb2.EtcdRemoveMemberByID()])

    def _apply(self, role: str, node: FakeTalosNode, request, context):
        """A node that installs after the cluster exists (in a new VM) joins it: a control plane becomes
        an etcd member again, with a new id, and the node registers its Node object again."""
        first = node.mode == "maintenance" and not request.dry_run
        response = FakeTalosNode._rpc_ApplyConfiguration(node, request, context)
        if first and role == "controlplane" and not any(m.hostname == node.hostname
                                                           for m in self.nodes[self.control_planes[0]].etcd_members):
            member = machine_pb2.EtcdMember(id=self._next_member_id, hostname=node.hostname,
                                            peer_urls=[f"https://{node.host}:2380"],
                                            client_urls=[f"https://{node.host}:2379"])
            self._next_member_id += 1
            for name in self.control_planes:
                self.nodes[name].etcd_members = [*self.nodes[name].etcd_members, member]
        return response

    def counts(self) -> dict[str, int]:
        return {"factory": len(self.factory.requests), "pve": len(self.pve.requests),
                **{n: len(f.calls) for n, f in self.nodes.items()}}

    def stop(self) -> None:
        for fake in self.nodes.values():
            fake.stop()




STACK = "engine"


@dataclass
class EngineUp:
    """One `pulumi preview` then `pulumi up` of a stack file: what each printed, the stand-ins' request
    counts after the preview, what each node had received by the end, the stack's outputs (`secret_outputs`:
    the names `pulumi stack output` masks), its state (`pulumi stack export`, secrets encrypted) and what
    the render command writes for each node. A preview that fails is where a user's `pulumi up` stops:
    then `up` is that preview and `stopped_in_preview` is set."""

    preview: CliRun
    up: CliRun
    after_preview: dict[str, int]
    calls: dict[str, list[RecordedCall]]
    modes: dict[str, str]
    outputs: dict
    secret_outputs: set[str]
    rendered: dict[str, bytes]
    config: dict
    state: dict
    pve_requests: int
    stopped_in_preview: bool = False
    ended: float = 0.0  # time.monotonic() when this up (or its failed preview) was done

    def steps(self, op: str) -> set[str]:
        return {name for name, step_op in self.up.steps().items() if step_op == op}

    @property
    def error(self) -> str:
        """What the CLI printed as errors (the engine's error diagnostics and its closing lines)."""
        return "".join(self.up.diagnostics("error")) + self.up.stderr

    def resource(self, name: str) -> dict:
        """The state of the custom resource named `name` (inputs, outputs), as `pulumi stack export` has it."""
        [found] = [r for r in self.state["deployment"]["resources"]
                   if r.get("custom") and r["urn"].endswith(f"::{name}") and "pulumi:providers:" not in r["urn"]]
        return found

    def new_calls(self, before: "EngineUp", name: str) -> list[RecordedCall]:
        """What node `name` received during this up (its preview included) and not by the end of `before`."""
        return self.calls[name][len(before.calls.get(name, [])):]


class EngineCluster(StandInCluster):
    """StandInCluster for the real engine: nodes start powered off and run in the VMs the Proxmox provider
    makes through the PVE API; trustd signs with the adopted bundle's OS CA."""

    def __init__(self, factory: StandInFactory, pve: ProxmoxStandIn, nodes, talos_version: str, bundle: dict,
                 install_seconds: float = 0.2) -> None:
        self.bundle = bundle
        super().__init__(factory, pve, nodes, talos_version, install_seconds=install_seconds)
        for fake in self.nodes.values():
            fake.go_down()
        pve.guest_named = self.nodes.get

    def _trustd(self) -> tuple[bytes, bytes]:
        return secrets_bundle.ca_pair(self.bundle, "os")

    kubernetes: "KubernetesWiring"  # set by KubernetesWiring.wire

    def _apply(self, role: str, node: FakeTalosNode, request, context):
        first = node.mode == "maintenance" and not request.dry_run
        response = super()._apply(role, node, request, context)
        if first:
            self.kubernetes.register_when_configured(node, role)
        return response

    def deploy(self, project: PulumiProject, config: dict, render_dir: Path, *, fails: bool = False) -> EngineUp:
        """Write `config` into the stack file, `pulumi preview`, then `pulumi up` (which must fail if
        `fails`, else succeed)."""
        project.set_config(config)
        preview = project.preview(check=not fails)
        after_preview = self.counts()
        stopped = preview.returncode != 0
        up = preview if stopped else project.up(check=not fails)
        assert not fails or up.returncode != 0, "expected this up to fail"
        outputs = json.loads(project.cli("stack", "output", "--json", "--show-secrets", "--stack", project.stack).stdout)
        shown = json.loads(project.cli("stack", "output", "--json", "--stack", project.stack).stdout)
        render_dir.mkdir(parents=True)
        # The offline render cannot decrypt a stack's secrets (it refuses them, as it does a user's).
        rendered = ({} if stopped or '"secure": ' in json.dumps(config)
                    else rendered_configs(config, secrets_bundle.dump_secrets(self.bundle), render_dir))
        return EngineUp(preview, up, after_preview, {n: list(f.calls) for n, f in self.nodes.items()},
                        {n: f.mode for n, f in self.nodes.items()}, outputs,
                        {key for key, value in shown.items() if value == "[secret]"}, rendered, config,
                        project.export(), len(self.pve.requests), stopped_in_preview=stopped, ended=time.monotonic())


CILIUM_CHART_FILE = "cilium-1.19.6.tgz"
CCM_CHART_FILE = "talos-cloud-controller-manager-0.5.4.tgz"
CSI_CHART_FILE = "proxmox-csi-plugin-0.5.9.tgz"
PROXMOX_CCM_CHART_FILE = "proxmox-cloud-controller-manager-0.2.27.tgz"
CSI_REPOSITORY = "sergelogvinov/charts/proxmox-csi-plugin"
PROXMOX_CCM_REPOSITORY = "sergelogvinov/charts/proxmox-cloud-controller-manager"
CCM_CONFIG_MAP = "/api/v1/namespaces/kube-system/configmaps/talos-cloud-controller-manager"
CCM_REPOSITORY = "siderolabs/charts/talos-cloud-controller-manager"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
STATIC_PODS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
REGISTER_TIMEOUT = 120.0  # seconds a node may take from its first apply to answering configured
UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"  # the kubelet's, with an external cloud provider
CILIUM_CRDS = kube.TOOLS.parent / "cilium-crds"  # scripts/tools.sh: Cilium's CRD files at the chart's release
CILIUM_OPERATOR_PODS = "/api/v1/namespaces/kube-system/pods?labelSelector=io.cilium%2Fapp%3Doperator"
CCM_PODS = ("/api/v1/namespaces/kube-system/pods?labelSelector=app.kubernetes.io%2Fname%3D"
            "talos-cloud-controller-manager")
CONTROLLER_POLL_SECONDS = 0.25
MIRROR_PODS = "/api/v1/namespaces/kube-system/pods?labelSelector=tier%3Dcontrol-plane"


# Talos's CRD for Kubernetes workloads' access to its API (internal/app/machined/pkg/controllers/k8s/
# templates: serviceaccounts.talos.dev), applied with the bootstrap manifests when the feature is on.
TALOS_SERVICE_ACCOUNT_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "serviceaccounts.talos.dev"},
    "spec": {"group": "talos.dev", "scope": "Namespaced",
             "names": {"kind": "ServiceAccount", "listKind": "ServiceAccountList", "plural": "serviceaccounts",
                       "singular": "serviceaccount", "shortNames": ["tsa"]},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                               "spec": {"type": "object", "properties": {
                                   "roles": {"type": "array", "items": {"type": "string"}}}},
                               "status": {"type": "object", "properties": {
                                   "failureReason": {"type": "string"}}}}}}}]}}


# The CoreDNS each Talos line renders when the configuration names none (constants.DefaultCoreDNSVersion of the
# line's newest release we know of; the stand-in does not tell patch releases apart).
COREDNS_BY_TALOS_LINE = {"v1.12": "v1.14.2", "v1.13": "v1.14.6", "v1.14": "v1.14.7"}
COREDNS_IMAGE = "registry.k8s.io/coredns/coredns"


def _tag(image: str) -> str:
    return image.rsplit(":", 1)[-1] if ":" in image else ""


def node_images(node: FakeTalosNode) -> dict[str, str]:
    """component -> image in the configuration the node runs (the stand-in's own reading of it)."""
    return config_images([d for d in yaml.safe_load_all(node.config or b"") if isinstance(d, dict)])


def talos_manifests(node: FakeTalosNode) -> list[tuple[str, list[dict]]]:
    """The Manifests resources a control plane renders from its configuration and Talos version, as far as
    anything here runs them: kube-proxy (unless disabled), CoreDNS (two replicas that tolerate the control
    planes' taint; its Service, config and RBAC left out), and with the Talos API access feature on (the
    CCM's), Talos's ServiceAccount CRD, which the CCM chart makes an object of. (Talos's controller
    answering such an object with a Secret holding a talosconfig is not played.)"""
    config = node.config or b""
    documents = [d for d in yaml.safe_load_all(config) if isinstance(d, dict)]
    v1alpha1 = next((d for d in documents if d.get("version") == "v1alpha1"), {})
    cluster = v1alpha1.get("cluster") or {}
    images = node_images(node)
    line = ".".join(node.version_tag.split(".")[:2])
    coredns = (cluster.get("coreDNS") or {}).get("image") or f"{COREDNS_IMAGE}:{COREDNS_BY_TALOS_LINE.get(line, 'v1.14.7')}"
    manifests = []
    proxy_document = next((d for d in documents if d.get("kind") == "KubeProxyConfig"), {})
    proxy_off = (cluster.get("proxy") or {}).get("disabled") or proxy_document.get("enabled") is False
    if not proxy_off and images.get("kube-proxy"):
        labels = {"k8s-app": "kube-proxy"}
        manifests.append(("10-kube-proxy", [{
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": {"tier": "node", **labels}},
            "spec": {"selector": {"matchLabels": labels}, "updateStrategy": {"type": "RollingUpdate"},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "hostNetwork": True, "priorityClassName": "system-node-critical",
                         "tolerations": [{"operator": "Exists"}],
                         "containers": [{"name": "kube-proxy", "image": images["kube-proxy"],
                                         "command": ["/usr/local/bin/kube-proxy"]}]}}}}]))
    labels = {"k8s-app": "kube-dns"}
    manifests.append(("11-core-dns", [{
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "coredns", "namespace": "kube-system", "labels": {**labels, "kubernetes.io/name": "CoreDNS"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "priorityClassName": "system-cluster-critical",
                     "tolerations": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists", "effect": "NoSchedule"},
                                     {"key": "CriticalAddonsOnly", "operator": "Exists"},
                                     {"key": "node.cloudprovider.kubernetes.io/uninitialized", "operator": "Exists"}],
                     "containers": [{"name": "coredns", "image": coredns,
                                     "args": ["-conf", "/etc/coredns/Corefile"]}]}}}}]))
    if talos_api_access(config):
        manifests.append(("13-talos-service-account-crd", [TALOS_SERVICE_ACCOUNT_CRD]))
    return manifests


def external_cloud_provider(config: bytes) -> bool:
    """Whether a machine config starts the kubelet with `--cloud-provider=external` (so that it registers
    its Node tainted uninitialized): kubelet extraArgs in v1alpha1 `machine.kubelet` or a KubeletConfig
    document, or v1alpha1 `cluster.externalCloudProvider.enabled`, which makes Talos pass it."""
    for document in yaml.safe_load_all(config):
        if not isinstance(document, dict):
            continue
        kubelet = (document.get("machine") or {}).get("kubelet") or {}
        if document.get("kind") == "KubeletConfig":
            kubelet = document
        if (kubelet.get("extraArgs") or {}).get("cloud-provider") == "external":
            return True
        if ((document.get("cluster") or {}).get("externalCloudProvider") or {}).get("enabled"):
            return True
    return False


def talos_api_access(config: bytes) -> bool:
    """Whether a machine config turns on Kubernetes workloads' Talos API access (v1alpha1
    machine.features.kubernetesTalosAPIAccess, or a KubeTalosAPIAccessConfig document)."""
    for document in yaml.safe_load_all(config):
        if not isinstance(document, dict):
            continue
        if document.get("kind") == "KubeTalosAPIAccessConfig":
            return document.get("enabled", True) is not False
        access = ((document.get("machine") or {}).get("features") or {}).get("kubernetesTalosAPIAccess") or {}
        if access.get("enabled"):
            return True
    return False


class KubernetesWiring:
    """The real control plane behind an EngineCluster's nodes (see the module doc), and the chart mirrors.

    `kube`: the running KubeCluster; `helm_repository` (Cilium's chart) and `oci_registry` (the CCM's), each
    with a CA of its own; `registered`: the Node names registered so far; `errors`: what went wrong in a
    registration thread (a test asserts it stays empty)."""

    def __init__(self, kube_cluster: kube.KubeCluster, bundle: dict, workdir: Path):
        self.kube = kube_cluster
        self.bundle = bundle
        self.registered: list[str] = []
        self.errors: list[str] = []
        self._fakes: Mapping[str, FakeTalosNode] = {}  # the nodes whose kubelets are played (set by `wire`)
        self._control_planes: set[str] = set()
        self._stopped = threading.Event()
        self.repository_ca = ChartCa(workdir / "repository-ca")
        self.registry_ca = ChartCa(workdir / "registry-ca")
        self.helm_repository = HelmRepository(self.repository_ca,
                                              {CILIUM_CHART_FILE: (CHARTS / CILIUM_CHART_FILE).read_bytes()})
        self.oci_registry = OciRegistry(self.registry_ca)
        self.ccm_chart = self.oci_registry.push(CCM_REPOSITORY, (CHARTS / CCM_CHART_FILE).read_bytes())
        self.csi_chart = self.oci_registry.push(CSI_REPOSITORY, (CHARTS / CSI_CHART_FILE).read_bytes())
        self.proxmox_ccm_chart = self.oci_registry.push(PROXMOX_CCM_REPOSITORY,
                                                        (CHARTS / PROXMOX_CCM_CHART_FILE).read_bytes())
        self.cilium_crds_registered = False
        self.initialized_by_ccm: list[str] = []  # Nodes whose uninitialized taint the played CCM lifted, in order
        threading.Thread(target=self._play_controllers, daemon=True, name="played-controllers").start()

    def admin_kubeconfig(self) -> str:
        """What Talos's Kubeconfig RPC hands out: the cluster's URL and an admin client certificate
        (O=system:masters, CN=admin) freshly issued by the cluster's Kubernetes CA."""
        ca_cert, ca_key = secrets_bundle.ca_pair(self.bundle, "k8s")
        cert, key = pki.issue_certificate(ca_cert, ca_key, common_name="admin", organizations=("system:masters",),
                                          key_type=pki.key_type_of(pki.load_key(ca_key)), client=True)
        return kube.kubeconfig_yaml(self.kube.url, ca_cert, cert, key, "admin")

    def stack_settings(self) -> dict:
        """The add-on sections of a stack installing both charts from the mirrors."""
        return {"cilium": {"enabled": True, "repository": self.helm_repository.url,
                           "caFile": str(self.repository_ca.ca_file)},
                "ccm": {"enabled": True, "chart": self.ccm_chart}}

    def csi_settings(self, **csi) -> dict:
        """A `csi` section installing the Proxmox CSI plugin (and the Proxmox CCM) from the registry."""
        return {"enabled": True, "chart": self.csi_chart, "proxmoxCcmChart": self.proxmox_ccm_chart, **csi}

    def cli_env(self) -> dict[str, str]:
        """The CLI's (and so its plugins') environment: the registry's CA as the only trusted roots (Helm's
        OCI pulls in pulumi-resource-kubernetes 4.32 use a registry client made without the release's
        repositoryOpts.caFile, so an OCI mirror's CA must be trusted system-wide), and Helm's cache and
        config kept inside the test's directory."""
        helm = self.repository_ca.ca_file.parent.parent / "helm"
        return {"SSL_CERT_FILE": str(self.registry_ca.ca_file), "HELM_CACHE_HOME": str(helm / "cache"),
                "HELM_CONFIG_HOME": str(helm / "config"), "HELM_DATA_HOME": str(helm / "data")}

    # --- what the kubelets and Talos's bootstrap do ------------------------------------------------

    def register_when_configured(self, node: FakeTalosNode, role: str) -> None:
        """Once `node` answers configured, register its Node as its kubelet would (a control plane with
        the role label and NoSchedule taint, and mirror pods of its static pods)."""
        def wait_then_register():
            deadline = time.monotonic() + REGISTER_TIMEOUT
            while not (node.mode == "configured" and node.is_up):
                if self._stopped.wait(0.1):
                    return
                if time.monotonic() > deadline:
                    self.errors.append(f"{node.hostname}: not configured {REGISTER_TIMEOUT:.0f}s after its first apply")
                    return
            try:
                self.register(node.hostname, control_plane=role == "controlplane",
                              uninitialized=external_cloud_provider(node.config or b""), node=node)
            except Exception as exc:  # noqa: BLE001 - reported through `errors`
                self.errors.append(f"{node.hostname}: {exc}")

        threading.Thread(target=wait_then_register, daemon=True, name=f"kubelet-{node.hostname}").start()

    def register(self, name: str, control_plane: bool, uninitialized: bool = False,
                 node: Optional[FakeTalosNode] = None) -> None:
        """The Node as the kubelet registers it (its address and kubelet version from `node`, the stand-in
        Talos node it runs on), with a control plane's mirror pods, and its workload."""
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  **({CONTROL_PLANE_LABEL: ""} if control_plane else {})}
        taints = [{"key": CONTROL_PLANE_LABEL, "effect": "NoSchedule"}] if control_plane else []
        if uninitialized:
            taints.append({"key": UNINITIALIZED_TAINT, "value": "true", "effect": "NoSchedule"})
        spec = {"taints": taints} if taints else {}
        status = {}
        if node is not None:  # kwok keeps what the kubelet registered with
            status = {"addresses": [{"type": "InternalIP", "address": node.host}, {"type": "Hostname", "address": name}],
                      "nodeInfo": {"kubeletVersion": _tag(node_images(node).get("kubelet", ""))}}
        response = self.kube.request("POST", "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": spec,
            "status": status})
        if response.status_code == 409:  # a node back in a new VM: its kubelet finds its Node
            response = self.kube.request("GET", f"/api/v1/nodes/{name}")
        if response.status_code not in (200, 201):
            raise RuntimeError(f"Node {name}: HTTP {response.status_code}: {response.text[:300]}")
        self._workload(name)
        self.registered.append(name)

    def _play_kubelets(self) -> None:
        """The kubelets' sync loop: what each running node's kubelet keeps true in the API server, whatever
        happened before (a reboot, a kill of the up, a paused API server). As the real kubelet does, it is
        level-driven: the mirror pod of each static pod Talos last rendered (a changed or missing one is
        replaced: the old deleted, the new made once it is gone), and the Node's kubelet version. A node
        powered off does nothing, so its mirror pods stay as they were until it runs again."""
        while not self._stopped.wait(CONTROLLER_POLL_SECONDS):
            try:
                self._sync_kubelets()
            except requests.RequestException:
                continue  # the API server is away (a fault row pauses it): the kubelet retries, as the real one
            except Exception as exc:  # noqa: BLE001 - reported through `errors`, once while it lasts
                if not self.errors or self.errors[-1] != f"played kubelets: {exc}":
                    self.errors.append(f"played kubelets: {exc}")

    def _sync_kubelets(self) -> None:
        running = [self._fakes[name] for name in dict.fromkeys(self.registered)
                   if name in self._fakes and self._fakes[name].is_up and self._fakes[name].mode == "configured"]
        if not running:
            return
        nodes = {node["metadata"]["name"]: node for node in self._items("/api/v1/nodes", timeout=5)}
        pods = {pod["metadata"]["name"]: pod for pod in self._items(MIRROR_PODS, timeout=5)}
        for fake in running:
            node = nodes.get(fake.hostname)
            if node is None:  # taken out of the cluster: its kubelet registers it again when it rejoins
                continue
            kubelet = _tag(node_images(fake).get("kubelet", ""))
            if kubelet and ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion") != kubelet:
                self._changed(f"/api/v1/nodes/{fake.hostname}/status", "PATCH",
                              {"status": {"nodeInfo": {"kubeletVersion": kubelet}}})
            if fake.hostname not in self._control_planes:
                continue
            for component in STATIC_PODS:
                image, version = fake.static_pods.get(component, (f"registry.k8s.io/{component}:v1.36.2", 0))
                pod = pods.get(f"{component}-{fake.hostname}")
                if pod is None:
                    self._mirror_pod(fake.hostname, node["metadata"]["uid"], component, image, version)
                elif ((pod["spec"]["containers"][0]["image"],
                       pod["metadata"].get("annotations", {}).get("talos.dev/config-version")) != (image, str(version))
                      and not pod["metadata"].get("deletionTimestamp")):
                    self._changed(f"/api/v1/namespaces/kube-system/pods/{pod['metadata']['name']}", "DELETE",
                                  {"gracePeriodSeconds": 0}, gone_too=True)

    def _changed(self, path: str, method: str, body: dict, *, gone_too: bool = False) -> None:
        response = self.kube.request(method, path, body, timeout=5)
        if response.status_code != 200 and not (gone_too and response.status_code == 404):
            raise RuntimeError(f"{method} {path}: HTTP {response.status_code}: {response.text[:300]}")

    def _workload(self, node: str) -> None:
        """A user's workload on `node`: Deployment `app-<node>`, one pod pinned there (back once the node
        is schedulable again after a drain), in the default namespace."""
        labels = {"app": f"app-{node}"}
        response = self.kube.request("POST", "/apis/apps/v1/namespaces/default/deployments", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"app-{node}", "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                         "tolerations": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
                         "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}}}})
        if response.status_code not in (201, 409):
            raise RuntimeError(f"workload app-{node}: HTTP {response.status_code}: {response.text[:300]}")

    def _mirror_pod(self, node: str, node_uid: str, component: str, image: str, config_version: int) -> None:
        """A static pod's mirror pod, as the kubelet creates it: bound to its node, owned by the Node,
        annotated kubernetes.io/config.mirror and with the version of the config Talos rendered it from,
        labelled k8s-app=<component> as Talos labels them."""
        response = self.kube.request("POST", "/api/v1/namespaces/kube-system/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{component}-{node}", "namespace": "kube-system",
                         "labels": {"k8s-app": component, "tier": "control-plane"},
                         "annotations": {"kubernetes.io/config.mirror": f"{component}-{node}",
                                         "kubernetes.io/config.source": "file",
                                         "talos.dev/config-version": str(config_version)},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                              "controller": True}]},
            "spec": {"nodeName": node, "hostNetwork": True, "priorityClassName": "system-cluster-critical",
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": component, "image": image}]}})
        if response.status_code not in (201, 409):
            raise RuntimeError(f"mirror pod {component}-{node}: HTTP {response.status_code}: {response.text[:300]}")

    def bootstrap_manifests(self, node: FakeTalosNode) -> None:
        """What Talos applies once, after bootstrap: the objects of the node's Manifests resources, each
        created (never updated: that is upgrade-k8s's manifest sync)."""
        paths = {"Deployment": "/apis/apps/v1/namespaces/kube-system/deployments",
                 "DaemonSet": "/apis/apps/v1/namespaces/kube-system/daemonsets",
                 "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"}
        for _id, objects in talos_manifests(node):
            for obj in objects:
                response = self.kube.request("POST", paths[obj["kind"]], obj)
                if response.status_code not in (201, 409):
                    self.errors.append(f"{obj['kind']} {obj['metadata']['name']}: HTTP {response.status_code}: "
                                       f"{response.text[:300]}")

    # --- what the charts' controllers do (no container runs) -------------------------------------

    def _play_controllers(self) -> None:
        while not self._stopped.wait(CONTROLLER_POLL_SECONDS):
            try:
                if not self.cilium_crds_registered and self._items(CILIUM_OPERATOR_PODS, scheduled=True):
                    self._register_cilium_crds()
                if self._items(CCM_PODS, ready=True):
                    self._initialize_nodes()
            except Exception as exc:  # noqa: BLE001 - reported through `errors`
                self.errors.append(f"played controllers: {exc}")
                return

    def _items(self, path: str, *, scheduled: bool = False, ready: bool = False, timeout: float = 30.0) -> list[dict]:
        response = self.kube.request("GET", path, timeout=timeout)
        if response.status_code != 200:
            raise RuntimeError(f"GET {path}: HTTP {response.status_code}: {response.text[:300]}")
        return [pod for pod in response.json()["items"]
                if (not scheduled or pod["spec"].get("nodeName"))
                and (not ready or any(c["type"] == "Ready" and c["status"] == "True"
                                      for c in (pod.get("status") or {}).get("conditions") or ()))]

    def _register_cilium_crds(self) -> None:
        """As Cilium's operator does at its start: its CRDs, served once Established."""
        names = []
        for crd_file in sorted(CILIUM_CRDS.glob("*.yaml")):
            crd = yaml.safe_load(crd_file.read_text())
            response = self.kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            if response.status_code not in (201, 409):
                raise RuntimeError(f"CRD {crd_file.name}: HTTP {response.status_code}: {response.text[:300]}")
            names.append(crd["metadata"]["name"])
        if not names:
            raise RuntimeError(f"no Cilium CRD files in {CILIUM_CRDS}: run `bash scripts/tools.sh`")
        deadline = time.monotonic() + 30
        for name in names:
            while not any(c["type"] == "Established" and c["status"] == "True" for c in (self.kube.request(
                    "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}").json().get("status")
                    or {}).get("conditions") or ()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"CRD {name} not Established after 30s")
                time.sleep(0.1)
        self.cilium_crds_registered = True

    def _initialize_nodes(self) -> None:
        """As the CCM's node controller does: each Node's uninitialized taint lifted, with the topology
        labels of the transformations in the CCM's config."""
        labels_by_node = self._transformation_labels()
        for node in self.kube.request("GET", "/api/v1/nodes").json()["items"]:
            taints = (node.get("spec") or {}).get("taints") or []
            if any(t["key"] == UNINITIALIZED_TAINT for t in taints):
                kept = [t for t in taints if t["key"] != UNINITIALIZED_TAINT]
                name = node["metadata"]["name"]
                change: dict = {"spec": {"taints": kept or None}}
                if labels_by_node.get(name):
                    change["metadata"] = {"labels": labels_by_node[name]}
                response = self.kube.request("PATCH", f"/api/v1/nodes/{name}", change)
                if response.status_code != 200:
                    raise RuntimeError(f"Node {name}: untaint: HTTP {response.status_code}: {response.text[:300]}")
                self.initialized_by_ccm.append(name)

    def _transformation_labels(self) -> dict[str, dict[str, str]]:
        response = self.kube.request("GET", CCM_CONFIG_MAP)
        if response.status_code != 200:
            return {}
        config = yaml.safe_load(response.json().get("data", {}).get("ccm-config.yaml") or "") or {}
        labels: dict[str, dict[str, str]] = {}
        for rule in config.get("transformations") or ():  # beside `global`, as the CCM's cloudConfig reads it
            metadata = rule.get("platformMetadata") or {}
            topology = {key: metadata[field] for key, field in (("topology.kubernetes.io/region", "Region"),
                                                                ("topology.kubernetes.io/zone", "Zone"))
                        if metadata.get(field)}
            for selector in rule.get("nodeSelector") or ():
                for expression in selector.get("matchExpressions") or ():
                    if expression.get("key", "").lower() == "hostname" and expression.get("operator") == "In":
                        for hostname in expression.get("values") or ():
                            labels.setdefault(hostname, {}).update({**(rule.get("labels") or {}), **topology})
        return labels

    def wire(self, cluster: EngineCluster) -> None:
        """Point `cluster`'s nodes at the real control plane: kubeconfigs, registration, bootstrap."""
        cluster.kubernetes = self
        for name in cluster.control_planes:
            fake = cluster.nodes[name]
            fake.kubeconfig_yaml = self.admin_kubeconfig()
            fake.manifests = talos_manifests
        self._fakes, self._control_planes = cluster.nodes, set(cluster.control_planes)
        threading.Thread(target=self._play_kubelets, daemon=True, name="played-kubelets").start()
        first = cluster.nodes[cluster.control_planes[0]]

        def bootstrap(node: FakeTalosNode, request, context):
            response = FakeTalosNode._rpc_Bootstrap(node, request, context)
            self.bootstrap_manifests(node)
            return response
        first.behaviours["Bootstrap"] = bootstrap

    def release_secrets(self, release: str) -> dict[str, str]:
        """{secret name: status label} of Helm's revisions of `release` in kube-system, as the API server holds them."""
        path = f"/api/v1/namespaces/kube-system/secrets?labelSelector=owner%3Dhelm,name%3D{release}"
        response = self.kube.request("GET", path)
        assert response.status_code == 200, f"GET {path}: HTTP {response.status_code}: {response.text[:300]}"
        return {s["metadata"]["name"]: s["metadata"]["labels"]["status"] for s in response.json()["items"]}

    def close(self) -> None:
        self._stopped.set()
        self.helm_repository.close()
        self.oci_registry.close()


class EnvPulumiProject(PulumiProject):
    """A PulumiProject whose CLI runs with `extra_env` on top of its own environment."""

    def __init__(self, workdir: Path, stack: str, extra_env: dict[str, str]):
        super().__init__(workdir, stack)
        self.extra_env = dict(extra_env)

    def env(self) -> dict[str, str]:
        return {**super().env(), **self.extra_env}


def engine_stack(cluster: EngineCluster, nodes, talos_version: str, secrets_file: Path, **options) -> dict:
    """The dev stack on loopback (e2e_config) adopting `secrets_file`, with Cilium and the CCM off: only
    `engine_cluster(..., addons=True)` serves their charts (test_addons*.py turn them on)."""
    config = e2e_config(cluster.factory.url, nodes, talos_version, **options)
    config["cluster"]["secretsFile"] = str(secrets_file)
    config["cilium"] = {"enabled": False}
    config["ccm"] = {"enabled": False}
    return config


@contextlib.contextmanager
def _real_kubernetes(tmp_path: Path, bundle: dict, apiserver_args: Sequence[str] = ()) -> Iterator[KubernetesWiring]:
    missing = kube.missing_binaries() + [name for name in ("pulumi-resource-kubernetes",)
                                         if not os.access(kube.TOOLS / name, os.X_OK)]
    missing += [] if any(CILIUM_CRDS.glob("*.yaml")) else ["cilium-crds"]
    if missing:
        pytest.fail(f"the engine tier needs {', '.join(missing)} in .tools: run `bash scripts/tools.sh`")
    ca_cert, ca_key = secrets_bundle.ca_pair(bundle, "k8s")
    sa_key = pki.pem_from_b64(bundle["certs"]["k8sserviceaccount"]["key"])
    with kube.kube_cluster(tmp_path / "kube", ca_cert, ca_key, service_account_key_pem=sa_key,
                           apiserver_args=apiserver_args) as running:
        wiring = KubernetesWiring(running, bundle, tmp_path / "charts")
        try:
            yield wiring
        finally:
            wiring.close()


@contextlib.contextmanager
def engine_cluster(tmp_path: Path, nodes, talos_version: str, install_seconds: float = 0.2,
                   addons: bool = False, apiserver_args: Sequence[str] = (),
                   **options) -> Iterator[tuple[EngineCluster, PulumiProject]]:
    """Stand-ins for `nodes` [(name, role, ip)], the real control plane behind them, and a stack of the
    program on them, initialised (stack file, Proxmox endpoint, the API token as a secret) but not yet
    deployed. `install_seconds`: how long each node takes from its first apply to answering configured.
    `addons`: Cilium and the CCM on, from the test's chart mirrors (`cluster.kubernetes`). `apiserver_args`:
    more kube-apiserver flags."""
    missing = missing_tools()
    if missing:
        pytest.fail(f"the engine tier needs {', '.join(missing)} in .tools/bin: run `bash scripts/tools.sh`")
    bundle = secrets_bundle.generate_secrets(talos_version)
    secrets_file = tmp_path / "secrets.yaml"
    secrets_file.write_text(secrets_bundle.dump_secrets(bundle))
    secrets_file.chmod(0o600)
    with _real_kubernetes(tmp_path, bundle, apiserver_args) as wiring, \
            _engine_cluster(tmp_path, nodes, talos_version, install_seconds, bundle, secrets_file, wiring, addons,
                            **options) as made:
        yield made


@contextlib.contextmanager
def _engine_cluster(tmp_path: Path, nodes, talos_version: str, install_seconds: float, bundle: dict,
                    secrets_file: Path, wiring: KubernetesWiring, addons: bool,
                    **options) -> Iterator[tuple[EngineCluster, PulumiProject]]:
    with StandInFactory() as factory, serve_proxmox() as pve:
        try:
            cluster = EngineCluster(factory, pve, nodes, talos_version, bundle, install_seconds)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                pytest.fail(f"the engine tier listens on 127.0.0.x addresses, and cannot here ({exc})")
            raise
        try:
            wiring.wire(cluster)
            project = EnvPulumiProject(tmp_path / "pulumi", STACK, wiring.cli_env())
            endpoint = pve.provider_config()
            config = engine_stack(cluster, nodes, talos_version, secrets_file, **options)
            if addons:
                config.update(wiring.stack_settings())
            for host in {config["proxmox"]["node"], *(node.get("proxmoxNode") for node in config["nodes"])} - {None}:
                pve.add_node(host)  # the Proxmox cluster's members
            project.init(config,
                         other={"proxmoxve:endpoint": endpoint["proxmoxve:endpoint"], "proxmoxve:insecure": "true"},
                         secrets={"proxmoxve:apiToken": endpoint["proxmoxve:apiToken"]})
            yield cluster, project
        finally:
            cluster.stop()


def secret_texts(cluster: EngineCluster) -> list[str]:
    """Strings that must never appear in anything the CLI prints: the bundle's secrets and the API token."""
    token = cluster.pve.provider_config()["proxmoxve:apiToken"].split("=", 1)[1]
    return [*secrets_bundle.secret_strings(cluster.bundle), token]
