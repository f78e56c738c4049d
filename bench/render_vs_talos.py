"""Our Python render against Talos's own Go code, per node: 9 and 30 nodes of a test-cluster-shaped stack.

For each node, ours is `machine_config.render` with the node's patches (what the render command and
`pulumi up` do per node, in-process); Talos's is talos-oracle's `gen-config` with the same bundle, versions,
install disk and image and the same patches as `--config-patch` files, one process per node (what
`talosctl gen config` + `--config-patch` costs a person doing it by hand, process start included). Also
the whole render command per node (settings, schematic, talosconfig, Helm values and files included).
Prints milliseconds per node and the ratios, measured in one run. Needs .tools/bin/talos-oracle-v1.NN
(`bash scripts/tools.sh`).

    python bench/render_vs_talos.py [--line v1.13]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from talos_proxmox.cluster_plan.resource_inputs import image_facts, machine_config_inputs  # noqa: E402
from talos_proxmox.commands import render  # noqa: E402
from talos_proxmox.settings.stack_config import StackConfig, load_stack  # noqa: E402
from talos_proxmox.talos_config import machine_config, secrets_bundle  # noqa: E402
from tests.unit.talos_config import test_talos_oracle as oracle  # noqa: E402
from tests.program.mocked_program import stack_config  # noqa: E402

SIZES = (9, 30)


def stack_of(size: int, line: str) -> dict:
    """test-cluster with `size` nodes: 3 control planes, the rest workers, every third worker with the
    Longhorn data disk and iscsi module; KubeSpan and the CCM on, as in the stack file."""
    config = oracle.for_line(stack_config("test-cluster"), line)
    mount = "/var/mnt/longhorn" if line == "v1.14" else "/var/lib/longhorn"
    nodes = []
    for index in range(size):
        role = "controlplane" if index < 3 else "worker"
        node = {"name": f"node-{index + 1}", "role": role, "vmId": 300 + index, "cpu": 2, "memory": 4096,
                "disk": 15, "ip": f"10.255.200.{11 + index}", "mac": f"bc:24:11:80:b0:{index:02x}"}
        if role == "worker" and index % 3 == 0:
            node.update(dataDisk={"size": 30, "device": "/dev/sdb", "mountpoint": mount}, kernelModules=["iscsi_tcp"])
        nodes.append(node)
    config["nodes"] = nodes
    config["cluster"]["endpoint"] = "https://10.255.200.11:6443"
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--line", choices=list(oracle.LINES), default="v1.13")
    line = parser.parse_args().line
    if not oracle.oracle_path(line).is_file():
        sys.exit(f"{oracle.oracle_path(line)} missing: {oracle.BUILD_HINT}")
    bundle_file = oracle.FIXED_SECRETS
    bundle = secrets_bundle.load_secrets_file(str(bundle_file))

    # The floor of one oracle process (start, exit, nothing generated), to read its per-node time against.
    start = time.perf_counter()
    for _ in range(20):
        oracle.run_oracle(line, "version")
    process_floor = (time.perf_counter() - start) / 20

    print(f"Talos {oracle.LINES[line]} (oracle {oracle.oracle_path(line).name}), ms per node; ratios > 1: ours is faster")
    print(f"{'nodes':>6} {'ours':>9} {'command':>9} {'oracle':>9} {'oracle/ours':>12} {'oracle/command':>15}")
    with tempfile.TemporaryDirectory() as scratch:
        for size in SIZES:
            directory = Path(scratch) / str(size)
            stacks = oracle.write_stack(directory, stack_of(size, line))
            settings = load_stack(StackConfig.from_file(str(stacks / "Pulumi.oracle.yaml")), base_dir=oracle.REPO)
            installer = image_facts(settings).installer_image
            inputs = [machine_config_inputs(settings, node, installer) for node in settings.nodes]

            machine_config.render(bundle, **inputs[0])  # warm-up: imports, caches
            start = time.perf_counter()
            for each in inputs:
                machine_config.render(bundle, **each)
            ours = (time.perf_counter() - start) / size

            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):  # a "wrote <file>" line per file
                status = render.main(["--stack", "oracle", "--out", str(directory / "out"),
                                      "--secrets", str(bundle_file), "--stacks-dir", str(stacks)])
            command = (time.perf_counter() - start) / size
            assert status == 0

            start = time.perf_counter()
            for node, each in zip(settings.nodes, inputs):
                each = {**each, "install_disk": settings.cluster.install_disk, "install_image": installer}
                oracle.run_oracle(line, *oracle.gen_config_args(line, each, bundle_file, directory / "oracle" / node.name))
            talos = (time.perf_counter() - start) / size
            print(f"{size:>6} {ours * 1000:>9.2f} {command * 1000:>9.2f} {talos * 1000:>9.2f} {talos / ours:>12.2f} "
                  f"{talos / command:>15.2f}", flush=True)
    print(f"one oracle process that generates nothing: {process_floor * 1000:.2f} ms")


if __name__ == "__main__":
    main()
