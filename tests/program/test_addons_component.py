"""`ClusterAddons` under Pulumi mocks: the releases registered, their charts, values and dependencies.

A monitor subclass records what the SDK sends the engine for each resource: inputs, the URNs it
depends on and the provider reference, so the dependency assertions check the real RegisterResource
requests rather than the options we meant to pass.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s
import yaml
from pulumi.runtime import rpc
from pulumi.runtime import settings as runtime_settings
from pulumi.runtime.mocks import MockMonitor

from components.addons import ClusterAddons
from talos_proxmox.cluster_plan.addon_values import release_sha256
from talos_proxmox.settings.stack import load_settings, stack_file_config
from tests.unit.cluster_plan.test_addon_values import seed_ccm_values, seed_cilium_values
from tests.paths import STACKS

KUBECONFIG_TEXT = "apiVersion: v1\nkind: Config\n"
LB_ADDRESS = "10.255.200.240"
RELEASE = "kubernetes:helm.sh/v3:Release"
SERVICE = "kubernetes:core/v1:Service"
CUSTOM_TYPES = ("kubernetes:cilium.io/v2:CiliumLoadBalancerIPPool", "kubernetes:cilium.io/v2alpha1:CiliumL2AnnouncementPolicy")
HEALTH = DYNAMIC = "pulumi-python:dynamic:Resource"


@dataclass
class Sent:
    kind: str  # "register" or "read"
    type: str
    name: str
    urn: str
    inputs: dict
    secret_inputs: set
    dependencies: list
    provider: str
    id: str = ""


class RecordingMonitor(MockMonitor):
    def __init__(self, mocks):
        super().__init__(mocks)
        self.sent: list[Sent] = []

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        self.sent.append(self._record("register", request, response.urn, request.object))
        return response

    def ReadResource(self, request):
        response = super().ReadResource(request)
        sent = self._record("read", request, response.urn, request.properties)
        sent.id = request.id
        self.sent.append(sent)
        return response

    @staticmethod
    def _record(kind, request, urn, struct):
        inputs = rpc.deserialize_properties(struct)
        secret = {k for k, v in struct.fields.items()
                  if v.HasField("struct_value") and v.struct_value.fields.get(rpc._special_sig_key)
                  and v.struct_value.fields[rpc._special_sig_key].string_value == rpc._special_secret_sig}
        return Sent(kind, request.type, request.name, urn, inputs, secret, list(request.dependencies),
                    request.provider)


class Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args):
        outputs = dict(args.inputs)
        outputs.pop("__provider", None)
        if args.typ == "test:index:Kubeconfig":
            outputs["kubeconfig"] = KUBECONFIG_TEXT
        if args.typ == RELEASE:
            outputs["status"] = {"name": args.inputs["name"], "namespace": args.inputs["namespace"], "revision": 1}
            return f"{args.inputs['namespace']}/{args.inputs['name']}", outputs
        if args.name == "cilium-atomic":
            outputs["atomic"] = False  # what its create answers: a first install is not atomic
        if args.typ == SERVICE and args.inputs.get("spec", {}).get("type") == "LoadBalancer":
            # What the LB-IPAM pool gives once the Service exists (pulumi-kubernetes awaits it).
            outputs["status"] = {"loadBalancer": {"ingress": [{"ip": LB_ADDRESS}]}}
            return "kube-system/hubble-ui-lb", outputs
        return f"{args.name}-id", outputs

    def call(self, args):
        return {}


class StandIn(pulumi.CustomResource):
    """Bootstrap/Kubeconfig as the cluster component makes them (their own tests cover them)."""
    kubeconfig: pulumi.Output[str]

    def __init__(self, type_: str, name: str):
        super().__init__(type_, name, {"kubeconfig": None})


@dataclass
class Run:
    sent: list
    address: object
    addons: ClusterAddons

    def registered(self):
        """(type, name) of every resource registered or read, the stand-ins and provider left out."""
        return {(s.kind, s.type, s.name) for s in self.sent
                if not s.type.startswith(("test:", "pulumi:", "talos-proxmox:"))}

    def one(self, type_, name):
        found = [s for s in self.sent if s.type == type_ and s.name == name]
        assert len(found) == 1, (type_, name, found)
        return found[0]

    def urn(self, name):
        return next(s.urn for s in self.sent if s.name == name)


def stack(name="test-cluster", **sections):
    raw = copy.deepcopy(stack_file_config(str(STACKS / f"Pulumi.{name}.yaml")))
    for key, value in sections.items():
        raw[key] = {**(raw.get(key) or {}), **value}
    return load_settings(raw)


def run(settings, with_kubeconfig=True) -> Run:
    mocks = Mocks()
    monitor = RecordingMonitor(mocks)
    runtime_settings.ROOT.set(None)
    pulumi.runtime.set_mocks(mocks, project="talos-proxmox", stack="test", preview=False, monitor=monitor)
    made = {}

    @pulumi.runtime.test
    def program():
        bootstrap = StandIn("test:index:Bootstrap", "bootstrap")
        kubeconfig = StandIn("test:index:Kubeconfig", "kubeconfig")
        provider = k8s.Provider("k8s", kubeconfig=pulumi.Output.secret(kubeconfig.kubeconfig))
        addons = ClusterAddons("addons", settings, provider, depends_on=[bootstrap, kubeconfig],
                               # Passed plain: the health resource itself must keep it secret.
                               kubeconfig=kubeconfig.kubeconfig if with_kubeconfig else None)
        made["addons"] = addons
        return addons.hubble_ui_address.apply(lambda a: made.update(address=a))

    program()
    return Run(monitor.sent, made["address"], made["addons"])


def test_seed_stack_installs_cilium_and_ccm_after_bootstrap_and_kubeconfig():
    r = run(stack())
    assert r.registered() == {("register", RELEASE, "cilium"), ("register", RELEASE, "talos-ccm"),
                              ("register", HEALTH, "health"), ("register", DYNAMIC, "cilium-atomic")}
    provider_urn = r.urn("k8s")
    bootstrap, kubeconfig = r.urn("bootstrap"), r.urn("kubeconfig")

    cilium = r.one(RELEASE, "cilium")
    assert (cilium.inputs["name"], cilium.inputs["chart"], cilium.inputs["version"], cilium.inputs["namespace"]) == (
        "cilium", "cilium", "1.19.6", "kube-system")
    assert cilium.inputs["repositoryOpts"] == {"repo": "https://helm.cilium.io"}
    assert cilium.inputs["values"] == seed_cilium_values()
    # Not atomic on its first install (a failed one would be uninstalled with the network); atomic
    # upgrades once Helm has it deployed (tests/providers/test_helm_release_mode.py)
    atomic = r.one(DYNAMIC, "cilium-atomic")
    assert cilium.inputs["atomic"] is False and atomic.urn in cilium.dependencies
    assert (atomic.inputs["namespace"], atomic.inputs["release"]) == ("kube-system", "cilium")
    assert atomic.inputs["release_sha256"] == release_sha256("cilium", "1.19.6", seed_cilium_values(),
                                                            "https://helm.cilium.io")
    assert "kubeconfig" in atomic.secret_inputs and {bootstrap, kubeconfig} <= set(atomic.dependencies)
    assert {bootstrap, kubeconfig} <= set(cilium.dependencies)
    assert cilium.provider.startswith(provider_urn + "::")

    ccm = r.one(RELEASE, "talos-ccm")
    assert (ccm.inputs["name"], ccm.inputs["chart"], ccm.inputs["version"], ccm.inputs["namespace"]) == (
        "talos-cloud-controller-manager", "oci://ghcr.io/siderolabs/charts/talos-cloud-controller-manager",
        "0.5.4", "kube-system")
    assert "repositoryOpts" not in ccm.inputs
    assert ccm.inputs["values"] == seed_ccm_values()
    assert {bootstrap, kubeconfig} <= set(ccm.dependencies)
    assert cilium.urn not in ccm.dependencies  # side by side on purpose (see components/addons.py)
    assert ccm.provider.startswith(provider_urn + "::")

    health = r.one(HEALTH, "health")
    assert {bootstrap, kubeconfig, cilium.urn, ccm.urn} <= set(health.dependencies)
    assert (health.inputs["expected_nodes"], health.inputs["timeout_seconds"]) == (9, 600)
    assert health.inputs["triggers"] == [1, 1]  # the releases' revisions
    assert "kubeconfig" in health.secret_inputs

    assert r.address == "http://hubble-ui.kube-system.svc.cluster.local:80"
    assert r.addons.hubble_ui_service is None


def test_each_release_waits_as_long_as_its_section_says():
    default = run(stack())
    assert {default.one(RELEASE, name).inputs["timeout"] for name in ("cilium", "talos-ccm")} == {600}
    tuned = run(stack(cilium={"timeoutSeconds": 1800}, ccm={"timeoutSeconds": 120}))
    assert (tuned.one(RELEASE, "cilium").inputs["timeout"], tuned.one(RELEASE, "talos-ccm").inputs["timeout"]) == (
        1800, 120)
    assert tuned.one(RELEASE, "cilium").inputs["cleanupOnFail"] is True


def test_hubble_off_removes_only_hubble():
    on, off = run(stack()), run(stack(hubble={"enabled": False}))
    assert on.registered() == off.registered()
    on_values, off_values = on.one(RELEASE, "cilium").inputs["values"], off.one(RELEASE, "cilium").inputs["values"]
    assert off_values["hubble"] == {"enabled": False}
    assert {k: v for k, v in on_values.items() if k != "hubble"} == {k: v for k, v in off_values.items() if k != "hubble"}
    assert off.one(RELEASE, "talos-ccm").inputs == on.one(RELEASE, "talos-ccm").inputs
    assert off.address is None


def test_load_balancer_ui_gets_a_pool_after_cilium_then_its_own_service():
    """Pool and L2 policy after the release (the operator registers their CRDs), the Service after the pool;
    a Service that never gets an address fails alone, with Cilium installed."""
    lb = run(stack(hubble={"uiServiceType": "LoadBalancer"}, cilium={"loadBalancerAddresses": ["10.255.200.240/29"]}))
    cilium = lb.one(RELEASE, "cilium")
    pool = lb.one(CUSTOM_TYPES[0], "cilium-CiliumLoadBalancerIPPool")
    policy = lb.one(CUSTOM_TYPES[1], "cilium-CiliumL2AnnouncementPolicy")
    assert (pool.inputs["apiVersion"], pool.inputs["spec"]) == ("cilium.io/v2", {"blocks": [{"cidr": "10.255.200.240/29"}]})
    assert (policy.inputs["apiVersion"], policy.inputs["spec"]) == (
        "cilium.io/v2alpha1", {"loadBalancerIPs": True, "externalIPs": True})
    assert cilium.urn in pool.dependencies and cilium.urn in policy.dependencies
    service = lb.one(SERVICE, "hubble-ui-lb")
    assert service.kind == "register"
    assert {cilium.urn, pool.urn, policy.urn} <= set(service.dependencies)
    assert service.inputs["spec"]["type"] == "LoadBalancer"
    assert service.provider.startswith(lb.urn("k8s") + "::")
    assert cilium.inputs["values"]["hubble"]["ui"] == {"enabled": True}
    assert lb.address == f"http://{LB_ADDRESS}:80"

    off = run(stack(hubble={"uiServiceType": "LoadBalancer", "enabled": False},
                    cilium={"loadBalancerAddresses": ["10.255.200.240/29"]}))
    assert lb.registered() - off.registered() == {("register", SERVICE, "hubble-ui-lb")}
    assert off.registered() - lb.registered() == set()


def test_node_port_ui_exports_a_node_address_without_a_lookup():
    r = run(stack(hubble={"uiServiceType": "NodePort"}))
    assert not [s for s in r.sent if s.type == SERVICE]
    assert r.address == "http://10.255.200.201:31235"


def test_ccm_off_removes_only_the_ccm_release():
    on, off = run(stack()), run(stack(ccm={"enabled": False}))
    assert on.registered() - off.registered() == {("register", RELEASE, "talos-ccm")}
    assert off.registered() - on.registered() == set()
    assert off.one(RELEASE, "cilium").inputs == on.one(RELEASE, "cilium").inputs
    assert off.one(HEALTH, "health").inputs["triggers"] == [1]
    assert on.one(RELEASE, "talos-ccm").urn not in off.one(HEALTH, "health").dependencies


def test_health_wait_follows_settings_and_needs_the_kubeconfig():
    assert ("register", HEALTH, "health") not in run(stack(health={"wait": False})).registered()
    without = run(stack(), with_kubeconfig=False)
    assert without.addons.health is None
    assert ("register", HEALTH, "health") not in without.registered()


def test_dev_stack_has_no_ccm_and_no_kubespan_mtu():
    r = run(stack("dev"))
    assert r.registered() == {("register", RELEASE, "cilium"), ("register", HEALTH, "health"),
                              ("register", DYNAMIC, "cilium-atomic")}
    values = r.one(RELEASE, "cilium").inputs["values"]
    assert "MTU" not in values and values["k8sServicePort"] == 7445
    assert r.one(HEALTH, "health").inputs["expected_nodes"] == 2
