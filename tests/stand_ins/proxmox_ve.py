"""The Proxmox VE host of the tests: fakepve's FakePve (the PVE JSON API over HTTPS, API tokens, tasks,
pending config) with each VM tied to the stand-in Talos node that runs in it.

What this adds to fakepve is the guest: when the VM's FakeTalosNode powers itself off (a Talos
Shutdown), PVE sees the VM stopped; a Proxmox start (`POST .../status/start`) brings the node up
`boot_seconds` later, as Talos boots. Every power event is kept in time order in `power_events`, so a
test can tell how many nodes were down at once. `vm_changed` does what the Proxmox provider does to a
running VM whose cores, memory or CPU type change with `reboot_after_update: false`: one PUT of the
VM's config, which PVE keeps as pending until the VM next starts. `destroy` is the provider's delete:
a stop (the guest goes down with its VM) and the DELETE.

A VM made through the API (the engine tier's Proxmox provider) runs the guest `guest_named(name)` gives
for its name: its first start boots the ISO (maintenance mode), later ones the installed node.

Where fakepve 0.5.0 answers the calls the real Proxmox provider (bpg v0.111.1) makes unlike PVE 9, this
class answers as PVE does (qemu-server, pve-storage):
- a path with a trailing slash is the same path (the provider DELETEs `.../qemu/{vmid}/?purge=1...`);
- `GET .../config` shows pending values applied, `current=1` the running ones;
- `PUT .../config` stores typed values (PVE's check_type: `cores: 4`, not `"4"`) and drives as PVE prints
  them (`local:iso/x.iso,media=cdrom`, not the provider's `file=local:iso/x.iso,media=cdrom,`), allocates a new disk
  at once, applies hot-pluggable keys to a running VM at once (the fast-plug options and cloud-init keys;
  with the default hotplug `network,disk,usb`: NICs, new SCSI/VirtIO disks, CD-ROM media) and keeps the
  rest pending (cores, sockets, memory, CPU type, SCSI controller, BIOS, machine, agent type, existing
  disks' options, EFI disk, TPM state); a pending value equal to the running one is dropped
  (cleanup_pending), a delete of an unset key ignored;
- `PUT .../resize` grows the volume and writes its size into the running config; shrinking is refused;
- `download-url` of a file that exists fails its task with "refusing to override existing file";
  `query-url-metadata` fetches the URL's headers itself (a bad URL is an error, as on a real node);
- roles, users, API tokens and ACL entries are kept and answered as PVE does (proxmox_access.py);
- `query-url-metadata` and `download-url` need `Sys.Audit` + `Sys.Modify` on `/` or `Sys.AccessNetwork`
  on the node (PVE 9).
Still unlike PVE: the cloud-init drive's volume is named like a disk (`vm-<id>-disk-N`, PVE:
`vm-<id>-cloudinit`), `move_disk` does nothing, every task ends before its request returns, and there is
no real guest behind a hot-plugged device.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from fakepve.certs import make_cert
from fakepve.lxc import format_size, parse_size
from fakepve.model import PveError, TaskError
from fakepve.pytest_plugin import _Serving  # serves a FakePve on its own event loop thread
from fakepve.qemu import DRIVE_KEY, NEW_DISK, split_drive, join_drive
from fakepve.server import USER, FakePve, ok, params
from proxmoxer import ProxmoxAPI

from tests.stand_ins.proxmox_access import PveAccessObjects
from tests.stand_ins.talos_api import FakeTalosNode

HOST = "127.0.0.1"
PVE_HOST = "pve1"
TOKEN_ID = "root@pam!talos-proxmox-tests"
TOKEN_SECRET = "9b1f3c52-61a4-4c2e-8d0a-3e7c5b9f2a14"  # a stand-in's token, not a credential


# qemu-server: options PVE applies to a running VM whatever its hotplug setting (the fast-plug list, and
# the cloud-init options, which reach the guest through the regenerated drive).
FAST_PLUG = frozenset({"name", "description", "hookscript", "lock", "migrate_downtime", "migrate_speed", "onboot",
                       "protection", "shares", "startup", "tags", "vmstatestorage", "cpuunits", "cpulimit"})
CLOUD_INIT_KEY = re.compile(r"^(ipconfig\d+|nameserver|searchdomain|ciuser|cipassword|citype|ciupgrade|sshkeys)$")
# With PVE's default hotplug (network,disk,usb): NICs, and new disks on a hot-pluggable bus.
HOTPLUG_NIC = re.compile(r"^net\d+$")
HOTPLUG_DISK = re.compile(r"^(scsi|virtio)\d+$")
# Integer and boolean options of a VM's config, as PVE's check_type stores them (numbers, not strings).
INTEGER_KEYS = frozenset({"cores", "sockets", "vcpus", "memory", "balloon", "cpuunits", "shares", "numa", "onboot",
                          "protection", "acpi", "kvm", "tablet", "template", "localtime", "freeze", "migrate_speed",
                          "reboot", "vmid"})


def _typed(key: str, value):
    if key in INTEGER_KEYS and isinstance(value, str) and re.fullmatch(r"-?\d+", value):
        return int(value)
    return value


@dataclass(frozen=True)
class PowerEvent:
    at: float  # time.monotonic()
    vm_id: int
    name: str
    what: str  # "off" (the node powered its VM off) or "up" (started again, its node answers); "made", "destroyed"


class ProxmoxStandIn(PveAccessObjects, FakePve):
    """A started one comes from `serve_proxmox()`."""

    def __init__(self, boot_seconds: float = 0.2) -> None:
        super().__init__(user="root@pam", password="stand-in", host=HOST, port=0)
        self.time_scale = 0  # tasks end before their request returns; the guests keep real time
        self.apitokens[TOKEN_ID] = TOKEN_SECRET
        self.boot_seconds = boot_seconds
        self.cafile: Optional[str] = None  # the certificate it serves, set by serve_proxmox
        self.guests: dict[int, FakeTalosNode] = {}
        self.power_events: list[PowerEvent] = []
        self.vm_events: list[PowerEvent] = []  # "made" and "destroyed", in time order
        self._events_lock = threading.Lock()
        self.guest_named: Optional[Callable[[str], Optional[FakeTalosNode]]] = None
        self._never_started: set[int] = set()  # VMs made through the API, to boot from the ISO first
        self.privilege_reads: list[str] = []  # the paths of `GET /access/permissions?path=`, in order
        self._init_access_objects()  # roles, users, tokens and ACL entries (proxmox_access.py)
        self.holds: dict[tuple[str, str], list] = {}  # (method, path suffix) -> [seconds, times left]

    def provider_config(self) -> dict[str, str]:
        """The stack config the Proxmox provider (and day two) read to reach this host."""
        return {"proxmoxve:endpoint": self.url + "/", "proxmoxve:apiToken": f"{TOKEN_ID}={TOKEN_SECRET}",
                "proxmoxve:insecure": "true"}

    def client(self) -> ProxmoxAPI:
        """A proxmoxer client with the stand-in's token, verifying its certificate."""
        return ProxmoxAPI(HOST, port=self.port, user="root@pam", token_name=TOKEN_ID.split("!")[1],
                          token_value=TOKEN_SECRET, verify_ssl=self.cafile, service="PVE")

    def run_guest(self, vm_id: int, name: str, guest: FakeTalosNode, *, host: str = PVE_HOST,
                  config: Optional[dict] = None) -> None:
        """A running VM whose guest is `guest`."""
        vm = self.add_vm(vm_id, name, node=host, status="running", config=config)
        self._vm_event(vm, "made")
        self._runs(vm, guest)

    def _runs(self, vm, guest: Optional[FakeTalosNode]) -> None:
        self.guests[vm.vmid] = guest
        if guest is not None:
            guest.on_power_off = lambda: self._powered_off(vm)

    def vm_changed(self, vm_id: int, changes: dict) -> None:
        """The Proxmox provider's update of a running VM without a reboot: the changed keys, one PUT."""
        vm = self.vm(vm_id)
        self.client().nodes(vm.node).qemu(vm_id).config.put(**changes)

    def destroy(self, vm_id: int) -> None:
        """What the Proxmox provider does to delete a VM made with `stop_on_destroy`: a hard stop (its guest
        drops off the network), then the DELETE."""
        vm = self.vm(vm_id)
        api = self.client().nodes(vm.node).qemu(vm_id)
        if vm.status == "running":
            api.status.stop.post()
        api.delete()

    async def _qm_create(self, v, user):
        upid = await super()._qm_create(v, user)
        vm = self.vm(int(v["vmid"]))
        if vm is not None:
            self._vm_event(vm, "made")
            guest = self.guest_named(vm.name) if self.guest_named else None
            if guest is not None:
                self._never_started.add(vm.vmid)
                self._runs(vm, guest)
        return upid

    async def _qm_destroy(self, v, user):
        vm = self.find(v["node"], v["vmid"])
        upid = await super()._qm_destroy(v, user)
        self._vm_event(vm, "destroyed")
        return upid

    async def _do_stop(self, vm, user, p):
        upid = await super()._do_stop(vm, user, p)
        guest = self.guests.pop(vm.vmid, None)
        if guest is not None:
            guest.on_power_off = None
            guest.go_down()
            self._power_event(vm, "off")
        return upid

    def hold(self, method: str, suffix: str, seconds: float, times: int = 1) -> None:
        """Answer the next `times` requests whose path ends with `suffix` `seconds` late, as PVE does when a
        call waits on a lock another task holds or on slow storage; the call is then done as usual, whether or
        not the client still waits for it (aiohttp does not cancel a handler whose client went away)."""
        self.holds[(method, suffix.rstrip("/"))] = [seconds, times]

    async def _answer(self, request, handler, generic, path_node):
        for key, hold in list(self.holds.items()):
            if request.method == key[0] and request.path.rstrip("/").endswith(key[1]):
                hold[1] -= 1
                if hold[1] <= 0:
                    del self.holds[key]
                await asyncio.sleep(hold[0])
                break
        return await super()._answer(request, handler, generic, path_node)

    def _record(self, request, body):
        # The program's privilege check reads the token's privileges in every preview: kept apart, so
        # `requests` stays what changes or reads the VMs and storage, in order.
        if request.method == "GET" and request.path.endswith("/access/permissions"):
            self.privilege_reads.append(request.query.get("path", ""))
            return
        super()._record(request, body)

    # --- PVE as the real provider meets it (see the module's docstring) ---------------------------

    def _routes_stand_in(self):
        # Registered ahead of fakepve's catch-all, like its own stateful routes.
        return [("PUT", "/nodes/{node}/qemu/{vmid}/resize", self._resize),
                ("GET", "/nodes/{node}/query-url-metadata", self._query_url_metadata)]

    async def _generic(self, request):
        # PVE finds a handler whatever trailing slashes the path has; aiohttp's routes do not.
        if request.path.endswith("/") and request.path.rstrip("/") != request.path:
            clone = request.clone(rel_url=request.rel_url.with_path(request.path.rstrip("/")))
            match = await request.app.router.resolve(clone)
            if getattr(match.handler, "__func__", None) is not FakePve._generic:
                match.add_app(request.app)
                clone._match_info = match
                return await match.handler(clone)
        return await super()._generic(request)

    async def _config_get(self, request):
        vm = self._vm(request, "VM.Audit")
        config = dict(vm.config)
        if request.query.get("current") not in ("1", "true"):
            for key, value in vm.pending.items():
                if value is None:
                    config.pop(key, None)
                else:
                    config[key] = value
        if "memory" in config:
            config["memory"] = str(config["memory"])  # PVE sends it as a string
        config["digest"] = vm.digest()
        return ok(config)

    async def _config_put(self, request):
        values = self._verify(request, await params(request))
        for key in request.match_info:
            values.pop(key, None)
        await self._apply_config(self._vm(request), request[USER], values)
        return ok()

    async def _apply_config(self, vm, user, p):
        before = dict(vm.config)
        updates = {key: _typed(key, value) for key, value in p.items()}
        deletes = [key for key in str(updates.get("delete") or "").split(",") if key]
        kept = [key for key in deletes if key in vm.config or key in vm.pending]  # PVE skips unset keys
        if kept:
            updates["delete"] = ",".join(kept)
        else:
            updates.pop("delete", None)
        for key, value in list(updates.items()):
            if not DRIVE_KEY.match(key):
                continue
            volume, props = split_drive(str(value))
            if NEW_DISK.match(volume):
                updates[key], _made = self._qm_new_drive(vm.vmid, key, str(value), None)  # allocated at once
            else:  # stored as PVE prints a drive: volume first (`file=` dropped), options sorted
                updates[key] = join_drive(volume, {k: v for k, v in dict(props).items() if k})
        await super()._apply_config(vm, user, updates)
        if vm.status == "running":
            self._hotplug(vm, before)
        for key in [key for key, value in vm.pending.items()
                    if (value is None and key not in vm.config) or (value is not None and str(vm.config.get(key)) == str(value))]:
            del vm.pending[key]  # cleanup_pending

    @staticmethod
    def _hotplug(vm, before: dict) -> None:
        """What PVE applies to a running VM at once, of what fakepve left pending, and the agent's enable
        or type, which fakepve applied but PVE keeps for the next start."""
        for key, value in list(vm.pending.items()):
            if value is None:
                continue
            cdrom_swap = "media=cdrom" in str(value) and "media=cdrom" in str(before.get(key, ""))
            if (key in FAST_PLUG or CLOUD_INIT_KEY.match(key) or HOTPLUG_NIC.match(key) or cdrom_swap
                    or (HOTPLUG_DISK.match(key) and key not in before)):
                vm.config[key] = value
                del vm.pending[key]
        agent_before, agent_now = before.get("agent"), vm.config.get("agent")
        if agent_now != agent_before:
            strip = lambda text: re.sub(r",?fstrim_cloned_disks=\d", "", str(text or ""))  # noqa: E731
            if strip(agent_now) != strip(agent_before):
                vm.pending["agent"] = agent_now
                if agent_before is None:
                    vm.config.pop("agent", None)
                else:
                    vm.config["agent"] = agent_before

    async def _resize(self, values, user):
        vm = self.find(values["node"], values["vmid"])
        if vm is None:
            raise PveError(500, f"Configuration file 'nodes/{values['node']}/qemu-server/{values['vmid']}.conf' does not exist")
        self.require(user, f"/vms/{vm.vmid}", "VM.Config.Disk")
        key = values["disk"]
        if key not in vm.config:
            raise PveError(500, f"disk '{key}' does not exist")
        volume, props = split_drive(str(vm.config[key]))
        props = dict(props)
        if props.get("media") == "cdrom":
            raise PveError(500, "you can't resize a cdrom")
        current = parse_size(props.get("size", "0"))
        wanted = str(values["size"])
        size = current + parse_size(wanted[1:]) if wanted.startswith("+") else parse_size(wanted)
        if size < current:
            raise PveError(500, "shrinking disks is not supported")

        async def body():
            props["size"] = format_size(size)
            vm.config[key] = join_drive(volume, props)  # the running config, at once
            if key in vm.pending:
                pending_volume, pending_props = split_drive(str(vm.pending[key]))
                vm.pending[key] = join_drive(pending_volume, {**dict(pending_props), "size": props["size"]})
        return await self.task(vm.node, "resize", vm.vmid, user, body, vm=vm)

    def _may_reach_network(self, user: str, node: str) -> None:
        if not (self.allowed(user, f"/nodes/{node}", "Sys.AccessNetwork")
                or (self.allowed(user, "/", "Sys.Audit") and self.allowed(user, "/", "Sys.Modify"))):
            raise PveError(403, "Permission check failed (/nodes/{0}, Sys.AccessNetwork)".format(node))

    async def _query_url_metadata(self, values, user):
        self._may_reach_network(user, values["node"])
        url = values["url"]

        def head() -> dict:
            request = urllib.request.Request(url, method="HEAD")
            with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310 (the test's own servers)
                return {"filename": url.rsplit("/", 1)[-1], "mimetype": reply.headers.get("Content-Type"),
                        "size": int(reply.headers.get("Content-Length") or 0)}
        try:
            return await asyncio.get_running_loop().run_in_executor(None, head)
        except urllib.error.HTTPError as exc:
            raise PveError(500, f"invalid server response: '{exc.code} {exc.reason}'") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise PveError(500, f"unable to get file metadata: {exc}") from None

    async def _download_url(self, request):
        p = await params(request)
        node, storage = request.match_info["node"], request.match_info["storage"]
        user = request[USER]
        self.require(user, f"/storage/{storage}", "Datastore.AllocateTemplate")
        self._may_reach_network(user, node)
        store = self._store(storage)
        p = self._verify(request, p)
        name, content = p["filename"], p["content"]
        if content not in str(store.get("content", "")).replace(";", ",").split(","):
            raise PveError(500, f"storage '{storage}' is not configured for content-type '{content}'")

        async def download():
            if name in store.get("files", ()):
                raise TaskError(f"refusing to override existing file '/var/lib/vz/template/{content}/{name}'")
            self.store_file(storage, name, 1024 ** 2, content)
        return ok(await self.task(node, "download", name, user, download,
                                  log=[f"downloading {p.get('url')} to {name}"]))

    def _power_event(self, vm, what: str) -> None:
        self._append_event(self.power_events, vm, what)

    def _vm_event(self, vm, what: str) -> None:
        self._append_event(self.vm_events, vm, what)

    def _append_event(self, events: list[PowerEvent], vm, what: str) -> None:
        with self._events_lock:
            events.append(PowerEvent(time.monotonic(), vm.vmid, vm.name, what))

    def _powered_off(self, vm) -> None:
        vm.status = vm.qmpstatus = "stopped"
        self._power_event(vm, "off")

    async def _do_start(self, vm, user, p):
        # fakepve's start (pending config applied, the VM running), then the guest boots
        upid = await super()._do_start(vm, user, p)
        guest = self.guests.get(vm.vmid)
        if guest is not None and vm.status == "running":
            boot = threading.Timer(self.boot_seconds, self._boot, args=(vm, guest))
            boot.daemon = True
            boot.start()
        return upid

    def _boot(self, vm, guest: FakeTalosNode) -> None:
        if vm.vmid in self._never_started:
            self._never_started.discard(vm.vmid)
            guest.go_down()  # a node moved into this VM left its old one
            guest.boot_from_iso()
        else:
            guest.reboots += 1
            guest.come_up()
        self._power_event(vm, "up")

    def start_requests(self) -> list[str]:
        """The paths of the starts asked for, in order."""
        return [path for method, path, _body in self.requests if method == "POST" and path.endswith("/status/start")]

    def most_down_at_once(self, names, until: float = float("inf")) -> int:
        """The most of the VMs named `names` powered off (or booting) at the same moment, up to `until`."""
        down, most = set(), 0
        with self._events_lock:
            events = [event for event in self.power_events if event.at <= until]
        for event in events:
            if event.name not in names:
                continue
            (down.add if event.what == "off" else down.discard)(event.name)
            most = max(most, len(down))
        return most


@contextlib.contextmanager
def serve_proxmox(boot_seconds: float = 0.2) -> Iterator[ProxmoxStandIn]:
    """A ProxmoxStandIn listening on https://127.0.0.1:<free port> with a self-signed certificate."""
    pve = ProxmoxStandIn(boot_seconds)
    with tempfile.TemporaryDirectory(prefix="pve-stand-in-") as pki:
        certfile, keyfile, _der = make_cert(pki, hosts=(HOST,))
        pve.cafile = certfile
        serving = _Serving(pve, certfile, keyfile)
        try:
            yield pve
        finally:
            serving.stop()
