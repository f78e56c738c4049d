"""How the whole program's cost grows with the cluster: `__main__.py` under Pulumi mocks for 9, 90, 900 nodes.

    .venv/bin/python bench/program_under_mocks.py [--sizes 9,90,900]

Each size is a generated stack (the test-cluster's settings, 3 control planes, the rest workers,
every third worker with a data disk) run once in-process, as in tests/test_program.py. Prints the
wall time, the resources registered, the time per node, and each size's per-node time as a ratio
of the smallest size's: a ratio near 1 means the program is linear in the number of nodes.
Bounded: the largest default size takes well under a minute here.
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from components.node import vm_args  # noqa: E402
from talos_proxmox.cluster_plan.resource_inputs import image_facts, machine_config_inputs  # noqa: E402
from talos_proxmox.settings.stack import load_settings  # noqa: E402
from tests.program.mocked_program import run_program, stack_config  # noqa: E402


def generated_stack(nodes: int) -> dict:
    """test-cluster's config with `nodes` nodes in a /16, so that 900 of them have addresses."""
    config = stack_config("test-cluster")
    config["network"] = {"subnet": "10.255.0.0/16", "gateway": "10.255.0.1", "nameservers": ["9.9.9.9"]}
    config["cluster"]["endpoint"] = "https://10.255.0.10:6443"
    first = ipaddress.ip_address("10.255.0.10")
    listed = []
    for i in range(nodes):
        control_plane = i < 3
        node = {
            "name": f"cp-{i + 1}" if control_plane else f"worker-{i - 2}",
            "role": "controlplane" if control_plane else "worker",
            "vmId": 1000 + i,
            "cpu": 1 if control_plane else 3,
            "memory": 2048 if control_plane else 6144,
            "disk": 15,
            "ip": str(first + i),
            "mac": "bc:24:11:" + ":".join(f"{b:02x}" for b in (i + 1).to_bytes(3, "big")),
        }
        if not control_plane and i % 3 == 0:
            node["dataDisk"] = {"size": 30, "device": "/dev/sdb", "mountpoint": "/var/lib/longhorn"}
            node["kernelModules"] = ["iscsi_tcp"]
        listed.append(node)
    config["nodes"] = listed
    return config


def own_code_seconds(config: dict) -> float:
    """The program's own work without the Pulumi SDK: validate settings, compute each node's VM and config inputs."""
    start = time.perf_counter()
    settings = load_settings(config)
    installer = image_facts(settings).installer_image
    for node in settings.nodes:
        vm_args(settings, node, "local:iso/talos.iso")
        machine_config_inputs(settings, node, installer)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="9,90,900", help="comma-separated node counts (default 9,90,900)")
    sizes = [int(s) for s in parser.parse_args().sizes.split(",")]

    run_program(generated_stack(sizes[0]))  # warm-up: imports, pickler caches
    print(f"{'nodes':>6} {'resources':>10} {'seconds':>9} {'ms/node':>9} {'ratio':>6} {'own ms/node':>12}")
    base = None
    for size in sizes:
        config = generated_stack(size)
        gc.collect()
        start = time.perf_counter()
        run = run_program(config)
        elapsed = time.perf_counter() - start
        per_node = elapsed / size
        base = base or per_node
        own = own_code_seconds(config) / size
        print(f"{size:>6} {len(run.registrations):>10} {elapsed:>9.2f} {per_node * 1000:>9.2f} {per_node / base:>6.2f}"
              f" {own * 1000:>12.3f}")
    print("ratio = ms/node of that size / ms/node of the smallest size (1.0 = linear)")
    print("own ms/node = settings validation + VM and machine-config inputs per node, without the Pulumi SDK;")
    print("the rest of ms/node is the SDK registering resources (Outputs, serialization, the mock monitor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
