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
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

from fakepve.certs import make_cert
from fakepve.pytest_plugin import _Serving  # serves a FakePve on its own event loop thread
from fakepve.server import FakePve
from proxmoxer import ProxmoxAPI

from tests.talos_api_server import FakeTalosNode

HOST = "127.0.0.1"
PVE_HOST = "pve1"
TOKEN_ID = "root@pam!talos-proxmox-tests"
TOKEN_SECRET = "9b1f3c52-61a4-4c2e-8d0a-3e7c5b9f2a14"  # a stand-in's token, not a credential


@dataclass(frozen=True)
class PowerEvent:
    at: float  # time.monotonic()
    vm_id: int
    name: str
    what: str  # "off" (the node powered its VM off) or "up" (started again, its node answers); "made", "destroyed"


class ProxmoxStandIn(FakePve):
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
