"""A stand-in for the Proxmox provider plugin (pulumi-proxmoxve 8.6.0, bridging bpg/proxmox) in the engine tier.

The real plugin cannot be built here (scripts/tool-versions.env), so the engine loads this one from PATH
(tests/engine/bin/pulumi-resource-proxmoxve) in its place. It answers the engine's ResourceProvider calls
for the two resources the program makes, with the rules of bpg's provider that the program relies on
(bpg/terraform-provider-proxmox, proxmoxtf/resource/vm and download/file), and reaches the PVE stand-in
only through the PVE JSON API with the stack's API token:

- VmLegacy: `vmId` and `nodeName` force a replacement (ForceNew); a create POSTs the VM's config to
  /nodes/{node}/qemu and starts it when `started`; an update PUTs the changed keys, which PVE keeps
  pending on a running VM, and reboots it only with `rebootAfterUpdate`; a delete stops the VM when
  `stopOnDestroy`, then DELETEs it.
- download.File: `url`, `fileName`, `nodeName`, `datastoreId` and `contentType` force a replacement; a
  create asks PVE to download the URL (`download-url`), first deleting a file of that name it does not
  manage when `overwriteUnmanaged`; its id is the volume id `<datastore>:<content>/<file>`.
Every PVE task is waited for. Secrets reach it in the clear (Configure answers acceptSecrets=false, as
the dynamic-provider host does), and none is ever printed.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from concurrent import futures
from typing import Any, Mapping, Optional

import grpc
from google.protobuf import empty_pb2
from pulumi.runtime import proto, rpc
from pulumi.runtime._grpc_settings import _GRPC_CHANNEL_OPTIONS
from pulumi.runtime.proto import ResourceProviderServicer, provider_pb2_grpc

from talos_proxmox.proxmox_api import vms
from talos_proxmox.proxmox_api.access import ProxmoxAccess

VERSION = "8.6.0"  # the pinned pulumi-proxmoxve SDK's plugin version
VM = "proxmoxve:index/vmLegacy:VmLegacy"
FILE = "proxmoxve:download/file:File"
FORCE_NEW = {VM: ("vmId", "nodeName"), FILE: ("url", "fileName", "nodeName", "datastoreId", "contentType")}
TASK_TIMEOUT = 60.0
# Keys whose change bpg's provider applies to a running VM only at its next boot (so: a reboot, if asked).
NEEDS_REBOOT = ("cores", "sockets", "cpu", "memory", "balloon", "scsihw", "bios", "machine")


def _type(urn: str) -> str:
    return urn.split("::")[-2].split("$")[-1]


def changed_paths(olds: Any, news: Any, path: str = "") -> dict[str, int]:
    """{property path: PropertyDiff kind} of the leaves that differ, e.g. `networkDevices[0].macAddress`."""
    kinds = proto.PropertyDiff
    if isinstance(olds, dict) and isinstance(news, dict):
        found: dict[str, int] = {}
        for key in sorted(set(olds) | set(news)):
            child = f"{path}.{key}" if path else key
            if key not in olds:
                found[child] = kinds.ADD
            elif key not in news:
                found[child] = kinds.DELETE
            else:
                found.update(changed_paths(olds[key], news[key], child))
        return found
    if isinstance(olds, list) and isinstance(news, list) and len(olds) == len(news):
        found = {}
        for index, (old, new) in enumerate(zip(olds, news)):
            found.update(changed_paths(old, new, f"{path}[{index}]"))
        return found
    return {} if olds == news else {path: kinds.UPDATE}


def _top_key(path: str) -> str:
    return path.split(".", 1)[0].split("[", 1)[0]


def _flag(value: Any) -> str:
    return "1" if value else "0"


def vm_config(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The PVE config of a VmLegacy's inputs (the keys the program sets)."""
    config: dict[str, Any] = {"name": inputs["name"], "onboot": _flag(inputs.get("onBoot", True))}
    if inputs.get("description"):
        config["description"] = inputs["description"]
    if inputs.get("tags"):
        config["tags"] = ";".join(inputs["tags"])
    cpu, memory = inputs.get("cpu") or {}, inputs.get("memory") or {}
    config.update(cores=int(cpu.get("cores", 1)), sockets=int(cpu.get("sockets", 1)), cpu=cpu.get("type", "qemu64"),
                  memory=int(memory.get("dedicated", 512)), balloon=int(memory.get("floating", 0)))
    if inputs.get("scsiHardware"):
        config["scsihw"] = inputs["scsiHardware"]
    for disk in inputs.get("disks") or []:
        config[disk["interface"]] = (f"{disk['datastoreId']}:{int(disk['size'])},format={disk.get('fileFormat', 'raw')},"
                                     f"ssd={_flag(disk.get('ssd'))},discard={disk.get('discard', 'ignore')},"
                                     f"iothread={_flag(disk.get('iothread'))}")
    for index, nic in enumerate(inputs.get("networkDevices") or []):
        config[f"net{index}"] = f"{nic.get('model', 'virtio')}={nic['macAddress']},bridge={nic['bridge']}"
    cdrom = inputs.get("cdrom")
    if cdrom:
        config[cdrom.get("interface", "ide3")] = f"{cdrom['fileId']},media=cdrom"
    if inputs.get("bootOrders"):
        config["boot"] = "order=" + ";".join(inputs["bootOrders"])
    agent = inputs.get("agent")
    if agent:
        config["agent"] = f"enabled={_flag(agent.get('enabled'))},fstrim_cloned_disks={_flag(agent.get('trim'))}," \
                          f"type={agent.get('type', 'virtio')}"
    if inputs.get("operatingSystem"):
        config["ostype"] = inputs["operatingSystem"]["type"]
    for key in ("bios", "machine"):
        if inputs.get(key):
            config[key] = inputs[key]
    efi = inputs.get("efiDisk")
    if efi:
        config["efidisk0"] = (f"{efi['datastoreId']}:1,efitype={efi.get('type', '4m')},"
                              f"pre-enrolled-keys={_flag(efi.get('preEnrolledKeys'))}")
    tpm = inputs.get("tpmState")
    if tpm:
        config["tpmstate0"] = f"{tpm['datastoreId']}:1,version={tpm.get('version', 'v2.0')}"
    init = inputs.get("initialization")
    if init:
        config[init.get("interface", "ide2")] = f"{init['datastoreId']}:cloudinit"
        ipv4 = ((init.get("ipConfigs") or [{}])[0]).get("ipv4") or {}
        if ipv4:
            config["ipconfig0"] = f"ip={ipv4['address']}" + (f",gw={ipv4['gateway']}" if ipv4.get("gateway") else "")
        servers = (init.get("dns") or {}).get("servers")
        if servers:
            config["nameserver"] = " ".join(servers)
    return config


