"""`pulumi up` in-process: the SDK's mocks with the engine's steps for dynamic resources done for real.

A model of the engine, kept only for what the real one (the engine tier, tests/engine/ and
tests/test_engine_*.py) cannot reach here yet: stacks with Cilium, the CCM and the health wait (the
Kubernetes provider plugin at our pin is not served by the module proxy), a cluster made by the previous
release of this program, Talos 1.14 and the data-disk refusals (tests/test_end_to_end_*.py). A scenario
the engine tier covers is not kept here.

For each `pulumi-python:dynamic:Resource` the program registers, `DeploymentMonitor` does what the
engine and the Python dynamic-provider host (pulumi/dynamic/__main__.py) do together:
  - at most four steps run at once (HOST_WORKERS), as the host serves them from a pool of four
    threads: a step that waits holds one;
  - the provider is unpickled from the `__provider` input as the host does (dill under the SDK's
    deserialization context) and configured with the stack config;
  - inputs reach it without secret markers (the host's Configure answers acceptSecrets=False, so
    the engine strips them), `__provider` included, null inputs left out;
  - check(old inputs, new inputs), then create for a URN the previous run did not leave, else
    diff(id, old outputs, checked inputs) and update(id, old outputs, checked inputs) when it reports
    changes; no changes keeps the old outputs;
  - outputs come back with `__provider` added, and secret where the input of the same name was
    secret or the resource lists them in additional_secret_outputs, as the engine marks them.
State (id, checked inputs, outputs, dependencies) is kept by URN in `state` as the engine stores it
(through protobuf: tuples come back as lists, ints as floats); pass it as `previous` to the next run.
It starts as `previous` and each step replaces its resource's entry, so after a failed run it holds
what the failed run finished plus what it never reached, as the engine's snapshot does.
With `preview=True` (run_program(preview=True), as `pulumi preview` and the preview `pulumi up` starts
with): values not known yet reach check and diff as `pulumi.output.Unknown`, as the host deserializes
them; nothing is created or updated, a planned create or update answers its checked inputs (the
outputs it computes stay unknown) and `state` is left as `previous` was.
After the program, `delete_unregistered()` deletes what the previous run left and this one did not
register, as the engine does at the end of a deployment: delete(id, old outputs), each resource
before those it depends on; skipped in a preview, which only plans them.
Replacements are not emulated (a run that needs one fails): the engine tier runs them
(tests/test_engine_vm_replacement.py).
Proxmox, Kubernetes and Helm resources are echoed as tests/mocked_program.py does; they are kept in
`state` (their inputs, no outputs) so that their deletes are steps too, in dependency order (a
removed node's VM after its lifecycle), and `on_echo(type, name, old inputs or None, new inputs or
None)` hears of each create, update and delete, as their provider would (StandInCluster has the PVE
stand-in make, change or destroy the VM).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import functools
import json
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import dill
import grpc
import pulumi
import pytest
import yaml
from pulumi.dynamic import Config, ConfigureRequest, ResourceProvider
from pulumi.runtime import rpc
from pulumi.runtime import settings as runtime_settings
from pulumi.runtime._serialization import _deserialize
from pulumi.runtime.sync_await import _sync_await

from talos_proxmox.commands import render
from talos_proxmox.day_two import node_removal, rolling
from talos_proxmox.talos_config import secrets_bundle
from talos_proxmox.settings.stack import PROJECT
from talos_proxmox.talos_api import operations
from talos_proxmox.talos_api.generated.machine import machine_pb2
from talos_proxmox.talos_api.retry import Backoff
from tests.factory_stand_in import StandInFactory
from tests.kube_stand_in import StandInApi, coredns, node as k8s_node, workload_pod
from tests.mocked_program import PROVIDER_KEY, ProgramRun, RecordingMocks, RecordingMonitor, run_program, stack_config
from tests.pve_stand_in import ProxmoxStandIn, serve_proxmox
from tests.talos_api_server import FakeTalosNode, RecordedCall

DYNAMIC_TYPE = "pulumi-python:dynamic:Resource"
HOST_WORKERS = 4  # pulumi/dynamic/__main__.py: grpc.server(ThreadPoolExecutor(max_workers=4))
VM_TYPE = "proxmoxve:index/vmLegacy:VmLegacy"


@dataclass(frozen=True)
class ResourceState:
    urn: str
    id: str
    inputs: dict  # as checked, plain values, with __provider
    outputs: dict  # plain values, with __provider
    secret_outputs: frozenset  # the output names the engine marks secret
    dependencies: tuple = ()  # URNs this resource depends on (explicit and through its inputs)
    dynamic: bool = True  # False: an echoed resource, kept for its delete step only


@dataclass(frozen=True)
class Step:
    urn: str
    name: str
    op: str  # "create", "update", "same", "delete"
    at: float = field(default_factory=time.monotonic, compare=False)  # when it finished


class EngineError(Exception):
    """What `pulumi up` would report for a resource: a check failure or a provider error."""


def stored(properties: dict) -> dict:
    """`properties` as they come back from the engine's state: serialized to protobuf and back."""
    return rpc.deserialize_properties(_sync_await(rpc.serialize_properties(properties, {})))


