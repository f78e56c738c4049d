"""How machine-config rendering scales: 10, 100 and 1000 nodes from one secrets bundle.

Each node gets the seed walkthrough's patches (install, role patch, a static interface by MAC), so
this is the per-node work of a preview/up. Prints the time per node for each size and the ratios
between sizes (flat per-node cost = linear scaling), plus the one-off cost of the bundle and of a
talosconfig, all measured in this run.

    python bench/render_configs.py
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from talos_proxmox.talos_config import machine_config

from providers import talos_client  # noqa: E402
from talos_proxmox.talos_config.secrets_bundle import generate_secrets  # noqa: E402
from tests.support import seed_cluster as seed  # noqa: E402

SIZES = (10, 100, 1000)


def synthetic_nodes(count: int) -> list[dict]:
    """3 control planes, the rest workers, every third worker with the data disk; unique IPs and MACs."""
    nodes = []
    for index in range(count):
        role = "controlplane" if index < 3 else "worker"
        nodes.append({
            "name": f"node-{index}",
            "role": role,
            "ip": f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255 or 1}",
            "mac": "bc:24:11:{:02x}:{:02x}:{:02x}".format((index >> 16) & 255, (index >> 8) & 255, index & 255),
            "data_disk": role == "worker" and index % 3 == 0,
        })
    return nodes


def render_all(bundle: dict, nodes: list[dict]) -> tuple[float, int]:
    start = time.perf_counter()
    total_bytes = 0
    for node in nodes:
        text = machine_config.render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, node["role"], seed.TALOS_VERSION,
                                     seed.KUBERNETES_VERSION, seed.node_patches(node))
        total_bytes += len(text)
    return time.perf_counter() - start, total_bytes


def main() -> None:
    start = time.perf_counter()
    bundle = generate_secrets(seed.TALOS_VERSION)
    bundle_seconds = time.perf_counter() - start

    start = time.perf_counter()
    talos_client.talosconfig(bundle, seed.CLUSTER_NAME, ["10.255.200.201"], [])
    talosconfig_seconds = time.perf_counter() - start

    render_all(bundle, synthetic_nodes(10))  # warm-up: imports, regex compilation, caches

    per_node: dict[int, float] = {}
    print(f"{'nodes':>6} {'total s':>9} {'ms/node':>9} {'KiB/node':>9}")
    for size in SIZES:
        seconds, total_bytes = render_all(bundle, synthetic_nodes(size))
        per_node[size] = seconds / size
        print(f"{size:>6} {seconds:>9.3f} {per_node[size] * 1000:>9.3f} {total_bytes / size / 1024:>9.1f}")

    print()
    for small, large in zip(SIZES, SIZES[1:]):
        print(f"per-node cost ratio {large} vs {small} nodes: {per_node[large] / per_node[small]:.2f} "
              f"(1.00 = linear); total time ratio: {per_node[large] * large / (per_node[small] * small):.1f}x "
              f"for {large // small}x nodes")
    print(f"one-off: secrets bundle {bundle_seconds * 1000:.0f} ms "
          f"(= {bundle_seconds / per_node[SIZES[-1]]:.0f} node renders), "
          f"talosconfig {talosconfig_seconds * 1000:.1f} ms")


if __name__ == "__main__":
    main()
