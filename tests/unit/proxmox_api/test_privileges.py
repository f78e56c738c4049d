"""The API token's privileges (talos_proxmox.proxmox_api.privileges): what the program's PVE calls need,
and each missing one named by path and privilege, before the preview ends."""

from talos_proxmox.proxmox_api import privileges

ALL_VM = {"VM.Allocate", "VM.Audit", "VM.PowerMgmt", "VM.Config.Disk", "VM.Config.CDROM", "VM.Config.CPU",
          "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options", "VM.Config.HWType"}
ROLE = {"Sys.AccessNetwork", "Datastore.AllocateTemplate", "Datastore.AllocateSpace", "Datastore.Audit", "SDN.Use",
        *ALL_VM}
NEEDS = privileges.needs(["pve", "pve2", "pve"], "local-lvm", "local", "vmbr0", [9101, None])


def held_on_root(granted):
    return lambda path: privileges.effective({"/": dict.fromkeys(granted, 1)}, path)


def test_the_documented_role_on_root_is_enough():
    assert privileges.missing(NEEDS, held_on_root(ROLE)) == []


def test_the_iso_download_takes_either_network_access_on_the_node_or_audit_and_modify_on_root():
    without = ROLE - {"Sys.AccessNetwork"}
    assert privileges.missing(NEEDS, held_on_root(without)) == [
        f"the Proxmox API token may not download the Talos ISO onto {host} (query-url-metadata, download-url): "
        f"it lacks Sys.AccessNetwork on /nodes/{host} or Sys.Audit on /, Sys.Modify on /" for host in ("pve", "pve2")]
    assert privileges.missing(NEEDS, held_on_root(without | {"Sys.Audit", "Sys.Modify"})) == []


def test_each_vm_id_and_the_id_pve_picks_are_checked_on_their_own_paths():
    granted = {"/": dict.fromkeys(ROLE - ALL_VM, 1), "/vms/9101": dict.fromkeys(ALL_VM, 1)}
    [problem] = privileges.missing(NEEDS, lambda path: privileges.effective(granted, path))
    assert problem.startswith("the Proxmox API token may not make, change, start, stop and remove VM (any id): "
                              "it lacks VM.Allocate on /vms, VM.Audit on /vms")


def test_a_privilege_granted_on_another_branch_or_switched_off_does_not_count():
    assert privileges.effective({"/vms/91": {"VM.Audit": 1}, "/vms/9101": {"VM.Allocate": 0}}, "/vms/9101") == set()
    assert privileges.effective({"/storage": {"Datastore.Audit": 1}}, "/storage/local") == {"Datastore.Audit"}


def test_a_plugin_user_needs_the_access_privileges_and_each_missing_one_is_named():
    with_csi = privileges.needs(["pve"], "local-lvm", "local", "vmbr0", [9101], access_users=["lab-csi@pve"])
    access = {"Sys.Modify", "Realm.AllocateUser", "User.Modify", "Permissions.Modify"}
    assert privileges.missing(with_csi, held_on_root(ROLE | access)) == []
    assert privileges.missing(with_csi, held_on_root(ROLE)) == [
        "the Proxmox API token may not make the Proxmox role and user lab-csi@pve (with its API token) for a plugin "
        "in the cluster: it lacks Sys.Modify on /access, Realm.AllocateUser on /access/realm/pve, User.Modify on "
        "/access/groups",
        "the Proxmox API token may not give lab-csi@pve its role on /: it lacks Permissions.Modify on /"]
