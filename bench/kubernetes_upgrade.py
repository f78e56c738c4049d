"""A Kubernetes minor upgrade of 3 control planes and 6 workers (talos_proxmox.day_two.kubernetes_upgrade, the code
the KubernetesUpgrade resource runs), against the sum of the waits the far side imposes.

Stand-in Talos nodes (real TLS and protobuf) render each control plane's static pods from the configurations
they are sent; a played Kubernetes API reports a static pod Ready only `POD` seconds after its node rendered
it, and a Node's new kubelet only `KUBELET` seconds after the node took its new configuration. Every wait is
sequential by design (one component on one node at a time), so the upgrade can take no less than
9 x POD (3 components on 3 control planes) + 9 x KUBELET (every node); what it takes beyond that is the
program's own cost: pre-pulls, reading and patching configurations, applies, health checks and polling.
Waits and the poll interval are the real ones (a static pod restart ~10 s, a kubelet restart ~10 s, a poll a
second) scaled by `--scale`, which leaves their ratio as it is and makes the per-call costs count more.
Target: upgrade time / sum of waits at most 1.2. The manifest sync is left out (no API server here; the
engine tier runs it).

    .venv/bin/python bench/kubernetes_upgrade.py [--scale 0.2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from talos_proxmox.day_two import kubernetes_upgrade as ku, rolling  # noqa: E402
from talos_proxmox.day_two.rolling import RollNode  # noqa: E402
from talos_proxmox.talos_api import operations  # noqa: E402
from talos_proxmox.talos_api.retry import Backoff  # noqa: E402
from talos_proxmox.talos_config import client_config, machine_config, secrets_bundle  # noqa: E402
from tests.stand_ins.talos_api import config_images  # noqa: E402
from tests.support.day_two import stand_in_cluster  # noqa: E402

TARGET = 1.2
TALOS, OLD, NEW = "v1.13.7", "1.35.4", "1.36.3"
POD, KUBELET, POLL = 10.0, 10.0, 1.0  # seconds, before scaling
LAYOUT = [(f"cp-{i}", "controlplane") for i in (1, 2, 3)] + [(f"worker-{i}", "worker") for i in range(1, 7)]
INSTALL = [{"machine": {"install": {"disk": "/dev/sda"}}}]


class DelayedKubeApi:
    """Pods and Nodes as the stand-ins run them, each new state visible only after its wait."""

    def __init__(self, nodes: dict, fakes: dict, pod: float, kubelet: float):
        self.nodes, self.fakes, self.pod, self.kubelet = nodes, fakes, pod, kubelet
        self.rendered_at: dict[tuple[str, str], float] = {}
        self.kubelet_at: dict[str, tuple[str, float]] = {}
        self.kubelet_before: dict[str, str] = {}

    def get(self, path: str):
        now = time.monotonic()
        if path.startswith("/api/v1/nodes/"):
            name = path.rsplit("/", 1)[1]
            version, at = self.kubelet_at.get(name, (self.kubelet_before[name], 0.0))
            shown = version if now >= at + self.kubelet else self.kubelet_before[name]
            return {"status": {"nodeInfo": {"kubeletVersion": shown}, "conditions": [{"type": "Ready", "status": "True"}]}}
        component = path.rsplit("%3D", 1)[1]
        items = []
        for name, fake in self.fakes.items():
            if component not in fake.static_pods:
                continue
            image, version = fake.static_pods[component]
            ready = now >= self.rendered_at.get((name, component), 0.0) + self.pod
            items.append({"metadata": {"annotations": {ku.CONFIG_VERSION_ANNOTATION: str(version)}},
                          "status": {"hostIP": self.nodes[name].address,
                                     "conditions": [{"type": "Ready", "status": str(ready)}]}})
        return {"items": items}


def kubelet_tag(config: bytes) -> str:
    return config_images(list(yaml.safe_load_all(config))).get("kubelet", "").rsplit(":", 1)[-1]


def measure(scale: float) -> dict:
    bundle = secrets_bundle.generate_secrets(TALOS)
    nodes, fakes = stand_in_cluster(bundle, [(name, f"10.5.0.{i}", role) for i, (name, role) in enumerate(LAYOUT, 1)],
                                    version_tag=TALOS)
    render = {(name, version): machine_config.render(bundle, "bench", "https://127.0.0.120:6443", role, TALOS, version,
                                                     INSTALL) for name, role in LAYOUT for version in (OLD, NEW)}
    kube = DelayedKubeApi(nodes, fakes, POD * scale, KUBELET * scale)
    for name, fake in fakes.items():
        fake.config = render[(name, OLD)].encode()
        fake._config_taken(fake.config)
        fake.on_static_pod = lambda node, component, image, version: kube.rendered_at.__setitem__(
            (node.hostname, component), time.monotonic())
        fake.on_kubelet = lambda node, image: kube.kubelet_at.__setitem__(
            node.hostname, (image.rsplit(":", 1)[-1], time.monotonic()))
        kube.kubelet_before[name] = kubelet_tag(fake.config)
    talosconfig = client_config.talosconfig(bundle, "bench", [fake.endpoint for fake in fakes.values()])

    def apply_node(node: RollNode) -> None:  # what the KubernetesUpgrade provider does for the kubelet step
        operations.apply_machine_configuration(node.address, render[(node.name, NEW)], talosconfig, endpoint=node.dial,
                                               mode="auto", insecure_first=False, timeout=60)
        with rolling.client_for(node, talosconfig) as client:
            rolling.wait_healthy(client, node, timeout=60)

    try:
        started = time.monotonic()
        ku.upgrade(list(nodes.values()), {name: render[(name, NEW)] for name, _ in LAYOUT}, NEW,
                   client_for=lambda node: rolling.client_for(node, talosconfig), kube=kube, apply_node=apply_node,
                   sync_manifests=lambda client: None, timeout=120,
                   backoff=Backoff(initial=POLL * scale, factor=1.0, maximum=POLL * scale),
                   on_event=lambda what, node: None)
        took = time.monotonic() - started
    finally:
        for fake in fakes.values():
            fake.stop()
    waits = 9 * POD * scale + len(LAYOUT) * KUBELET * scale
    calls = {name: len(fake.calls) for name, fake in fakes.items()}
    return {"took": took, "waits": waits, "calls": calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.2)
    args = parser.parse_args()
    found = measure(args.scale)
    ratio = found["took"] / found["waits"]
    print(f"3 control planes + 6 workers, {OLD} -> {NEW}, waits scaled by {args.scale}: "
          f"upgrade {found['took']:.1f}s, sum of waits {found['waits']:.1f}s, ratio {ratio:.2f} (target <= {TARGET})")
    print("Talos calls per node: " + ", ".join(f"{name} {count}" for name, count in found["calls"].items()))
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
