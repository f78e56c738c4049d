"""A `pulumi refresh` of a cluster with no drift, against a `pulumi preview` with nothing changed, through the
real Pulumi CLI: wall time of each, their ratio, what each node was asked by the refresh and how many nodes
were being read at one moment.

The engine tier's setup (tests/engine/): the real CLI, language host, Proxmox and dynamic-provider plugins
against fakepve, stand-in Talos nodes on 127.0.0.x:50000 and a real Kubernetes control plane. A refresh
reads every VM through the Proxmox plugin and every node's running configuration, version and etcd
membership through our providers; done node by node it would grow with the cluster, done all at once it
stays within a small factor of a preview's fixed cost. Target: refresh / preview at most 2 at 30 nodes,
and each node read once (every node of a role asked the same calls, none repeated), and nothing changed.

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


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most of the (start, end) spans that overlap at one moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def measure(size: int, root: Path) -> dict:
    nodes = layout(size)
    with tempfile.TemporaryDirectory(dir=root) as scratch, \
            engine_cluster(Path(scratch), nodes, TALOS) as (cluster, project):
        project.up()
        started = time.perf_counter()
        project.preview("--expect-no-changes")
        preview = time.perf_counter() - started
        before = {name: len(node.calls) for name, node in cluster.nodes.items()}
        started = time.perf_counter()
        run = project.cli("refresh", "--yes", "--skip-preview", "--json", "--stack", project.stack)
        refresh = time.perf_counter() - started
        calls = {name: node.calls[before[name]:] for name, node in cluster.nodes.items()}
        # what each node was asked, by role: the same for every node of a role means each was read once
        asked = {role: {tuple(sorted(c.rpc for c in calls[name])) for name, r, _ in nodes if r == role}
                 for role in ("controlplane", "worker")}
        spans = [(min(c.at for c in node_calls), max(c.at for c in node_calls))
                 for node_calls in calls.values() if node_calls]
        changed = {k: v for k, v in run.summary().items() if k != "same"}
        return {"preview": preview, "refresh": refresh, "asked": asked, "at_once": most_at_once(spans),
                "changed": changed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="9,30")
    args = parser.parse_args()
    print(f"{'nodes':>5}{'preview':>10}{'refresh':>10}{'ratio':>7} (target <= {TARGET}){'nodes read at once':>20}"
          f"{'changed':>10}")
    ok, asked = True, {}
    with tempfile.TemporaryDirectory(prefix="bench-refresh-") as root:
        for size in [int(size) for size in args.sizes.split(",")]:
            found = measure(size, Path(root))
            ratio = found["refresh"] / found["preview"]
            ok = ok and ratio <= TARGET and not found["changed"] and all(len(v) == 1 for v in found["asked"].values())
            asked.update(found["asked"])
            print(f"{size:>5}{found['preview']:>9.1f}s{found['refresh']:>9.1f}s{ratio:>7.2f}{'':>16}"
                  f"{found['at_once']:>20}{str(found['changed'] or 'none'):>10}", flush=True)
    for role, calls in asked.items():
        print(f"each {role} was asked: {' | '.join(', '.join(c) for c in sorted(calls))}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