def load_provider(serialized: str, config: Mapping[str, Any]) -> ResourceProvider:
    """The provider behind a dynamic resource, unpickled and configured as the dynamic-provider host does."""
    provider = _deserialize(lambda: dill.loads(base64.b64decode(serialized)))
    provider.configure(ConfigureRequest(config=Config(raw_config=dict(config), project_name=PROJECT)))
    return provider


class _DeploymentMocks(RecordingMocks):
    def __init__(self, monitor: "DeploymentMonitor") -> None:
        self.monitor = monitor

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        if args.typ == DYNAMIC_TYPE:
            return self.monitor.step(args)
        id_, outputs = super().new_resource(args)
        self.monitor.echoed(id_, args)
        return id_, outputs


class DeploymentMonitor(RecordingMonitor):
    """A resource monitor for run_program(monitor=...) that deploys dynamic resources (see module doc)."""

    def __init__(self, config: Optional[Mapping[str, Any]] = None,
                 previous: Optional[Mapping[str, ResourceState]] = None, preview: bool = False,
                 on_echo: Optional[Callable[[str, str, Optional[dict], dict], None]] = None):
        super().__init__(_DeploymentMocks(self))
        self.on_echo = on_echo
        self.config = dict(config or {})  # full keys (`<namespace>:<key>`) as the engine sends them
        self.previous = dict(previous or {})
        self.preview = preview
        self.state: dict[str, ResourceState] = dict(self.previous)
        self.steps: list[Step] = []
        self._providers: dict[str, ResourceProvider] = {}
        self._request = threading.local()  # the RegisterResource request being served on this thread
        self._state_lock = threading.Lock()
        self._in_flight = threading.Condition()
        self._steps_running = 0
        self._host_workers = threading.BoundedSemaphore(HOST_WORKERS)

    def RegisterResource(self, request):
        self._request.current = request
        try:
            return super().RegisterResource(request)
        finally:
            self._request.current = None

    def _provider(self, serialized: str) -> ResourceProvider:
        with self._state_lock:  # one instance per pickled provider, as the host caches them
            if serialized not in self._providers:
                self._providers[serialized] = load_provider(serialized, self.config)
            return self._providers[serialized]

    def state_named(self, name: str) -> ResourceState:
        [found] = [s for s in self.state.values() if s.urn.endswith(f"::{name}")]
        return found

    def echoed(self, id_: str, args: pulumi.runtime.MockResourceArgs) -> None:
        """Keep an echoed (non-dynamic) resource in state, so that removing it is a delete step, and tell
        `on_echo` what its provider would be asked to do; a replacement as the module doc says."""
        request = getattr(self._request, "current", None)  # None for a read (`Resource.get`)
        if request is None or not request.custom:
            return
        urn = self.make_urn(request.parent, request.type, request.name)
        old = self.previous.get(urn)
        inputs = {key: rpc.unwrap_rpc_secret(value) for key, value in args.inputs.items()}
        changed = [path for path in request.replaceOnChanges
                   if old is not None and _at(old.inputs, path) != _at(inputs, path)]
        if changed:
            raise EngineError(f"{urn}: {changed} changed: a replacement is not emulated here "
                              "(the engine tier runs them: tests/test_engine_vm_replacement.py)")
        if self.preview:
            return
        self._echo(request.type, request.name, dict(old.inputs) if old else None, inputs)
        with self._state_lock:
            self.state[urn] = ResourceState(urn, id_, inputs, {}, frozenset(), tuple(request.dependencies),
                                            dynamic=False)

    def _echo(self, type_: str, name: str, old: Optional[dict], new: Optional[dict]) -> None:
        if self.on_echo is not None:
            self.on_echo(type_, name, old, new)

    def step(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        with self._in_flight:
            self._steps_running += 1
        try:
            with self._host_workers:
                return self._step(args)
        finally:
            with self._in_flight:
                self._steps_running -= 1
                self._in_flight.notify_all()

    def wait_for_steps(self, timeout: float = 60.0) -> None:
        """Block until no step is running, as the engine lets the steps under way finish after a failure."""
        with self._in_flight:
            if not self._in_flight.wait_for(lambda: self._steps_running == 0, timeout):
                raise EngineError(f"steps still running after {timeout:g}s")

    def _step(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        request = self._request.current
        urn = self.make_urn(request.parent, request.type, request.name)
        secret = {key for key, value in args.inputs.items() if rpc.is_rpc_secret(value)}
        secret |= set(request.additionalSecretOutputs)
        news = {key: rpc.unwrap_rpc_secret(value) for key, value in args.inputs.items()}
        provider = self._provider(news[PROVIDER_KEY])
        old = self.previous.get(urn)
        try:
            checked = provider.check(dict(old.inputs) if old else {}, dict(news))
            if checked.failures:
                raise EngineError(f"{urn}: check failed: "
                                  + "; ".join(f"{f.property}: {f.reason}" for f in checked.failures))
            inputs = {**checked.inputs, PROVIDER_KEY: news[PROVIDER_KEY]}
            if old is None and self.preview:
                op, id_, outputs = "create", "", dict(inputs)
            elif old is None:
                op, created = "create", provider.create(dict(inputs))
                id_, outputs = created.id, created.outs or {}
            else:
                diff = provider.diff(old.id, dict(old.outputs), dict(inputs))
                if diff.replaces:
                    raise EngineError(f"{urn}: diff asks to replace {diff.replaces}; this stand-in does not replace")
                changed = diff.changes if diff.changes is not None else old.inputs != inputs
                if changed and self.preview:
                    op, id_, outputs = "update", old.id, dict(inputs)
                elif changed:
                    op, id_ = "update", old.id
                    outputs = provider.update(old.id, dict(old.outputs), dict(inputs)).outs or {}
                else:
                    op, id_, outputs = "same", old.id, dict(old.outputs)
        except EngineError:
            raise
        except Exception as exc:  # the engine reports a provider error against the resource
            raise EngineError(f"{urn}: {type(exc).__name__}: {exc}") from exc
        outputs = {**outputs, PROVIDER_KEY: inputs[PROVIDER_KEY]}
        with self._state_lock:
            if not self.preview:
                self.state[urn] = ResourceState(urn, id_, stored(inputs), stored(outputs),
                                                frozenset(secret & set(outputs)), tuple(request.dependencies))
            self.steps.append(Step(urn, request.name, op))
        return id_, {key: rpc.wrap_rpc_secret(value) if key in secret else value for key, value in outputs.items()}

    def delete_unregistered(self) -> None:
        """The end of a deployment: delete each resource of `previous` that this run did not register,
        each before the resources it depends on."""
        registered = {r.urn for r in self.registrations}
        for urn in deletion_order(self.previous, [urn for urn in self.previous if urn not in registered]):
            old = self.previous[urn]
            if not self.preview:
                if old.dynamic:
                    try:
                        load_provider(old.outputs[PROVIDER_KEY], self.config).delete(old.id, dict(old.outputs))
                    except Exception as exc:
                        raise EngineError(f"{urn}: delete failed: {type(exc).__name__}: {exc}") from exc
                else:
                    self._echo(urn.split("::")[2].rsplit("$", 1)[-1], urn.rsplit("::", 1)[1], dict(old.inputs), None)
                del self.state[urn]
            self.steps.append(Step(urn, urn.rsplit("::", 1)[1], "delete"))


def _at(properties: Mapping[str, Any], path: str) -> Any:
    """The value at a replaceOnChanges path such as `networkDevices[0].macAddress` (None if absent)."""
    value: Any = properties
    for part in path.replace("]", "").replace("[", ".").split("."):
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def deletion_order(state: Mapping[str, ResourceState], urns: list[str]) -> list[str]:
    """`urns` ordered so that each comes before every resource (of `urns`) it depends on."""
    doomed, order, seen = set(urns), [], set()

    def visit(urn: str) -> None:  # post-order over "is depended on by": dependents land first
        if urn in seen:
            return
        seen.add(urn)
        for other in urns:
            if urn in state[other].dependencies:
                visit(other)
        order.append(urn)

    for urn in reversed(urns):
        visit(urn)
    return [urn for urn in order if urn in doomed]


# --- the far side of an end-to-end `pulumi up`, and one `up` (its preview first) at a time ----------

STACK = "e2e"
TALOS_API_PORT = 50000
FAST = Backoff(initial=0.05, factor=1.5, maximum=0.2)
# Where the e2e stacks' etcd snapshots go: outside the checkout, one directory per test process.
SNAPSHOT_DIR = tempfile.mkdtemp(prefix="e2e-etcd-snapshots-")
REACH_TIMEOUT = 1.0  # how long an unanswering node is tried before it counts as gone (real: a minute)


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


def engine_config(config: dict) -> dict:
    return {f"{PROJECT}:{key}": json.dumps(value) for key, value in config.items()}


def rendered_configs(config: dict, secrets_yaml: str, directory: Path) -> dict[str, bytes]:
    """What `python -m talos_proxmox.commands.render --stack e2e --secrets <bundle>` writes for each node."""
    stacks, out = directory / "stacks", directory / "out"
    stacks.mkdir(parents=True)
    (stacks / f"Pulumi.{STACK}.yaml").write_text(
        yaml.safe_dump({"config": {f"{PROJECT}:{k}": v for k, v in config.items()}}))
    (directory / "secrets.yaml").write_text(secrets_yaml)
    assert render.main(["--stack", STACK, "--out", str(out), "--secrets", str(directory / "secrets.yaml"),
                        "--stacks-dir", str(stacks)]) == 0
    return {node["name"]: (out / f"{node['name']}.yaml").read_bytes() for node in config["nodes"]}


@dataclass
class Up:
    """One `pulumi up`: its preview (the plan, and how many calls each node and the factory had received
    after it), what the user sees (exports, steps, the error of a failed up) and what each node had
    received by its end."""

    plan: DeploymentMonitor
    after_preview: dict[str, int]
    run: ProgramRun
    monitor: DeploymentMonitor
    config: dict
    calls: dict[str, list[RecordedCall]]
    modes: dict[str, str]
    rendered: dict[str, bytes]
    pve_requests: int  # how many requests the Proxmox stand-in had received by its end
    error: Optional[BaseException] = None

    def steps(self, op: str) -> set[str]:
        return {step.name for step in self.monitor.steps if step.op == op}

    def new_calls(self, before: "Up", name: str) -> list[RecordedCall]:
        """What node `name` received during this up (its preview included) and not by the end of `before`."""
        return self.calls[name][len(before.calls[name]):]


class StandInCluster:
    """The factory stand-in, the Proxmox stand-in and one FakeTalosNode per node [(name, role, ip)] on
    ip:50000, in maintenance mode until configured, running in the VM its VmLegacy makes. The control
    planes share one etcd member list, as one etcd cluster does: a member that leaves, or is removed
    through any of them, is gone for all."""

    def __init__(self, factory: StandInFactory, pve: ProxmoxStandIn, nodes, talos_version: str,
                 render_dir: Callable[[], Path], install_seconds: float = 0.2):
        self.factory, self.pve, self.render_dir = factory, pve, render_dir
        self.monitors: list[DeploymentMonitor] = []
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
        # The cluster's Kubernetes API: each control plane's kubeconfig reaches it; every node runs one
        # workload pod, which a drain evicts; a removed node's Node object can be deleted.
        self.kube = StandInApi([([k8s_node(name, True, control_plane=role == "controlplane")
                                  for name, role, _ in nodes], coredns(2))])
        self.kube.pods = [workload_pod(f"app-{name}", name) for name, _, _ in nodes]
        self.kube.deletable = {name for name, _, _ in nodes}
        for name, role, _ in nodes:  # what a healthy node reports once the cluster runs
            fake = self.nodes[name]
            if role == "controlplane":
                fake.kubeconfig_yaml = self.kube.kubeconfig()
            fake.etcd_members = list(members) if role == "controlplane" else []
            fake.services = [s for s in fake.services if role == "controlplane" or s.id != "etcd"]
            if role == "controlplane":
                fake.behaviours.update(EtcdLeaveCluster=self._leave, EtcdRemoveMemberByID=self._remove)
            fake.behaviours["ApplyConfiguration"] = functools.partial(self._apply, role)
        self._next_member_id = 0x100 + len(nodes)

    def _trustd(self) -> tuple[bytes, bytes]:
        # trustd on the control planes signs a joining worker's apid certificate with the OS CA
        return secrets_bundle.ca_pair(self.monitors[0].state_named("secrets").outputs["bundle"], "os")

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
        if first:
            self.kube.deletable.add(node.hostname)
        return response

    def _vm_step(self, type_: str, name: str, old: Optional[dict], new: Optional[dict]) -> None:
        """What the Proxmox provider does with a node's VmLegacy: a create starts the VM the node runs
        in (a node whose VM went boots the ISO afresh in the new one); an update of a running VM with
        `rebootAfterUpdate: false` PUTs the changed hardware, which PVE keeps pending until the VM's next
        power cycle; a delete stops the VM, its node with it, and destroys it."""
        if type_ != VM_TYPE:
            return
        if new is None:
            self.pve.destroy(int(old["vmId"]))
            return
        hardware = _vm_hardware(new)
        if old is None:
            guest = self.nodes[name]
            if not guest.is_up:
                guest.boot_from_iso()
            self.pve.run_guest(int(new["vmId"]), name, guest, host=new["nodeName"], config=hardware)
            return
        assert new["rebootAfterUpdate"] is False, name  # else the provider would reboot every changed VM now
        changed = {key: value for key, value in hardware.items() if _vm_hardware(old)[key] != value}
        if changed:
            self.pve.vm_changed(int(old["vmId"]), changed)

    def counts(self) -> dict[str, int]:
        return {"factory": len(self.factory.requests), "pve": len(self.pve.requests),
                **{n: len(f.calls) for n, f in self.nodes.items()}}

    def up(self, config: dict, *, fails: bool = False) -> Up:
        """`pulumi up` of `config` after the last up: its preview, then the up itself. An up that fails
        raises, unless `fails` (then the error is in Up.error and the state is what the engine keeps)."""
        previous = self.monitors[-1].state if self.monitors else None
        proxmox = self.pve.provider_config()  # `pulumi config set --secret proxmoxve:apiToken ...`
        engine = {**engine_config(config), **proxmox}
        program = dict(stack=STACK, other_config=proxmox, secret_keys=["proxmoxve:apiToken"])
        plan = DeploymentMonitor(engine, previous=previous, preview=True)
        try:
            run_program(config, preview=True, monitor=plan, **program)
        except Exception as exc:  # noqa: BLE001 - a failed preview: `pulumi up` stops before changing anything
            if not fails:
                raise
            abandon_pending_tasks()
            plan.wait_for_steps()
            return Up(plan, self.counts(), exc.program_run, plan, config,  # type: ignore[attr-defined]
                      {n: list(f.calls) for n, f in self.nodes.items()}, {n: f.mode for n, f in self.nodes.items()},
                      {}, len(self.pve.requests), exc)
        plan.delete_unregistered()
        after_preview = self.counts()
        monitor = DeploymentMonitor(engine, previous=previous, on_echo=self._vm_step)
        self.monitors.append(monitor)
        error = None
        try:
            run = run_program(config, monitor=monitor, **program)
            monitor.delete_unregistered()
        except Exception as exc:  # noqa: BLE001 - what `pulumi up` would print
            if not fails:
                raise
            run, error = exc.program_run, exc  # type: ignore[attr-defined]
            abandon_pending_tasks()  # the program is over: nothing it still awaited registers now
            monitor.wait_for_steps()
        assert not fails or error is not None, "expected this up to fail"
        secrets_yaml = monitor.state_named("secrets").outputs["secrets_yaml"]
        return Up(plan, after_preview, run, monitor, config, {n: list(f.calls) for n, f in self.nodes.items()},
                  {n: f.mode for n, f in self.nodes.items()},
                  rendered_configs(config, secrets_yaml, self.render_dir()), len(self.pve.requests), error)

    def stop(self) -> None:
        for fake in self.nodes.values():
            fake.stop()
        if hasattr(self, "kube"):
            self.kube.close()


def _vm_hardware(inputs: dict) -> dict:
    """A VmLegacy's cores, memory and CPU type as PVE config keys."""
    return {"cores": int(inputs["cpu"]["cores"]), "memory": int(inputs["memory"]["dedicated"]),
            "cpu": inputs["cpu"]["type"]}


def _quiet_about_reported_failures(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """The failed program's outputs still hold its error when they are collected; it was reported."""
    if not isinstance(context.get("exception"), EngineError):
        loop.default_exception_handler(context)


def abandon_pending_tasks() -> None:
    """Drop what a failed program left behind, as the language host's exit would, so that it cannot
    surface in the next run: tasks still waiting on the SDK's event loop, and the failed outputs the
    SDK keeps in its settings (set_mocks does not reset that set)."""
    loop = asyncio.get_event_loop()
    loop.set_exception_handler(_quiet_about_reported_failures)
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    with runtime_settings.SETTINGS.lock:
        runtime_settings.SETTINGS.outputs.clear()


@contextlib.contextmanager
def e2e_cluster(nodes, talos_version: str, tmp_path_factory, install_seconds: float = 0.2) -> Iterator[StandInCluster]:
    """A StandInCluster for a module's ups, with retries made fast; skips where 127.0.0.x cannot be bound.
    `install_seconds`: how long each node takes from its first apply to answering configured."""
    with StandInFactory() as factory, serve_proxmox() as pve, pytest.MonkeyPatch.context() as patch:
        patch.setattr(operations, "DEFAULT_BACKOFF", FAST)
        patch.setattr(rolling, "DEFAULT_BACKOFF", FAST)
        patch.setattr(node_removal, "REACH_TIMEOUT", REACH_TIMEOUT)
        try:
            cluster = StandInCluster(factory, pve, nodes, talos_version, lambda: tmp_path_factory.mktemp("render"),
                                     install_seconds)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:  # e.g. macOS, where only 127.0.0.1 is configured
                pytest.skip(f"cannot listen on 127.0.0.x:{TALOS_API_PORT} here ({exc})")
            raise
        try:
            yield cluster
        finally:
            cluster.stop()
