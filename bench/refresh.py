"""A `pulumi refresh` of a cluster with no drift, against a `pulumi preview` with nothing changed, through the
real Pulumi CLI: wall time of each, their ratio, and how often each node was called by the refresh.

The engine tier's setup (tests/engine/): the real CLI, language host, Proxmox and dynamic-provider plugins
against fakepve, stand-in Talos nodes on 127.0.0.x:50000 and a real Kubernetes control plane. A refresh
reads every VM through the Proxmox plugin and every node's running configuration, version and etcd
membership through our providers; done node by node it would grow with the cluster, done all at once it
stays within a small factor of a preview's fixed cost. Target: refresh / preview at most 2 at 30 nodes,
and no node's read repeated within one refresh (Talos calls per node the same for every node).

    bash scripts/tools.sh && .venv/bin/python bench/refresh.py [--sizes 9,30]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.first_deploy import TALOS, layout  # noqa: E402
from tests.engine.cluster import engine_cluster  # noqa: E402

TARGET = 2.0


def measure(size: int, root: Path) -> dict:
    with tempfile.TemporaryDirectory(dir=root) as scratch, \
            engine_cluster(Path(scratch), layout(size), TALOS) as (cluster, project):
        project.up()
        started = time.perf_counter()
        project.preview("--expect-no-changes")
        preview = time.perf_counter() - started
        before = {name: len(node.calls) for name, node in cluster.nodes.items()}
        started = time.perf_counter()
        run = project.cli("refresh", "--yes", "--skip-preview", "--json", "--stack", project.stack)
        refresh = time.perf_counter() - started
        per_node = {name: len(node.calls) - before[name] for name, node in cluster.nodes.items()}
        changed = {k: v for k, v in run.summary().items() if k != "same"}
        return {"preview": preview, "refresh": refresh, "per_node": per_node, "changed": changed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="9,30")
    args = parser.parse_args()
    print(f"{'nodes':>5}{'preview':>10}{'refresh':>10}{'ratio':>7} (target <= {TARGET}){'Talos calls per node':>24}"
          f"{'changed':>10}")
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-refresh-") as root:
        for size in [int(size) for size in args.sizes.split(",")]:
            found = measure(size, Path(root))
            ratio = found["refresh"] / found["preview"]
            calls = sorted(set(found["per_node"].values()))
            ok = ok and ratio <= TARGET and len(calls) == 1 and not found["changed"]
            print(f"{size:>5}{found['preview']:>9.1f}s{found['refresh']:>9.1f}s{ratio:>7.2f}{'':>16}"
                  f"{'-'.join(map(str, calls)):>24}{str(found['changed'] or 'none'):>10}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
