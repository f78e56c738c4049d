"""The committed stubs are what protoc makes from our protos, and carry Talos's method paths.

Whether our protos match Talos's (numbers, types, labels, streaming) is checked against the
published descriptors in tests/test_talos_api_descriptors.py.
"""

from pathlib import Path

from talos_proxmox.talos_api import generate
from talos_proxmox.talos_api.generated.machine import machine_pb2


def test_stub_paths_are_the_talos_method_paths():
    stub_source = (generate.GENERATED_DIR / "machine" / "machine_pb2_grpc.py").read_text()
    service = machine_pb2.DESCRIPTOR.services_by_name["MachineService"]
    assert len(service.methods) >= 11
    for method in service.methods:
        assert f"'/machine.MachineService/{method.name}'" in stub_source


def test_committed_stubs_equal_a_fresh_generation(tmp_path: Path):
    fresh = generate.generate(tmp_path)
    committed = sorted(p for p in generate.GENERATED_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    assert [p.relative_to(tmp_path) for p in fresh] == [p.relative_to(generate.GENERATED_DIR) for p in committed]
    for new, old in zip(fresh, committed):
        assert new.read_bytes() == old.read_bytes(), f"{old} is stale: run python -m talos_proxmox.talos_api.generate"
