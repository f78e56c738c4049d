"""Faults: an interrupted or failing `pulumi up` never leaves the cluster worse, and the next up finishes.

The table runs in one engine cluster (real CLI, real Proxmox and Kubernetes plugins, real control plane;
three control planes and a worker). Each row is an operation and a fault injected into it:
  kill         the CLI killed with SIGKILL (its process group) when the engine starts a step; then
               `pulumi cancel` (the lock the killed run left: the CLI asks for exactly that), then `up`;
  pve          PVE answers one call with one of its real errors (fakepve's catalogue), a task that fails, or
               an answer later than the caller waits (the call done all the same);
  talos        a node answers one call with an error, holds it longer than the caller waits, or loses power
               as it arrives (back a few seconds later, nothing of the call done);
  kubernetes   the API server stops answering for a while (SIGSTOP) during a drain.
After the faulted up, the invariants are checked on the stand-ins' records: never two control planes down at
once, every control plane still an etcd member, one bootstrap ever, every VM in Pulumi's state and every
configured node in a VM, no secret in anything the CLI printed or the state holds. Then the fault is
cleared, the next `pulumi up` runs, and the far side must be exactly what a clean run of the same operation
left (fingerprint(): the VMs, each node's mode, version and config, etcd, the Kubernetes Nodes, the state's
resources).

Operations: the first deploy; a Talos roll, which toggles between v1.13.7 and v1.13.8 (allowDowngrade on,
so that each row starts where the last ended); a Kubernetes roll, one patch release up each time (Kubernetes
never goes down; the fingerprint reads each config with the Kubernetes version masked); a hardware roll, which
toggles every node between 2 and 3 cores; a worker added and removed; the worker moved to a new VM (its
vmId toggles between two); last, the teardown (`pulumi destroy` with deletionProtection off, and the next
`pulumi destroy` must leave no VM, no running node and an empty state; a teardown lets nodes go down by design,
so its rows are held to every invariant but the control-plane and etcd ones). CI runs the rows below, a slice;
`FAULT_TABLE=full` adds one row per step boundary, PVE call and Talos call a clean run of each operation but
the first deploy and the teardown made (see the README's "Faults"), which takes hours; `FAULT_TABLE=add,remove`
adds those of the operations named.
Before the teardown, two `pulumi up` of the stack at once: the second is refused by the backend's lock and does
nothing; and a roll asked at once of the stack and of a copy of it on another backend (its state imported
there): the cluster's operations lock, across processes, keeps it to one node down at a time, and both finish.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import grpc
import pytest

from tests.engine.cluster import EngineCluster, EngineUp, engine_cluster, engine_stack, secret_texts
from tests.engine.pulumi_cli import CliRun, PulumiProject
from tests.stand_ins.talos_api import FakeTalosNode

pytestmark = pytest.mark.engine

CP1, CP2, CP3, WORKER, ADDED = ("fault-cp-1", "fault-cp-2", "fault-cp-3", "fault-worker-1", "fault-worker-2")
NODES = [(CP1, "controlplane", "127.0.0.102"), (CP2, "controlplane", "127.0.0.103"),
         (CP3, "controlplane", "127.0.0.104"), (WORKER, "worker", "127.0.0.105")]
WITH_ADDED = NODES + [(ADDED, "worker", "127.0.0.106")]
CONTROL_PLANES = (CP1, CP2, CP3)
VERSIONS = ("v1.13.7", "v1.13.8")
ADDED_VM = 9100 + 106  # e2e_config: VM ids follow the address
CP2_VM = 9100 + 103
CP3_VM = 9100 + 104
MOVED_WORKER_VM = 9200 + 105  # the worker's VM id once moved (e2e_config gives it 9100 + 105)
MORE_CORES = {"cpu": 3}  # the dev stack's nodes have 2
KUBERNETES = "1.36.2"  # the dev stack's
API_PAUSE_SECONDS = 15
NO_ANSWER_SECONDS = 35  # rolling.CALL_TIMEOUT is 30
PVE_HOLD_SECONDS = 35  # the day-two PVE client's is 30 (proxmox_api.access)
GONE_SECONDS = 10
VM_TYPE = "proxmoxve:index/vmLegacy:VmLegacy"  # what the program makes its VMs as (pulumi-proxmoxve 8)


@dataclass
class Fault:
    """One row: the operation it hits, the kind of fault, where, and how it is made."""
    operation: str  # "first deploy", "roll", "kubernetes", "hardware", "add", "remove", "move", "teardown"
    kind: str  # kill, pve, talos, kubernetes
    where: str
    arm: Callable[[EngineCluster], None] = lambda _cluster: None  # before the up
    kill_when: Optional[Callable[[dict], bool]] = None  # kill: the engine event to kill the CLI at
    disarm: Callable[[EngineCluster], None] = lambda _cluster: None  # after the faulted up
    next_up: tuple[str, ...] = ()  # options of the up that must finish the job


@dataclass
class Row:
    fault: Fault
    faulted: CliRun
    problems: list[str]  # invariants broken by the faulted up
    converged: bool  # the next up reached what a clean run reaches
    difference: dict = field(default_factory=dict)  # fingerprint keys that differ, when not converged
    restored: bool = False  # the kill cut the state file mid-write: restored from the CLI's backup first
    repaired: str = ""  # after a kill: a VM PVE made that was imported into its pending create
    next_run: Optional[CliRun] = None  # the up after it
    harness_errors: list[str] = field(default_factory=list)  # what the played kubelets could not do meanwhile


def step_starts(name: str, op: str) -> Callable[[dict], bool]:
    """An engine event: the step `op` of the custom resource `name` begins."""
    def starts(event: dict) -> bool:
        metadata = (event.get("resourcePreEvent") or {}).get("metadata") or {}
        return metadata.get("op") == op and metadata.get("urn", "").endswith(f"::{name}")
    return starts


def talos_error(node: str, rpc: str) -> Callable[[EngineCluster], None]:
    return lambda cluster: cluster.nodes[node].fail_next(rpc, grpc.StatusCode.UNAVAILABLE, "stand-in: injected")


def no_answer(node: str, rpc: str, seconds: float) -> Callable[[EngineCluster], None]:
    """Arm: `node` holds its next `rpc` for `seconds` (longer than the caller waits for one call), then does it."""
    def arm(cluster: EngineCluster) -> None:
        def holding(fake: FakeTalosNode, request, context):
            fake.behaviours.pop(rpc, None)
            time.sleep(seconds)
            return getattr(FakeTalosNode, "_rpc_" + rpc.replace("/", "_"))(fake, request, context)
        cluster.nodes[node].behaviours[rpc] = holding
    return arm


def gone_at(node: str, rpc: str, downtime: float) -> Callable[[EngineCluster], None]:
    """Arm: `node` drops off the network as its next `rpc` arrives (its power cut: nothing of the call is done)
    and comes back, as it was, `downtime` seconds later."""
    def arm(cluster: EngineCluster) -> None:
        def gone(fake: FakeTalosNode, request, context):
            fake.behaviours.pop(rpc, None)
            fake.reboot(downtime, after=0.0)
            time.sleep(downtime + 1)  # the connection is gone: whatever this answers reaches no one
            context.abort(grpc.StatusCode.UNAVAILABLE, "stand-in: the node lost power")
        cluster.nodes[node].behaviours[rpc] = gone
    return arm


def pause_api_on(node: str, rpc: str) -> tuple[Callable, Callable]:
    """Arm/disarm: when `node` receives `rpc`, the API server stops answering for API_PAUSE_SECONDS."""
    def arm(cluster: EngineCluster) -> None:
        def pausing(fake: FakeTalosNode, request, context):
            fake.behaviours.pop(rpc, None)
            cluster.kubernetes.kube.pause_api_server(API_PAUSE_SECONDS)
            return getattr(FakeTalosNode, "_rpc_" + rpc.replace("/", "_"))(fake, request, context)
        cluster.nodes[node].behaviours[rpc] = pausing

    return arm, lambda cluster: cluster.nodes[node].behaviours.pop(rpc, None)


api_paused, api_resumed = pause_api_on(WORKER, "LifecycleService/Upgrade")

# CI's slice: each kind of fault at least once, each operation at least once.
FIRST_DEPLOY_FAULT = Fault("first deploy", "kill", f"as the first apply of {CP2} begins",
                           kill_when=step_starts(f"apply-{CP2}", "create"))
ROLL_FAULTS = [
    Fault("roll", "kill", f"as {CP2}'s upgrade begins", kill_when=step_starts(f"lifecycle-{CP2}", "update")),
    Fault("roll", "talos", f"{CP2} answers its install (LifecycleService/Upgrade) UNAVAILABLE",
          arm=talos_error(CP2, "LifecycleService/Upgrade")),
    Fault("roll", "talos", f"{CP3} does not answer its install for {NO_ANSWER_SECONDS:g}s (longer than one call may take)",
          arm=no_answer(CP3, "LifecycleService/Upgrade", NO_ANSWER_SECONDS)),
    Fault("roll", "talos", f"{CP2} loses power as its image pull begins, back {GONE_SECONDS:g}s later",
          arm=gone_at(CP2, "ImageService/Pull", GONE_SECONDS)),
    Fault("roll", "kubernetes", f"the API server stops answering for {API_PAUSE_SECONDS}s as {WORKER}'s drain begins",
          arm=api_paused, disarm=api_resumed),
]
KUBERNETES_FAULTS = [
    Fault("kubernetes", "talos", f"{CP2} answers its first configuration change of the roll UNAVAILABLE",
          arm=talos_error(CP2, "ApplyConfiguration")),
    Fault("kubernetes", "kill", "as the Kubernetes upgrade begins", kill_when=step_starts("kubernetes-upgrade", "update")),
]
# PVE's start of a stopped VM fails its task: the roll stops with the node drained and powered off, its new
# hardware still pending. The next up must bring it back, with a plain up and after a refresh (which reads the
# VM as `started: false`, so that the Proxmox plugin starts it before the node's roll runs).
START_FAILS = f"{CP2}'s VM start task fails (QEMU exited with code 1)"
HARDWARE_FAULTS = [
    Fault("hardware", "kill", f"as {CP2}'s hardware roll begins", kill_when=step_starts(f"lifecycle-{CP2}", "update")),
    Fault("hardware", "pve", f"{START_FAILS}; then a plain up",
          arm=lambda cluster: cluster.pve.fail("POST", f"/nodes/pve/qemu/{CP2_VM}/status/start",
                                               error="qemu_exited_code", times=1)),
    Fault("hardware", "pve", f"{START_FAILS}; then `up --refresh`", next_up=("--refresh",),
          arm=lambda cluster: cluster.pve.fail("POST", f"/nodes/pve/qemu/{CP2_VM}/status/start",
                                               error="qemu_exited_code", times=1)),
    # PVE starts the VM after all, once the roll has given up on it: the next up finds it running
    Fault("hardware", "pve", f"PVE answers {CP3}'s VM start {PVE_HOLD_SECONDS}s late (longer than a call may take)",
          arm=lambda cluster: cluster.pve.hold("POST", f"/nodes/pve/qemu/{CP3_VM}/status/start", PVE_HOLD_SECONDS)),
]
MEMBERSHIP_FAULTS = [
    Fault("add", "pve", "the VM's create answers 500 (no quorum)",
          arm=lambda cluster: cluster.pve.fail("POST", "/nodes/pve/qemu", error="no_quorum", times=1)),
    Fault("remove", "pve", "the VM's destroy task fails (VM is locked (backup))",
          # the plugin's DELETE path ends with a slash (bpg's client), which PVE takes as the same path
          arm=lambda cluster: cluster.pve.fail("DELETE", f"/nodes/pve/qemu/{ADDED_VM}/", error="locked", times=1)),
    Fault("remove", "kill", f"as {ADDED}'s removal begins", kill_when=step_starts(f"lifecycle-{ADDED}", "delete")),
]


def import_made_vms(cluster: EngineCluster, project: PulumiProject) -> str:
    """README, "When an up fails": a VM that PVE made for a create the kill cut short is in no state, and the
    next up's create of its vmId would be refused, so the user imports it into the pending create
    (`pulumi refresh --import-pending-creates <urn> <vmid>`). Whether PVE got the create before the kill is a
    race (the plugin outlives the CLI); either way the next up must finish."""
    pending = [op["resource"] for op in project.export()["deployment"].get("pending_operations") or ()
               if op.get("type") == "creating" and op["resource"]["type"] == VM_TYPE]
    imported = []
    for resource in pending:
        vm_id = int(resource["inputs"]["vmId"])
        deadline = time.monotonic() + HOST_GRACE_SECONDS  # the plugin's create may still be on its way
        while vm_id not in {vm.vmid for vm in cluster.pve.vms} and time.monotonic() < deadline and any(
                b"pulumi-resource-proxmoxve" in arg for command in project_processes(project).values()
                for arg in command):
            time.sleep(0.5)
        if vm_id in {vm.vmid for vm in cluster.pve.vms}:
            project.cli("refresh", "--yes", "--skip-preview", "--stack", project.stack,
                        "--import-pending-creates", resource["urn"], str(vm_id))
            imported.append(str(vm_id))
    if not pending:
        return ""
    return f"VM {', '.join(imported)} imported into its pending create" if imported else "the VM was not made"


MOVE_FAULTS = [
    # the old VM is destroyed by then (delete before replace): the node is in no VM until the next up
    Fault("move", "kill", f"as {WORKER}'s new VM is made", kill_when=step_starts(WORKER, "create-replacement")),
    Fault("move", "pve", f"{WORKER}'s new VM's create answers 500 (no quorum)",
          arm=lambda cluster: cluster.pve.fail("POST", "/nodes/pve/qemu", error="no_quorum", times=1)),
]
TEARDOWN_FAULT = Fault("teardown", "kill", f"as {CP2}'s removal begins",
                       kill_when=step_starts(f"lifecycle-{CP2}", "delete"))
TORN_DOWN = {"vms": [], "talos": {}, "state": []}  # what a teardown leaves, of fingerprint()


class Table:
    """The cluster, the stack, and the operations as stack configs."""

    def __init__(self, cluster: EngineCluster, project: PulumiProject, tmp):
        self.cluster, self.project, self.tmp = cluster, project, tmp
        self.version, self.nodes, self.hardware, self.kubernetes = VERSIONS[0], NODES, None, KUBERNETES
        self.moved, self.protected = False, True
        self.lock_refused: Optional[tuple[CliRun, list[CliRun]]] = None  # (the up, the second up while it ran)
        self.two_stacks: Optional[tuple[CliRun, CliRun, int]] = None  # see rolled_from_two_stacks
        self.bootstraps_seen = 0
        self.rows: list[Row] = []
        self.references: dict[tuple, dict] = {}  # key() -> fingerprint after a clean run
        # operation -> (PVE requests, Talos calls by node, steps begun) of its first clean run
        self.recorded: dict[str, tuple] = {}
        self._runs = 0

    def config(self) -> dict:
        config = engine_stack(self.cluster, self.nodes, self.version, self.tmp / "secrets.yaml",
                              hardware=self.hardware, kubernetes_version=self.kubernetes)
        config["cluster"]["allowDowngrade"] = True
        config["cluster"]["deletionProtection"] = self.protected
        if self.moved:
            next(node for node in config["nodes"] if node["name"] == WORKER)["vmId"] = MOVED_WORKER_VM
        return config

    def target(self, operation: str) -> None:
        """Make the stack say what `operation` changes (from where the last up left it)."""
        if operation == "roll":
            self.version = VERSIONS[1 - VERSIONS.index(self.version)]
        elif operation == "kubernetes":
            major_minor, patch = self.kubernetes.rsplit(".", 1)
            self.kubernetes = f"{major_minor}.{int(patch) + 1}"
        elif operation == "hardware":
            self.hardware = None if self.hardware else MORE_CORES
        elif operation == "add":
            self.nodes = WITH_ADDED
        elif operation == "remove":
            self.nodes = NODES
        elif operation == "move":
            self.moved = not self.moved
        elif operation == "unprotect":
            self.protected = False
        self.project.set_config(self.config())

    def key(self) -> tuple:
        return self.version, bool(self.hardware), self.moved, tuple(name for name, _, _ in self.nodes)

    def clean(self, operation: str) -> EngineUp:
        self.target(operation)
        self._runs += 1
        pve_before = len(self.cluster.pve.requests)
        calls_before = {name: len(fake.calls) for name, fake in self.cluster.nodes.items()}
        up = self.cluster.deploy(self.project, self.config(), self.tmp / f"render-{self._runs}")
        self.references.setdefault(self.key(), fingerprint(self.cluster, self.project, self.kubernetes))
        self.recorded.setdefault(operation, (
            self.cluster.pve.requests[pve_before:],
            {name: fake.calls[calls_before[name]:] for name, fake in self.cluster.nodes.items()},
            up.up.started()))
        return up

    def ensure_before(self, operation: str) -> None:
        """A worker is added only to a cluster without it, removed only from one with it."""
        names = self.key()[-1]
        if operation == "add" and ADDED in names:
            self.clean("remove")
        elif operation == "remove" and ADDED not in names:
            self.clean("add")

    def rolled_from_two_stacks(self) -> tuple[CliRun, CliRun, int]:
        """The stack copied to a backend of its own (its state exported and imported there, the stack file
        shared: as a user who runs one cluster from a laptop and from CI does), then one roll asked of both at
        once: both ups, and the most nodes down at one moment meanwhile."""
        other = self.project.elsewhere("state-elsewhere")
        exported = self.project.cli("stack", "export", "--stack", self.project.stack).stdout
        other.cli("stack", "init", other.stack, "--secrets-provider", "passphrase")
        other.cli("stack", "import", "--stack", other.stack, stdin=exported)
        self.target("roll")
        started = time.monotonic()
        runs: dict[str, CliRun] = {}
        stacks = {"here": self.project, "elsewhere": other}
        ups = [threading.Thread(target=lambda place=place: runs.__setitem__(place, stacks[place].up(check=False)))
               for place in stacks]
        for up in ups:
            up.start()
        for up in ups:
            up.join()
        down = most_down_at_once(self.cluster.nodes, [name for name, _, _ in self.nodes], started)
        return runs["here"], runs["elsewhere"], down

    def faulted(self, fault: Fault) -> Row:
        teardown = fault.operation == "teardown"
        if fault.operation not in ("first deploy", "teardown"):
            self.target(fault.operation)
        fault.arm(self.cluster)
        harness_errors = len(self.cluster.kubernetes.errors)
        started = time.monotonic()
        left_running: list[int] = []
        restored, repaired = False, ""
        if fault.kill_when is not None:
            run = self.project.up_killed(fault.kill_when, verb="destroy" if teardown else "up")
            cancelled = self.project.cli("cancel", "--yes", "--stack", self.project.stack, check=False)
            if cancelled.returncode != 0 and "failed to load checkpoint" in cancelled.output:
                # killed while writing the state file: the file backend's own backup of it is the way back
                self.project.restore_latest_backup()
                self.project.cli("cancel", "--yes", "--stack", self.project.stack, check=False)
                restored = True
            left_running = provider_hosts_left(self.project)
            repaired = import_made_vms(self.cluster, self.project)
        else:
            run = self.project.destroy(check=False) if teardown else self.project.up(check=False)
        fault.disarm(self.cluster)
        problems = invariants(self.cluster, self.project, run, started, teardown=teardown)
        problems += [f"the killed run's provider host {pid} still runs {HOST_GRACE_SECONDS}s later"
                     for pid in left_running]
        converging_started = time.monotonic()
        converging = (self.project.destroy(check=False) if teardown
                      else self.project.up(*fault.next_up, check=False))
        problems += [f"in the next {converging.args[0]}: {problem}" for problem in
                     invariants(self.cluster, self.project, converging, converging_started, teardown=teardown)]
        if converging.returncode != 0:
            problems.append(f"the next {converging.args[0]} failed: "
                            f"{''.join(converging.diagnostics('error'))[-1500:]}")
        # what the played kubelets and controllers could not do: the harness's, printed with the row
        row_harness_errors = self.cluster.kubernetes.errors[harness_errors:]
        found = fingerprint(self.cluster, self.project, self.kubernetes)
        reference = TORN_DOWN if teardown else self.references.get(self.key())
        difference = {} if reference is None else {k: (reference[k], found[k]) for k in reference
                                                    if reference[k] != found[k]}
        row = Row(fault, run, problems, converging.returncode == 0 and not difference, difference, restored,
                  repaired, converging, row_harness_errors)
        self.rows.append(row)
        return row


HOST_GRACE_SECONDS = 60  # for a killed run's provider host to finish the node step it is on and end


def provider_hosts_left(project: PulumiProject) -> list[int]:
    """The dynamic-provider hosts of this project still running HOST_GRACE_SECONDS after its CLI was killed
    (no CLI of it runs now, so every such host is a killed run's)."""
    deadline = time.monotonic() + HOST_GRACE_SECONDS
    while True:
        hosts = [pid for pid, command in project_processes(project).items() if b"pulumi.dynamic" in command]
        if not hosts or time.monotonic() > deadline:
            return hosts
        time.sleep(0.5)


def project_processes(project: PulumiProject) -> dict[int, list[bytes]]:
    """pid -> command line of the live processes running in the project's directory (the CLI's plugins)."""
    found = {}
    for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        try:
            command = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            here = os.readlink(f"/proc/{pid}/cwd") == str(project.project)
            zombie = open(f"/proc/{pid}/stat").read().split(") ", 1)[1].startswith("Z")
        except OSError:
            continue
        if here and not zombie:
            found[pid] = command
    return found


def masked_hash(config: Optional[bytes], kubernetes: str) -> str:
    return hashlib.sha256((config or b"").replace(kubernetes.encode(), b"<kubernetes>")).hexdigest()[:16]


def fingerprint(cluster: EngineCluster, project: PulumiProject, kubernetes: str) -> dict:
    """What a clean run of an operation leaves on the far side and in the state; each node's config with the
    Kubernetes version masked (a Kubernetes roll leaves what a clean one leaves at its own version)."""
    nodes = cluster.kubernetes.kube.request("GET", "/api/v1/nodes").json()["items"]
    return {
        "vms": sorted((vm.vmid, vm.name, vm.status, str(vm.config.get("cores")), str(vm.config.get("memory")))
                      for vm in cluster.pve.vms),
        # the nodes that have a VM: a destroyed VM's disk, and what its node ran, are gone
        "talos": {name: (fake.mode, fake.version_tag, masked_hash(fake.config, kubernetes), fake.is_up)
                  for name, fake in cluster.nodes.items() if name in {vm.name for vm in cluster.pve.vms}},
        "etcd": {name: sorted(m.hostname for m in cluster.nodes[name].etcd_members) for name in CONTROL_PLANES},
        "kubernetes": sorted((n["metadata"]["name"], bool(n["spec"].get("unschedulable"))) for n in nodes),
        "state": sorted(r["urn"].split("::", 2)[2] for r in project.export()["deployment"].get("resources") or ()),
    }


def most_down_at_once(fakes: dict[str, FakeTalosNode], names, since: float) -> int:
    """The most of `names` down at one moment from `since` on (a node down at `since` counts from then)."""
    timeline = []
    for name in names:
        power = list(fakes[name].power)
        before = [what for at, what in power if at < since]
        if before and before[-1] == "down":
            timeline.append((since, name, "down"))
        timeline += [(at, name, what) for at, what in power if at >= since]
    down, most = set(), 0
    for _, name, what in sorted(timeline):
        (down.add if what == "down" else down.discard)(name)
        most = max(most, len(down))
    return most


def first_deploy_done(cluster: EngineCluster, since: float) -> bool:
    """Whether the cluster ran before `since`: its bootstrap came earlier."""
    return any(call.at < since for fake in cluster.nodes.values() for call in fake.calls_for("Bootstrap"))


def invariants(cluster: EngineCluster, project: PulumiProject, run: CliRun, since: float, *,
               teardown: bool = False) -> list[str]:
    """What a faulted run must leave true. A teardown takes the control planes out of etcd and down, one at a
    time, by design: it is held to the rest."""
    problems = []
    # a first deploy installs every node at once, by design: the cluster does not run yet
    down = (most_down_at_once(cluster.nodes, CONTROL_PLANES, since)
            if first_deploy_done(cluster, since) and not teardown else 0)
    if down > 1:
        problems.append(f"{down} control planes down at once")
    bootstraps = sum(len(fake.calls_for("Bootstrap")) for fake in cluster.nodes.values())
    if bootstraps > 1:
        problems.append(f"{bootstraps} Bootstrap calls")
    for name in () if teardown else CONTROL_PLANES:
        members = sorted(m.hostname for m in cluster.nodes[name].etcd_members)
        if cluster.nodes[name].mode == "configured" and members != sorted(CONTROL_PLANES):
            problems.append(f"{name} sees etcd members {members}")
    state = project.export()
    in_state = {r["outputs"].get("name") for r in state["deployment"].get("resources") or ()
                if r["type"] == VM_TYPE}
    in_state |= {(op["resource"].get("outputs") or {}).get("name") or (op["resource"].get("inputs") or {}).get("name")
                 for op in state["deployment"].get("pending_operations") or ()}
    for vm in cluster.pve.vms:
        if vm.name not in in_state:
            problems.append(f"VM {vm.vmid} ({vm.name}) is in no Pulumi state")
    vm_names = {vm.name for vm in cluster.pve.vms}
    for name, fake in cluster.nodes.items():
        if fake.mode == "configured" and fake.is_up and name not in vm_names:
            problems.append(f"node {name} runs in no VM")
    printed = run.output + project.cli("stack", "export", "--stack", project.stack).stdout
    for secret in secret_texts(cluster):
        if secret in printed:
            problems.append("a secret in the CLI's output or the state")
            break
    return problems


FULL_OPERATIONS = ("roll", "kubernetes", "hardware", "add", "remove", "move")


def full_operations(setting: str) -> tuple[str, ...]:
    """FAULT_TABLE: `full` (every fault of every operation but the first deploy and the teardown) or some
    operations, comma-separated (`FAULT_TABLE=add,remove`); unset: CI's slice only."""
    if not setting:
        return ()
    if setting == "full":
        return FULL_OPERATIONS
    chosen = tuple(operation.strip() for operation in setting.split(","))
    unknown = [operation for operation in chosen if operation not in FULL_OPERATIONS]
    if unknown:
        pytest.fail(f"FAULT_TABLE={setting}: no operation {', '.join(unknown)} (expected `full`, or some of "
                    f"{', '.join(FULL_OPERATIONS)}, comma-separated)")
    return chosen


def every_fault(operation: str, recorded: tuple) -> list[Fault]:
    """FAULT_TABLE=full: a row per step the clean run of `operation` began (kill as it begins), per PVE call
    it made (a 500, once; the first call of that method and path in the faulted run) and per Talos call a
    node received (UNAVAILABLE, once), each distinct call once."""
    requests, calls, started = recorded
    faults = [Fault(operation, "kill", f"as {op} of {name} begins", kill_when=step_starts(name, op))
              for op, name in dict.fromkeys(started) if op != "same"]
    for method, path in dict.fromkeys((method, path.rstrip("/")) for method, path, _ in requests):
        faults.append(Fault(operation, "pve", f"{method} {path} answers 500",
                            arm=lambda cluster, m=method, p=path: cluster.pve.fail(m, p, 500, "injected", times=1),
                            disarm=lambda cluster, m=method, p=path: cluster.pve.failures.pop((m, p), None)))
    for name, received in calls.items():
        for rpc in dict.fromkeys(call.rpc for call in received):
            faults.append(Fault(operation, "talos", f"{name} answers {rpc} UNAVAILABLE", arm=talos_error(name, rpc),
                                disarm=lambda cluster, n=name, r=rpc: cluster.nodes[n]._failures.pop(r, None)))
    return faults


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Table:
    tmp = tmp_path_factory.mktemp("faults")
    # the worker added later has its stand-in from the start, powered off until its VM is made and started
    with engine_cluster(tmp, WITH_ADDED, VERSIONS[0]) as (cluster, project):
        done = Table(cluster, project, tmp)
        project.set_config(done.config())
        done.faulted(FIRST_DEPLOY_FAULT)
        first = fingerprint(cluster, project, done.kubernetes)
        done.clean("roll")
        done.clean("roll")  # back on the first deploy's version: what a clean first deploy leaves, but reboots
        reference = done.references[done.key()]
        done.rows[0].difference = {k: (reference[k], first[k]) for k in reference if reference[k] != first[k]}
        done.rows[0].converged = done.rows[0].converged and not done.rows[0].difference
        done.clean("kubernetes")
        done.clean("hardware")
        done.clean("hardware")
        done.clean("add")
        done.clean("remove")
        done.clean("move")
        done.clean("move")
        faults = ROLL_FAULTS + KUBERNETES_FAULTS + HARDWARE_FAULTS + MEMBERSHIP_FAULTS + MOVE_FAULTS
        faults += [fault for operation in full_operations(os.environ.get("FAULT_TABLE", ""))
                   for fault in every_fault(operation, done.recorded[operation])]
        print(f"\nfault table: {len(faults) + 2} rows to run")
        for fault in faults:
            done.ensure_before(fault.operation)
            done.faulted(fault)
        done.target("roll")  # a roll, and a second up of the stack while it runs
        second: list[CliRun] = []
        first_up = project.up_until(step_starts(f"lifecycle-{CP1}", "update"),
                                    lambda _process: second.append(project.up(check=False)))
        done.lock_refused = (first_up, second)
        done.two_stacks = done.rolled_from_two_stacks()
        done.clean("unprotect")
        done.faulted(TEARDOWN_FAULT)
        tried = len(done.rows)
        converged = sum(row.converged for row in done.rows)
        held = sum(not row.problems for row in done.rows)
        print(f"\nfault table: {tried} faults tried, {converged} converged, invariants held in {held}")
        for row in done.rows:
            print(f"  {row.fault.operation:12} {row.fault.kind:10} {row.fault.where}: "
                  f"{'converged' if row.converged else 'NOT converged ' + str(sorted(row.difference))}"
                  f"{'' if not row.problems else '; ' + '; '.join(row.problems)}"
                  f"{' (state file cut mid-write: restored from the backend backup)' if row.restored else ''}"
                  f"{f' ({row.repaired})' if row.repaired else ''}")
            for error in row.harness_errors:
                print(f"      stand-in: {error}")
            for key, (expected, found) in row.difference.items():
                if isinstance(expected, dict):
                    expected, found = ({k: v for k, v in d.items() if expected.get(k) != found.get(k)}
                                       for d in (expected, found))
                print(f"      {key}: a clean run left {expected}, this one {found}")
        yield done


def test_every_fault_left_the_invariants_holding(table):
    assert {row.fault.where: row.problems for row in table.rows if row.problems} == {}


def test_after_every_fault_the_next_up_reached_what_a_clean_run_reaches(table):
    assert {row.fault.where: row.difference or "the next up failed" for row in table.rows if not row.converged} == {}


def test_the_table_covers_every_operation_and_kind_of_fault(table):
    assert {row.fault.operation for row in table.rows} == {"first deploy", "roll", "kubernetes", "hardware", "add",
                                                           "remove", "move", "teardown"}
    assert {row.fault.kind for row in table.rows} == {"kill", "pve", "talos", "kubernetes"}


def test_a_failed_start_stops_the_roll_naming_the_node_and_leaves_it_down_for_the_next_up(table):
    rows = [row for row in table.rows if row.fault.where.startswith(START_FAILS)]
    assert len(rows) == 2
    for row in rows:
        assert row.faulted.returncode != 0
        errors = "".join(row.faulted.diagnostics("error"))
        assert f"node {CP2} (127.0.0.103): power-cycling VM {CP2_VM} on pve" in errors, errors[-800:]
        assert "QEMU exited with code 1" in errors
    plain, refreshed = rows
    # After the refresh the Proxmox plugin sees the VM stopped and starts it (`started`); the node's roll then
    # waits for it to be healthy before the next node. Without one, the roll finds the VM stopped and starts it.
    assert ("update", CP2) in refreshed.next_run.started()
    assert ("update", CP2) not in plain.next_run.started()
    for row in rows:
        assert ("update", f"lifecycle-{CP2}") in row.next_run.started()


def test_a_start_pve_answers_late_stops_the_roll_naming_the_node(table):
    [row] = [row for row in table.rows if row.fault.where.startswith(f"PVE answers {CP3}'s VM start")]
    assert row.faulted.returncode != 0
    errors = "".join(row.faulted.diagnostics("error"))
    assert f"node {CP3} (127.0.0.104): power-cycling VM {CP3_VM} on pve to apply cpu " in errors, errors[-800:]
    assert f"failed: PVE did not answer the start of VM {CP3_VM} on pve in time" in errors, errors[-800:]
    assert ("update", f"lifecycle-{CP3}") in row.next_run.started()


def test_each_fault_did_strike(table):
    """A fault that never struck proves nothing: the kills stopped the CLI, the others failed a call."""
    for row in table.rows:
        if row.fault.kind == "kill":
            assert row.faulted.returncode == -9, row.fault.where
    assert not table.cluster.pve.failures and not table.cluster.pve.holds  # each PVE failure was used up
    assert not any(fake._failures.get("LifecycleService/Upgrade") for fake in table.cluster.nodes.values())
    # each held or lost call happened (each such behaviour takes itself out when it strikes)
    assert "LifecycleService/Upgrade" not in table.cluster.nodes[CP3].behaviours
    assert "ImageService/Pull" not in table.cluster.nodes[CP2].behaviours


def test_a_second_up_of_the_stack_while_one_runs_is_refused_by_the_backends_lock(table):
    first, second = table.lock_refused
    assert first.returncode == 0, "".join(first.diagnostics("error"))[-1500:]
    [refused] = second
    assert refused.returncode != 0 and "the stack is currently locked" in refused.output, refused.output[-1500:]
    assert refused.started() == []  # it did nothing: no step began


def test_two_stacks_rolling_one_cluster_at_once_take_one_node_down_at_a_time(table):
    """The cluster's operations lock holds across processes: each node step of one stack's up waits for the
    other's to end (a node the other upgraded meanwhile is found done), and both ups finish."""
    first, second, most_down = table.two_stacks
    for run in (first, second):
        assert run.returncode == 0, "".join(run.diagnostics("error"))[-1500:]
    assert most_down == 1
    assert "waiting for pid" in first.output + second.output
