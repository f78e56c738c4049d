"""Applying configurations to N nodes at once: total time vs the slowest node.

Pulumi creates independent resources in parallel, and the dynamic provider serves each create
on its own thread; this does the same with ConfigurationApplyProvider.create, one thread per node,
against N stand-in Talos nodes on 127.0.0.1 (real TLS, Ed25519) whose ApplyConfiguration answers
after a per-node delay. If applies run concurrently, total / slowest stays near 1 whatever N is;
run one after another it would approach N * mean / slowest (shown for one N as a reference).

    python bench/apply_concurrency.py [--delay 0.4] [--sizes 1,5,20]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from talos_proxmox.talos_config import client_config

from providers import talos_secrets  # noqa: E402
from talos_proxmox.talos_api import operations, resources  # noqa: E402
from talos_proxmox.talos_api.retry import Backoff  # noqa: E402
from tests.talos_api_server import FakeTalosNode  # noqa: E402

CONFIG = "version: v1alpha1\nmachine:\n  type: controlplane\n"


def _apply(node: FakeTalosNode, talosconfig: str) -> float:
    started = time.perf_counter()
    resources.ConfigurationApplyProvider().create({
        "node": "127.0.0.1", "endpoint": node.endpoint, "machine_configuration": CONFIG,
        "talosconfig": talosconfig, "mode": "auto", "timeout_seconds": 60,
    })
    return time.perf_counter() - started


def run(size: int, delay: float, bundle: dict, talosconfig: str, sequential: bool = False) -> tuple[float, float, float]:
    nodes = [FakeTalosNode(bundle, mode="configured", hostname=f"node-{i}") for i in range(size)]
    try:
        for i, node in enumerate(nodes):
            # spread the delays so one node is clearly the slowest
            node.delays["ApplyConfiguration"] = delay * (0.5 + 0.5 * (i + 1) / size)
        started = time.perf_counter()
        if sequential:
            durations = [_apply(node, talosconfig) for node in nodes]
        else:
            with ThreadPoolExecutor(max_workers=size) as pool:
                durations = list(pool.map(lambda node: _apply(node, talosconfig), nodes))
        total = time.perf_counter() - started
        assert all(node.config == CONFIG.encode() for node in nodes)
        return total, max(durations), sum(durations) / len(durations)
    finally:
        for node in nodes:
            node.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.4, help="slowest node's ApplyConfiguration delay, seconds")
    parser.add_argument("--sizes", default="1,5,20", help="comma-separated node counts")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    operations.DEFAULT_BACKOFF = Backoff(initial=0.1, factor=2, maximum=0.5)
    bundle = talos_secrets.generate_secrets("v1.11.5")
    talosconfig = client_config.talosconfig(bundle, "bench", ["127.0.0.1"])
    run(1, 0.0, bundle, talosconfig)  # warm up the TLS bridge loop and grpc

    print(f"{'nodes':>5} {'total s':>8} {'slowest s':>9} {'total/slowest':>13}")
    for size in sizes:
        total, slowest, _mean = run(size, args.delay, bundle, talosconfig)
        print(f"{size:>5} {total:>8.3f} {slowest:>9.3f} {total / slowest:>12.2f}x")
    reference = sizes[min(1, len(sizes) - 1)]
    total, slowest, mean = run(reference, args.delay, bundle, talosconfig, sequential=True)
    print(f"reference, {reference} nodes one after another: total {total:.3f}s = "
          f"{total / slowest:.2f}x the slowest node ({reference} x mean {mean:.3f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
