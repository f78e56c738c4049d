"""The committed stubs are what protoc makes from our protos, and our protos match Talos's.

UPSTREAM_* are facts copied from siderolabs/talos api/common/common.proto and
api/machine/machine.proto (field and enum numbers, method signatures) for every message and
method we define; a renumbered or renamed field in our protos fails here.
"""

from pathlib import Path

from google.protobuf import descriptor

from talos_proxmox.talos_api import generate
from talos_proxmox.talos_api.generated.common import common_pb2
from talos_proxmox.talos_api.generated.machine import machine_pb2

UPSTREAM_FIELDS = {
    "common.Code": {"FATAL": 0, "LOCKED": 1, "CANCELED": 2},
    "common.Error": {"code": 1, "message": 2, "details": 3},
    "common.Metadata": {"hostname": 1, "error": 2, "status": 3},
    "common.Data": {"metadata": 1, "bytes": 2},
    "common.DataResponse": {"messages": 1},
    "common.Empty": {"metadata": 1},
    "common.EmptyResponse": {"messages": 1},
    "machine.ApplyConfigurationRequest": {"data": 1, "mode": 4, "dry_run": 5, "try_mode_timeout": 6},
    "machine.ApplyConfigurationRequest.Mode": {"REBOOT": 0, "AUTO": 1, "NO_REBOOT": 2, "STAGED": 3, "TRY": 4},
    "machine.ApplyConfiguration": {"metadata": 1, "warnings": 2, "mode": 3, "mode_details": 4},
    "machine.ApplyConfigurationResponse": {"messages": 1},
    "machine.RebootRequest": {"mode": 1},
    "machine.RebootRequest.Mode": {"DEFAULT": 0, "POWERCYCLE": 1, "FORCE": 2},
    "machine.Reboot": {"metadata": 1, "actor_id": 2},
    "machine.RebootResponse": {"messages": 1},
    "machine.BootstrapRequest": {"recover_etcd": 1, "recover_skip_hash_check": 2},
    "machine.Bootstrap": {"metadata": 1},
    "machine.BootstrapResponse": {"messages": 1},
    "machine.ResetPartitionSpec": {"label": 1, "wipe": 2},
    "machine.ResetRequest": {"graceful": 1, "reboot": 2, "system_partitions_to_wipe": 3, "user_disks_to_wipe": 4, "mode": 5},
    "machine.ResetRequest.WipeMode": {"ALL": 0, "SYSTEM_DISK": 1, "USER_DISKS": 2},
    "machine.Reset": {"metadata": 1, "actor_id": 2},
    "machine.ResetResponse": {"messages": 1},
    "machine.UpgradeRequest": {"image": 1, "preserve": 2, "stage": 3, "force": 4, "reboot_mode": 5},
    "machine.UpgradeRequest.RebootMode": {"DEFAULT": 0, "POWERCYCLE": 1},
    "machine.Upgrade": {"metadata": 1, "ack": 2, "actor_id": 3},
    "machine.UpgradeResponse": {"messages": 1},
    "machine.ServiceList": {"metadata": 1, "services": 2},
    "machine.ServiceListResponse": {"messages": 1},
    "machine.ServiceInfo": {"id": 1, "state": 2, "events": 3, "health": 4},
    "machine.ServiceEvents": {"events": 1},
    "machine.ServiceEvent": {"msg": 1, "state": 2, "ts": 3},
    "machine.ServiceHealth": {"unknown": 1, "healthy": 2, "last_message": 3, "last_change": 4},
    "machine.Version": {"metadata": 1, "version": 2, "platform": 3, "features": 4},
    "machine.VersionResponse": {"messages": 1},
    "machine.VersionInfo": {"tag": 1, "sha": 2, "built": 3, "go_version": 4, "os": 5, "arch": 6},
    "machine.PlatformInfo": {"name": 1, "mode": 2},
    "machine.FeaturesInfo": {"rbac": 1},
    "machine.EtcdLeaveClusterRequest": {},
    "machine.EtcdLeaveCluster": {"metadata": 1},
    "machine.EtcdLeaveClusterResponse": {"messages": 1},
    "machine.EtcdRemoveMemberByIDRequest": {"member_id": 1},
    "machine.EtcdRemoveMemberByID": {"metadata": 1},
    "machine.EtcdRemoveMemberByIDResponse": {"messages": 1},
    "machine.EtcdMemberListRequest": {"query_local": 1},
    "machine.EtcdMember": {"id": 2, "hostname": 3, "peer_urls": 4, "client_urls": 5, "is_learner": 6},
    "machine.EtcdMembers": {"metadata": 1, "legacy_members": 2, "members": 3},
    "machine.EtcdMemberListResponse": {"messages": 1},
}
UPSTREAM_METHODS = {
    "/machine.MachineService/ApplyConfiguration": (".machine.ApplyConfigurationRequest", ".machine.ApplyConfigurationResponse", False),
    "/machine.MachineService/Bootstrap": (".machine.BootstrapRequest", ".machine.BootstrapResponse", False),
    "/machine.MachineService/EtcdMemberList": (".machine.EtcdMemberListRequest", ".machine.EtcdMemberListResponse", False),
    "/machine.MachineService/EtcdRemoveMemberByID": (".machine.EtcdRemoveMemberByIDRequest", ".machine.EtcdRemoveMemberByIDResponse", False),
    "/machine.MachineService/EtcdLeaveCluster": (".machine.EtcdLeaveClusterRequest", ".machine.EtcdLeaveClusterResponse", False),
    "/machine.MachineService/Kubeconfig": (".google.protobuf.Empty", ".common.Data", True),
    "/machine.MachineService/Reboot": (".machine.RebootRequest", ".machine.RebootResponse", False),
    "/machine.MachineService/Reset": (".machine.ResetRequest", ".machine.ResetResponse", False),
    "/machine.MachineService/ServiceList": (".google.protobuf.Empty", ".machine.ServiceListResponse", False),
    "/machine.MachineService/Upgrade": (".machine.UpgradeRequest", ".machine.UpgradeResponse", False),
    "/machine.MachineService/Version": (".google.protobuf.Empty", ".machine.VersionResponse", False),
}


