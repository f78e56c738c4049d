"""The first `pulumi up` of 9 and 30 nodes: how its time grows with the nodes' install time.

Runs the real program through the in-process engine of the end-to-end tests (tests/e2e_engine.py:
the dynamic providers for real, at most four provider calls at once as the dynamic-provider host
serves them) against stand-in Talos nodes on 127.0.0.x:50000 that take T seconds from their first
apply to answering configured. Each size is deployed twice, with T = BASE and with T = BASE + extra;
the ratio (up(T2) - up(T1)) / extra says how many install times the up takes beyond its fixed
overhead. Every node installing at once gives about 1 or less (the rest of the up overlaps the
installs), whatever the size. For reference, the same up with each first apply waiting for its own
node's install (how it was before NodesInstalled) shows the waves of four: about ceil(size / 4).

    python bench/first_deploy.py [--extra 5] [--sizes 9,30] [--no-reference]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from providers import talos_operations  # noqa: E402
from tests.e2e_engine import e2e_cluster, e2e_config  # noqa: E402

TALOS = "v1.13.7"
BASE = 0.2
TARGET = 1.5


class _Scratch:
    """What e2e_cluster needs of pytest's tmp_path_factory."""

    def __init__(self, root: str) -> None:
        self.root, self.count = Path(root), 0

    def mktemp(self, name: str) -> Path:
        self.count += 1
        path = self.root / f"{name}{self.count}"
        path.mkdir()
        return path


def layout(size: int) -> list[tuple[str, str, str]]:
    """Three control planes, the rest workers, at 127.0.0.10 onwards."""
    return [(f"bench-{'cp' if i < 3 else 'worker'}-{i + 1}", "controlplane" if i < 3 else "worker", f"127.0.0.{10 + i}")
            for i in range(size)]


@contextlib.contextmanager
def _applies_wait_for_their_node():
    """The reference: every first apply holds its provider call until its own node has installed."""
    apply = talos_operations.operations.apply_machine_configuration

    def waiting(*args, **kwargs):
        return apply(*args, **{**kwargs, "wait": True})

    talos_operations.operations.apply_machine_configuration = waiting
    try:
        yield
    finally:
        talos_operations.operations.apply_machine_configuration = apply


def first_up(size: int, install_seconds: float, scratch: _Scratch, *, reference: bool = False) -> float:
    nodes = layout(size)
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), \
            (_applies_wait_for_their_node() if reference else contextlib.nullcontext()), \
            e2e_cluster(nodes, TALOS, scratch, install_seconds=install_seconds) as cluster:
        config = e2e_config(cluster.factory.url, nodes, TALOS)
        started = time.perf_counter()
        cluster.up(config)
        return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extra", type=float, default=5.0, help="seconds added to each node's install time")
    parser.add_argument("--sizes", default="9,30")
    parser.add_argument("--no-reference", action="store_true", help="skip the waves-of-four reference runs")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    t1, t2 = format(BASE, "g"), format(BASE + args.extra, "g")
    print(f"{'':<22}{'nodes':>6}{'up, T=' + t1 + 's':>14}{'up, T=' + t2 + 's':>14}{'ratio':>8}   target < {TARGET}")
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-first-deploy-") as root:
        scratch = _Scratch(root)
        for size in sizes:
            for reference in ((False,) if args.no_reference else (False, True)):
                short = first_up(size, BASE, scratch, reference=reference)
                long = first_up(size, BASE + args.extra, scratch, reference=reference)
                ratio = (long - short) / args.extra
                if not reference:
                    ok = ok and ratio < TARGET
                label = "each apply waits" if reference else "NodesInstalled"
                print(f"{label:<22}{size:>6}{short:>13.1f}s{long:>13.1f}s{ratio:>8.2f}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