class StandInProxmoxProvider(ResourceProviderServicer):
    def __init__(self) -> None:
        self._access: Optional[ProxmoxAccess] = None
        self._api = None
        self._lock = threading.Lock()

    # --- provider configuration ----------------------------------------------------------------

    def GetPluginInfo(self, request, context):
        return proto.PluginInfo(version=VERSION)

    def CheckConfig(self, request, context):
        return proto.CheckResponse(inputs=request.news)

    def DiffConfig(self, request, context):
        return proto.DiffResponse(changes=proto.DiffResponse.DIFF_NONE)

    def Configure(self, request, context):
        args = rpc.deserialize_properties(request.args) if request.HasField("args") else {}
        settings = {f"proxmoxve:{key}": rpc.unwrap_rpc_secret(value) for key, value in args.items()}
        for key, value in request.variables.items():  # "proxmoxve:config:endpoint"
            settings.setdefault(key.replace(":config:", ":"), value)
        self._access = ProxmoxAccess.from_settings(settings.get)
        return proto.ConfigureResponse(acceptSecrets=False, supportsPreview=False)

    def _pve(self):
        with self._lock:
            if self._api is None:
                self._api = self._access.connect()
            return self._api

    # --- resources -----------------------------------------------------------------------------

    def Check(self, request, context):
        return proto.CheckResponse(inputs=request.news)

    def Diff(self, request, context):
        """Changed keys, the ForceNew ones as replacements, and a detailed diff by property path down to
        the changed leaves, as a bridged provider answers (the engine matches `replaceOnChanges` paths
        such as `networkDevices[0].macAddress` against it)."""
        olds = rpc.deserialize_properties(request.old_inputs if request.HasField("old_inputs") else request.olds, True)
        news = rpc.deserialize_properties(request.news, True)
        olds = {key: value for key, value in olds.items() if not key.startswith("__")}
        news = {key: value for key, value in news.items() if not key.startswith("__")}
        paths = changed_paths(olds, news)
        changed = sorted({_top_key(path) for path in paths})
        replaces = [key for key in FORCE_NEW.get(_type(request.urn), ()) if key in changed]
        kinds = proto.PropertyDiff
        detailed = {path: kinds(kind=kinds.UPDATE_REPLACE if _top_key(path) in replaces else kind)
                    for path, kind in paths.items()}
        return proto.DiffResponse(changes=proto.DiffResponse.DIFF_SOME if changed else proto.DiffResponse.DIFF_NONE,
                                  diffs=changed, replaces=replaces, detailedDiff=detailed, hasDetailedDiff=True)

    def Create(self, request, context):
        inputs = rpc.deserialize_properties(request.properties)
        kind = _type(request.urn)
        if kind == VM:
            id_ = self._create_vm(inputs)
        elif kind == FILE:
            id_ = self._create_file(inputs)
        else:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"the stand-in Proxmox provider has no {kind}")
        return proto.CreateResponse(id=id_, properties=_serialize(inputs))

    def Update(self, request, context):
        olds = rpc.deserialize_properties(request.old_inputs if request.HasField("old_inputs") else request.olds)
        news = rpc.deserialize_properties(request.news)
        if _type(request.urn) == VM:
            self._update_vm(olds, news)
        return proto.UpdateResponse(properties=_serialize(news))

    def Delete(self, request, context):
        props = rpc.deserialize_properties(request.properties)
        kind = _type(request.urn)
        if kind == VM:
            self._delete_vm(props)
        elif kind == FILE:
            node, volume = props["nodeName"], request.id
            self._wait(node, self._pve().nodes(node).storage(props["datastoreId"]).content(volume).delete())
        return empty_pb2.Empty()

    def Read(self, request, context):
        return proto.ReadResponse(id=request.id, properties=request.properties, inputs=request.inputs)

    def Cancel(self, request, context):
        return empty_pb2.Empty()

    # --- PVE calls -----------------------------------------------------------------------------

    def _wait(self, node: str, upid: Optional[str]) -> None:
        if upid:
            vms.wait_task(self._pve(), node, upid, timeout=TASK_TIMEOUT)

    def _create_vm(self, inputs: dict) -> str:
        node, vm_id = inputs["nodeName"], int(inputs["vmId"])
        qemu = self._pve().nodes(node).qemu
        self._wait(node, qemu.post(vmid=vm_id, **vm_config(inputs)))
        if inputs.get("started", True):
            self._wait(node, qemu(vm_id).status.start.post())
        return str(vm_id)

    def _update_vm(self, olds: dict, news: dict) -> None:
        node, vm_id = news["nodeName"], int(news["vmId"])
        before, after = vm_config(olds), vm_config(news)
        changed = {key: value for key, value in after.items() if before.get(key) != value}
        removed = [key for key in before if key not in after]
        if not changed and not removed:
            return
        api = self._pve().nodes(node).qemu(vm_id)
        api.config.put(**changed, **({"delete": ",".join(removed)} if removed else {}))
        running = api.status.current.get().get("status") == "running"
        if news.get("rebootAfterUpdate", True) and running and any(key in NEEDS_REBOOT for key in changed):
            self._wait(node, api.status.reboot.post())

    def _delete_vm(self, props: dict) -> None:
        node, vm_id = props["nodeName"], int(props["vmId"])
        api = self._pve().nodes(node).qemu(vm_id)
        if props.get("stopOnDestroy") and api.status.current.get().get("status") == "running":
            self._wait(node, api.status.stop.post())
        self._wait(node, api.delete(purge=1, **{"destroy-unreferenced-disks": 1}))

    def _create_file(self, inputs: dict) -> str:
        node, store = inputs["nodeName"], inputs["datastoreId"]
        content, name = inputs.get("contentType", "iso"), inputs["fileName"]
        volume = f"{store}:{content}/{name}"
        storage = self._pve().nodes(node).storage(store)
        if inputs.get("overwriteUnmanaged") and any(item["volid"] == volume for item in storage.content.get()):
            self._wait(node, storage.content(volume).delete())
        self._wait(node, storage("download-url").post(content=content, filename=name, url=inputs["url"]))
        return volume


def _serialize(properties: dict):
    return asyncio.run(rpc.serialize_properties(properties, {}))


def main() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=_GRPC_CHANNEL_OPTIONS)
    provider_pb2_grpc.add_ResourceProviderServicer_to_server(StandInProxmoxProvider(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
