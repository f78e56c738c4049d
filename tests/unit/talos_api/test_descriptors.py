"""Our .proto files against Talos's published ones for the pinned release, descriptor by descriptor.

tests/data/talos-api/<tag>.pb is Talos's api/common and api/machine (machine, image, lifecycle) compiled at that tag
(scripts/upstream-talos-descriptors.py). Every message, field, enum value, service and method we
define must exist there with the same name, number, type, label and streaming: we may leave out what
we do not call, never differ in what we keep.
"""

from __future__ import annotations


import pytest
from google.protobuf import descriptor_pb2

from talos_proxmox.settings.model import DEFAULT_TALOS_VERSION
from talos_proxmox.talos_api.generated.common import common_pb2
from talos_proxmox.talos_api.generated.machine import image_pb2, lifecycle_pb2, machine_pb2
from tests.paths import DATA

UPSTREAM = DATA / "talos-api" / f"{DEFAULT_TALOS_VERSION}.pb"


def _file_protos(modules) -> list[descriptor_pb2.FileDescriptorProto]:
    protos = []
    for module in modules:
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        protos.append(proto)
    return protos


def _index(files) -> dict[str, object]:
    """Full name -> message, enum, service (and their fields, values, methods) of `files`."""
    found: dict[str, object] = {}

    def messages(prefix, items):
        for message in items:
            name = f"{prefix}.{message.name}"
            found[name] = message
            for field in message.field:
                found[f"{name}#{field.name}"] = field
            messages(name, message.nested_type)
            enums(name, message.enum_type)

    def enums(prefix, items):
        for enum in items:
            name = f"{prefix}.{enum.name}"
            found[name] = enum
            for value in enum.value:
                found[f"{name}#{value.name}"] = value

    for file in files:
        messages(file.package, file.message_type)
        enums(file.package, file.enum_type)
        for service in file.service:
            name = f"{file.package}.{service.name}"
            found[name] = service
            for method in service.method:
                found[f"{name}/{method.name}"] = method
    return found


def _shape(item) -> tuple:
    """What reaches the wire or the method path, nothing else (no options, no comments)."""
    if isinstance(item, descriptor_pb2.FieldDescriptorProto):
        return ("field", item.number, item.type, item.label, item.type_name, item.proto3_optional,
                item.HasField("oneof_index"))
    if isinstance(item, descriptor_pb2.EnumValueDescriptorProto):
        return ("enum value", item.number)
    if isinstance(item, descriptor_pb2.MethodDescriptorProto):
        return ("method", item.input_type, item.output_type, item.client_streaming, item.server_streaming)
    return (type(item).__name__,)


OURS = _index(_file_protos([common_pb2, machine_pb2, image_pb2, lifecycle_pb2]))
THEIRS = _index(descriptor_pb2.FileDescriptorSet.FromString(UPSTREAM.read_bytes()).file)


def test_the_upstream_descriptors_are_talos_api_of_the_pinned_release():
    assert {"machine.MachineService/Upgrade", "machine.MachineService/Version", "common.Metadata#hostname",
            "machine.LifecycleService/Upgrade", "machine.ImageService/Pull"} <= set(THEIRS)
    assert len(THEIRS) > 4 * len(OURS) > 500  # the whole API, of which we keep a subset


@pytest.mark.parametrize("name", sorted(OURS))
def test_each_of_our_descriptors_is_talos_own(name):
    assert name in THEIRS, f"{name} is not in Talos {DEFAULT_TALOS_VERSION}'s API"
    assert _shape(OURS[name]) == _shape(THEIRS[name])


def test_a_changed_field_number_would_be_caught():
    """The comparison sees a number, a type and a streaming flag changed (the check itself is not blind)."""
    ours = _file_protos([machine_pb2])[0]
    field = next(f for m in ours.message_type if m.name == "UpgradeRequest" for f in m.field if f.name == "image")
    method = next(m for s in ours.service for m in s.method if m.name == "Kubeconfig")
    before = (_shape(field), _shape(method))
    field.number += 100
    method.server_streaming = not method.server_streaming
    changed = _index([ours])
    assert _shape(changed["machine.UpgradeRequest#image"]) != _shape(THEIRS["machine.UpgradeRequest#image"])
    assert _shape(changed["machine.MachineService/Kubeconfig"]) != _shape(THEIRS["machine.MachineService/Kubeconfig"])
    assert before == (_shape(THEIRS["machine.UpgradeRequest#image"]), _shape(THEIRS["machine.MachineService/Kubeconfig"]))
