"""What the client puts on the wire, decoded by hand at the field numbers of Talos's machine.proto.

The stand-in node records each request's raw bytes before any protobuf parsing; a small varint
reader here splits them into (field number, wire type, value) so that the expected numbers below
come from upstream (siderolabs/talos api/machine/machine.proto), not from our generated code.
"""

import pytest

from talos_proxmox.talos_api import errors
from talos_proxmox.talos_api.client import TalosClient
from tests.stand_ins.talos_api import client_credentials, configured_node, shared_bundle  # noqa: F401

VARINT, LEN = 0, 2


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def fields(buf: bytes) -> list[tuple[int, int, object]]:
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            value, i = _varint(buf, i)
        elif wire_type == LEN:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        else:
            raise AssertionError(f"unexpected wire type {wire_type} for field {number}")
        out.append((number, wire_type, value))
    return out


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | LEN) + _encode_varint(len(payload)) + payload


@pytest.fixture
def node(configured_node):
    return configured_node


@pytest.fixture
def client(node):
    with TalosClient([node.endpoint], credentials=client_credentials(shared_bundle()), node="10.5.0.2") as talos:
        yield talos


def test_apply_configuration_request_fields(node, client):
    client.apply_configuration(b"machine: {}\n", mode="try", dry_run=True, try_timeout=90.5)
    raw = node.calls_for("ApplyConfiguration")[-1].raw
    # data = 1, mode = 4 (TRY = 4), dry_run = 5, try_mode_timeout = 6 (Duration: seconds = 1, nanos = 2)
    decoded = fields(raw)
    assert decoded[:3] == [(1, LEN, b"machine: {}\n"), (4, VARINT, 4), (5, VARINT, 1)]
    assert [(number, wire_type) for number, wire_type, _ in decoded[3:]] == [(6, LEN)]
    assert fields(decoded[3][2]) == [(1, VARINT, 90), (2, VARINT, 500_000_000)]


@pytest.mark.parametrize("mode, number", [("auto", 1), ("no-reboot", 2), ("staged", 3)])
def test_apply_modes_use_talos_enum_values(node, client, mode, number):
    client.apply_configuration(b"x", mode=mode)
    assert fields(node.calls_for("ApplyConfiguration")[-1].raw) == [(1, LEN, b"x"), (4, VARINT, number)]


def test_upgrade_request_fields(node, client):
    client.upgrade("factory.talos.dev/installer/abc:v1.12.0", preserve=True, stage=True, force=True,
                   reboot_mode="powercycle")
    assert fields(node.calls_for("Upgrade")[-1].raw) == [
        (1, LEN, b"factory.talos.dev/installer/abc:v1.12.0"),  # image
        (2, VARINT, 1), (3, VARINT, 1), (4, VARINT, 1),  # preserve, stage, force
        (5, VARINT, 1),  # reboot_mode POWERCYCLE = 1
    ]


def test_reset_request_fields(node, client):
    client.reset(graceful=True, reboot=True, system_partitions_to_wipe=["STATE", "EPHEMERAL"],
                 user_disks_to_wipe=["/dev/sdb"], wipe_mode="system-disk")
    decoded = fields(node.calls_for("Reset")[-1].raw)
    assert decoded[:2] == [(1, VARINT, 1), (2, VARINT, 1)]  # graceful, reboot
    partitions = [fields(value) for number, _, value in decoded if number == 3]
    assert partitions == [[(1, LEN, b"STATE"), (2, VARINT, 1)], [(1, LEN, b"EPHEMERAL"), (2, VARINT, 1)]]
    assert decoded[-2:] == [(4, LEN, b"/dev/sdb"), (5, VARINT, 1)]  # user disks, mode SYSTEM_DISK = 1


def test_bootstrap_etcd_and_reboot_request_fields(node, client):
    client.bootstrap(recover_etcd=True, recover_skip_hash_check=True)
    client.etcd_member_list(query_local=True)
    client.etcd_remove_member_by_id(0x1234ABCD)
    client.reboot(mode="powercycle")
    assert fields(node.calls_for("Bootstrap")[-1].raw) == [(1, VARINT, 1), (2, VARINT, 1)]
    assert fields(node.calls_for("EtcdMemberList")[-1].raw) == [(1, VARINT, 1)]
    assert fields(node.calls_for("EtcdRemoveMemberByID")[-1].raw) == [(1, VARINT, 0x1234ABCD)]
    assert fields(node.calls_for("Reboot")[-1].raw) == [(1, VARINT, 1)]


def test_etcd_recover_streams_the_snapshot_as_common_data_chunks_on_one_call(node, client):
    snapshot = bytes(range(256)) * 9000  # 2.3 MB: three chunks of at most 1 MiB
    client.etcd_recover(snapshot)
    [call] = node.calls_for("EtcdRecover")
    assert call.request.bytes == snapshot  # the stand-in records the upload whole
    assert fields(call.raw) == [(2, LEN, snapshot)]  # common.Data.bytes is field 2
    assert node.recovery_snapshot == snapshot


def test_empty_requests_and_the_node_header(node, client):
    client.version()
    client.service_list()
    client.kubeconfig()
    client.etcd_leave_cluster()
    for call in node.calls:
        assert call.raw == b""
        assert call.metadata["node"] == ["10.5.0.2"]
        assert "nodes" not in call.metadata


def test_several_nodes_go_in_the_nodes_header(node, client):
    reply = client.version(nodes=["10.5.0.2", "10.5.0.3"])
    call = node.calls_for("Version")[-1]
    assert call.metadata["nodes"] == ["10.5.0.2", "10.5.0.3"]
    assert "node" not in call.metadata
    assert [m.metadata.hostname for m in reply.messages] == ["10.5.0.2", "10.5.0.3"]


def test_reply_hand_encoded_at_talos_numbers_parses(node, client):
    # VersionResponse{messages(1): Version{metadata(1): {hostname(1)}, version(2): {tag(1), arch(6)}}}
    version = _len_field(1, _len_field(1, b"10.5.0.2")) + _len_field(2, _len_field(1, b"v1.9.9") + _len_field(6, b"arm64"))
    node.behaviours["Version"] = lambda _node, _request, _context: _len_field(1, version)
    message = client.version().messages[0]
    assert (message.metadata.hostname, message.version.tag, message.version.arch) == ("10.5.0.2", "v1.9.9", "arm64")


def test_per_node_error_in_reply_metadata_raises(node, client):
    # Bootstrap{metadata(1): {hostname(1), error(2)}}: apid reports a failed proxied node this way
    failed = _len_field(1, _len_field(1, b"10.5.0.9") + _len_field(2, b"connection refused"))
    node.behaviours["Bootstrap"] = lambda _node, _request, _context: _len_field(1, failed)
    with pytest.raises(errors.TalosApiError, match=r"10\.5\.0\.9: connection refused"):
        client.bootstrap()
