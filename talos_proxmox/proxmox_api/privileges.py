"""The Proxmox API token's privileges: what the program's PVE calls need (README, "The API token's
privileges"), and which of them a token lacks, named by path and privilege.

PVE refuses a call the token may not make with a bare "Permission check failed" where its check has
alternatives (query-url-metadata, download-url), and the provider fails half-way with that. Checked in the
preview instead, from what `GET /access/permissions?path=...` says the token holds on each path. No Pulumi
here; `held(path)` is the adapter's call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

# A conjunction of (path, privilege); a need is met by any one of its alternatives.
Grants = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Need:
    what: str  # what the program does with it, e.g. "download the Talos ISO onto pve"
    alternatives: tuple[Grants, ...]


def _on(path: str, *privileges: str) -> Grants:
    return tuple((path, privilege) for privilege in privileges)


def needs(hosts: Sequence[str], vm_datastore: str, iso_datastore: str, bridge: str,
          vm_ids: Iterable[int | None], access_users: Sequence[str] = ()) -> list[Need]:
    """What the program's calls need on a cluster's Proxmox paths (hosts its VMs and ISOs are on, its
    datastores, its bridge, its VM ids; None: the id PVE picks, checked on /vms), and, for each user it makes
    for a plugin in the cluster (`access_users`, USER@pve), what making its role, user, token and ACL entry
    needs (PVE's API schema: roles, users, ACL)."""
    found = []
    for host in dict.fromkeys(hosts):
        found.append(Need(f"download the Talos ISO onto {host} (query-url-metadata, download-url)", (
            _on(f"/nodes/{host}", "Sys.AccessNetwork") + _on(f"/storage/{iso_datastore}", "Datastore.AllocateTemplate"),
            _on("/", "Sys.Audit", "Sys.Modify") + _on(f"/storage/{iso_datastore}", "Datastore.AllocateTemplate"))))
    found.append(Need(f"read the ISO and disks on {iso_datastore} and {vm_datastore}", (
        _on(f"/storage/{iso_datastore}", "Datastore.Audit") + _on(f"/storage/{vm_datastore}", "Datastore.Audit"),)))
    found.append(Need(f"allocate VM disks on {vm_datastore}", (_on(f"/storage/{vm_datastore}", "Datastore.AllocateSpace"),)))
    found.append(Need(f"attach VMs to bridge {bridge}", (_on(f"/sdn/zones/localnetwork/{bridge}", "SDN.Use"),)))
    for vm_id in dict.fromkeys(vm_ids):
        path = f"/vms/{vm_id}" if vm_id is not None else "/vms"
        found.append(Need(f"make, change, start, stop and remove VM {vm_id if vm_id is not None else '(any id)'}", (
            _on(path, "VM.Allocate", "VM.Audit", "VM.PowerMgmt", "VM.Config.Disk", "VM.Config.CDROM",
                "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options",
                "VM.Config.HWType"),)))
    for user in dict.fromkeys(access_users):
        found.append(Need(f"make the Proxmox role and user {user} (with its API token) for a plugin in the cluster", (
            _on("/access", "Sys.Modify") + _on(f"/access/realm/{user.rsplit('@', 1)[-1]}", "Realm.AllocateUser")
            + _on("/access/groups", "User.Modify"),)))
        found.append(Need(f"give {user} its role on /", (_on("/", "Permissions.Modify"),)))
    return found


def effective(permissions: Mapping[str, Mapping[str, object]], path: str) -> set[str]:
    """What `GET /access/permissions?path=<path>` says the token holds on `path`: PVE answers with the path's
    effective privileges; the entries of its ancestors (as some answer) are taken as propagated to it."""
    held: set[str] = set()
    for granted, privileges in permissions.items():
        if granted in ("/", path) or path.startswith(granted.rstrip("/") + "/"):
            held.update(name for name, value in privileges.items() if value)
    return held


def missing(wanted: Sequence[Need], held: Callable[[str], set[str]]) -> list[str]:
    """One line per need no alternative of which the token holds in full, naming what each lacks."""
    cache: dict[str, set[str]] = {}

    def has(path: str, privilege: str) -> bool:
        if path not in cache:
            cache[path] = held(path)
        return privilege in cache[path]

    lines = []
    for need in wanted:
        lacks = [[f"{privilege} on {path}" for path, privilege in alternative if not has(path, privilege)]
                 for alternative in need.alternatives]
        if all(lacks):
            options = " or ".join(", ".join(lacked) for lacked in lacks)
            lines.append(f"the Proxmox API token may not {need.what}: it lacks {options}")
    return lines