def _our_definitions():
    found = {}

    def walk(message: descriptor.Descriptor):
        found[message.full_name] = {f.name: f.number for f in message.fields}
        for enum in message.enum_types:
            found[enum.full_name] = {v.name: v.number for v in enum.values}
        for nested in message.nested_types:
            walk(nested)

    for module in (common_pb2, machine_pb2):
        for enum in module.DESCRIPTOR.enum_types_by_name.values():
            found[enum.full_name] = {v.name: v.number for v in enum.values}
        for message in module.DESCRIPTOR.message_types_by_name.values():
            walk(message)
    return found


def test_every_message_and_enum_matches_talos_numbering():
    assert _our_definitions() == UPSTREAM_FIELDS


def test_methods_have_talos_paths_and_types():
    service = machine_pb2.DESCRIPTOR.services_by_name["MachineService"]
    ours = {
        f"/{service.full_name}/{m.name}": ("." + m.input_type.full_name, "." + m.output_type.full_name, m.server_streaming)
        for m in service.methods
    }
    assert ours == UPSTREAM_METHODS


def test_stub_paths_are_the_talos_method_paths():
    stub_source = (generate.GENERATED_DIR / "machine" / "machine_pb2_grpc.py").read_text()
    for path in UPSTREAM_METHODS:
        assert f"'{path}'" in stub_source


def test_committed_stubs_equal_a_fresh_generation(tmp_path: Path):
    fresh = generate.generate(tmp_path)
    committed = sorted(p for p in generate.GENERATED_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert [p.relative_to(tmp_path) for p in fresh] == [p.relative_to(generate.GENERATED_DIR) for p in committed]
    for new, old in zip(fresh, committed):
        assert new.read_bytes() == old.read_bytes(), f"{old} is stale: run python -m talos_proxmox.talos_api.generate"
