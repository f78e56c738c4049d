"""The first `pulumi up` of 9 and 30 nodes through the real Pulumi CLI, and a `pulumi preview` with nothing
changed: wall time, how it grows with the nodes' install time, and the calls the stand-ins received.

The engine tier's setup (tests/engine/): .tools/bin/pulumi runs the program with the language host, the
dynamic-provider host and the real Proxmox provider plugin, against fakepve, stand-in Talos nodes on
127.0.0.x:50000 that take T seconds from their first apply to answering configured, and a real
Kubernetes control plane. Each size is deployed twice, with T = BASE and T = BASE + extra; the ratio
(up(T2) - up(T1)) / extra says how many install times the up takes beyond its fixed overhead: about 1
when every node installs at once, whatever the size (nodes waiting in the host's pool of four would
give about size / 4).

    bash scripts/tools.sh && .venv/bin/python bench/first_deploy.py [--extra 5] [--sizes 9,30]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine.cluster import engine_cluster  # noqa: E402

TALOS = "v1.13.7"
BASE = 0.2
TARGET = 1.5


def layout(size: int) -> list[tuple[str, str, str]]:
    """Three control planes, the rest workers, at 127.0.0.10 onwards."""
    return [(f"bench-{'cp' if i < 3 else 'worker'}-{i + 1}", "controlplane" if i < 3 else "worker", f"127.0.0.{10 + i}")
            for i in range(size)]


def deploy(size: int, install_seconds: float, root: Path, *, preview: bool = False) -> dict:
    """A first up of `size` nodes (then, with `preview`, a preview with nothing changed): seconds, calls."""
    with tempfile.TemporaryDirectory(dir=root) as scratch, \
            engine_cluster(Path(scratch), layout(size), TALOS, install_seconds=install_seconds) as (cluster, project):
        started = time.perf_counter()
        project.up()
        result = {"up": time.perf_counter() - started, "pve": len(cluster.pve.requests),
                  "talos": sum(len(node.calls) for node in cluster.nodes.values())}
        if preview:
            before = cluster.counts()
            started = time.perf_counter()
            run = project.preview("--expect-no-changes")
            result.update(preview=time.perf_counter() - started, preview_changes=len(run.changes()),
                          preview_calls=sum(cluster.counts()[k] - before[k] for k in before))
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extra", type=float, default=5.0, help="seconds added to each node's install time")
    parser.add_argument("--sizes", default="9,30")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    t1, t2 = format(BASE, "g"), format(BASE + args.extra, "g")
    print(f"{'nodes':>5}{'up, T=' + t1 + 's':>13}{'up, T=' + t2 + 's':>13}{'ratio':>7} (target < {TARGET})"
          f"{'PVE calls':>11}{'Talos calls':>13}{'no-change preview':>19}{'its calls':>11}")
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-first-deploy-") as root:
        for size in sizes:
            short = deploy(size, BASE, Path(root), preview=True)
            long = deploy(size, BASE + args.extra, Path(root))
            ratio = (long["up"] - short["up"]) / args.extra
            ok = ok and ratio < TARGET and short["preview_changes"] == 0
            print(f"{size:>5}{short['up']:>12.1f}s{long['up']:>12.1f}s{ratio:>7.2f}{'':>14}{short['pve']:>11}"
                  f"{short['talos']:>13}{short['preview']:>18.1f}s{short['preview_calls']:>11}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
