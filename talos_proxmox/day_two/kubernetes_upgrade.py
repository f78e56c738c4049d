"""A Kubernetes version change, made the way `talosctl upgrade-k8s` makes it (siderolabs/talos
pkg/cluster/kubernetes/talos_managed.go), so no component ever runs newer than an API server it talks to
(Kubernetes' version skew policy) and the cluster keeps serving throughout:

  1. pre-pull: every control plane pulls the new kube-apiserver, kube-controller-manager and
     kube-scheduler images (the CRI containerd), every node the new kubelet (the system containerd);
  2. kube-apiserver on every control plane, then kube-controller-manager on every control plane, then
     kube-scheduler: each node's running configuration with that one image changed, applied without a
     reboot, then a wait for its static pod of the new config version to be Ready in the API;
  3. kube-proxy's image in each control plane's configuration (its DaemonSet rolls with step 5);
  4. each node in roll order (control planes first) takes its whole new configuration (the new kubelet),
     healthy again and its Node reporting the new kubelet version before the next;
  5. the bootstrap manifests the first control plane renders (CoreDNS, kube-proxy, RBAC) are synced into
     the cluster (talos_proxmox.day_two.bootstrap_manifests).

A step whose node already runs the new image is skipped, so an up stopped half-way (a node that failed,
the CLI killed) starts again at the first component not yet upgraded. No Pulumi here; clients, clock and
sleep are injectable.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, ContextManager, Iterable, Mapping, Optional, Sequence

import yaml

from talos_proxmox.day_two.cluster_health import KubeApi, KubeApiError
from talos_proxmox.day_two.rolling import CALL_TIMEOUT, Event, NodeNotHealthy, RollError, RollNode, roll_order
from talos_proxmox.talos_api import errors
from talos_proxmox.talos_api.client import TalosClient
from talos_proxmox.talos_api.retry import Backoff, GaveUp, call_with_retry

STATIC_PODS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
# Where each component's image is in a configuration: the v1alpha1 document's path, or (Talos 1.14's
# multi-document form) the `image` of a document of its own kind.
IMAGE_PATHS = {"kube-apiserver": ("cluster", "apiServer"), "kube-controller-manager": ("cluster", "controllerManager"),
               "kube-scheduler": ("cluster", "scheduler"), "kube-proxy": ("cluster", "proxy"),
               "kubelet": ("machine", "kubelet")}
IMAGE_DOCUMENTS = {"kube-apiserver": "KubeAPIServerConfig", "kube-controller-manager": "KubeControllerManagerConfig",
                   "kube-scheduler": "KubeSchedulerConfig", "kube-proxy": "KubeProxyConfig", "kubelet": "KubeletConfig"}
# The control plane's COSI resource Talos renders each static pod from: its version is what the pod's
# talos.dev/config-version annotation carries once the kubelet runs the new pod.
CONFIG_RESOURCES = {"kube-apiserver": "APIServerConfigs.kubernetes.talos.dev",
                    "kube-controller-manager": "ControllerManagerConfigs.kubernetes.talos.dev",
                    "kube-scheduler": "SchedulerConfigs.kubernetes.talos.dev"}
CONFIG_NAMESPACE = "controlplane"
CONFIG_VERSION_ANNOTATION = "talos.dev/config-version"
MACHINE_CONFIG = ("config", "MachineConfigs.config.talos.dev", "v1alpha1")
STATIC_POD_TIMEOUT = 300.0  # talosctl's wait for one static pod
# The waits (a static pod rendered and Ready, a Node's kubelet) poll once a second: each is seconds to tens of
# seconds, and one GET a second is nothing to the API server, where a growing backoff would add up across the
# cluster's 3 x control planes + nodes sequential waits (bench/kubernetes_upgrade.py).
WAIT_POLL = Backoff(initial=1.0, factor=1.0, maximum=1.0)
KUBELET_NODE_TIMEOUT = 180.0  # and for a Node to report its new kubelet


# --- configurations (pure) ---------------------------------------------------------------------------


def _documents(config: str) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(config) if doc is not None]


def _image_holder(documents: Sequence[Any], component: str) -> Optional[dict]:
    """The mapping whose `image` is `component`'s: its own document, else under the v1alpha1 document."""
    for doc in documents:
        if isinstance(doc, dict) and doc.get("kind") == IMAGE_DOCUMENTS[component]:
            return doc
    for doc in documents:
        if isinstance(doc, dict) and doc.get("version") == "v1alpha1":
            holder = doc
            for key in IMAGE_PATHS[component]:
                holder = holder.get(key) if isinstance(holder, dict) else None
            return holder if isinstance(holder, dict) else None
    return None


def component_image(config: str, component: str) -> Optional[str]:
    """The image `config` gives `component` (kube-apiserver, ..., kube-proxy, kubelet), or None."""
    holder = _image_holder(_documents(config), component)
    return holder.get("image") if holder else None


def with_component_image(config: str, component: str, image: str) -> str:
    """`config` with `component`'s image set to `image`, nothing else changed (as upgrade-k8s patches the
    running configuration). A configuration without a place for it is an error, not a guess."""
    documents = _documents(config)
    holder = _image_holder(documents, component)
    if holder is None:
        raise ValueError(f"the configuration has no {component} section to set its image in")
    holder["image"] = image
    return yaml.safe_dump_all(documents, sort_keys=False)


def proxy_enabled(config: str) -> bool:
    """Whether the configuration runs kube-proxy (off under Cilium's kube-proxy replacement)."""
    documents = _documents(config)
    for doc in documents:
        if isinstance(doc, dict) and doc.get("version") == "v1alpha1":
            if ((doc.get("cluster") or {}).get("proxy") or {}).get("disabled"):
                return False
        if isinstance(doc, dict) and doc.get("kind") == IMAGE_DOCUMENTS["kube-proxy"]:
            if doc.get("enabled") is False:  # Talos 1.14's own document: on unless it says otherwise
                return False
    return _image_holder(documents, "kube-proxy") is not None


def pre_pulls(nodes: Iterable[RollNode], configs: Mapping[str, str]) -> list[tuple[RollNode, str, str]]:
    """(node, containerd namespace, image) in talosctl's order: each static pod's image on each control
    plane, then the kubelet's on each node, control planes first."""
    ordered = roll_order(nodes)
    control_planes = [node for node in ordered if node.role == "controlplane"]
    pulls = [(node, "cri", component_image(configs[node.name], component))
             for component in STATIC_PODS for node in control_planes]
    pulls += [(node, "system", component_image(configs[node.name], "kubelet")) for node in ordered]
    return [(node, namespace, image) for node, namespace, image in pulls if image]


# --- one node's steps ---------------------------------------------------------------------------------


def _spec(resource) -> dict:
    spec = yaml.safe_load(resource.spec.yaml_spec or "") or {}
    return spec if isinstance(spec, dict) else {}


def _running_config(client: TalosClient, node: RollNode, timeout: float) -> str:
    return client.get_resource(*MACHINE_CONFIG, timeout=min(timeout, CALL_TIMEOUT), node=node.address).spec.yaml_spec


def _apply_running_with(client: TalosClient, node: RollNode, component: str, image: str, timeout: float) -> None:
    """The node's running configuration with `component`'s image changed, applied without a reboot."""
    patched = with_component_image(_running_config(client, node, timeout), component, image)
    client.apply_configuration(patched, mode="no-reboot", timeout=min(timeout, CALL_TIMEOUT), node=node.address)


def static_pod_problem(pods: Optional[Mapping], node: RollNode, version: str) -> Optional[str]:
    """None once a pod of `pods` (a PodList) on `node` carries config version `version` and is Ready; else
    what was seen."""
    seen = []
    for pod in (pods or {}).get("items") or ():
        status = pod.get("status") or {}
        if status.get("hostIP") != node.address:
            continue
        got = ((pod.get("metadata") or {}).get("annotations") or {}).get(CONFIG_VERSION_ANNOTATION)
        ready = _ready(status)
        if got == version and ready:
            return None
        seen.append(f"config version {got}, {'Ready' if ready else 'not Ready'}")
    return "; ".join(seen) or "no pod on the node"


def _ready(status: Mapping) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


def _wait(check: Callable[[], Optional[str]], node: RollNode, what: str, *, timeout: float, backoff: Backoff,
          clock: Callable[[], float], sleep: Callable[[float], None]) -> None:
    """Until `check` finds no problem; RollError naming `what` and the last problem at the deadline."""
    def attempt(_remaining: float) -> None:
        problem = check()
        if problem:
            raise NodeNotHealthy(problem)

    try:
        call_with_retry(attempt, timeout=timeout, what=what, backoff=backoff, retry_if=_retry_while_waiting,
                        clock=clock, sleep=sleep)
    except GaveUp as exc:
        raise RollError(node, f"{what}: not after {timeout:g}s ({exc.last_error})") from None
    except KubeApiError as exc:
        raise RollError(node, f"{what}: {exc}") from None


def upgrade_static_pod(client: TalosClient, kube: KubeApi, node: RollNode, component: str, image: str, *,
                       timeout: float, backoff: Backoff, on_event: Event,
                       clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """`component` on `node` to `image`, then Ready in the API at the config version Talos rendered it with
    (no apply when the node already renders it with `image`)."""
    resource_type = CONFIG_RESOURCES[component]

    def rendered():
        return client.get_resource(CONFIG_NAMESPACE, resource_type, component, timeout=min(timeout, CALL_TIMEOUT),
                                   node=node.address)

    before = rendered()
    versions: list[str] = [before.metadata.version]
    wait = dict(backoff=backoff, clock=clock, sleep=sleep)
    if _spec(before).get("image") == image:
        # Already rendered (an earlier up stopped after it): still Ready before the next step goes on.
        on_event(f"{component} already at {image}", node.name)
    else:
        on_event(f"{component} -> {image}", node.name)
        _apply_running_with(client, node, component, image, timeout)

        def new_version() -> Optional[str]:
            found = rendered()
            if _spec(found).get("image") != image or found.metadata.version == before.metadata.version:
                return f"Talos has not rendered {component} with {image} yet"
            versions[:] = [found.metadata.version]
            return None

        _wait(new_version, node, f"{component} rendered with {image}", timeout=timeout, **wait)
    pods = f"/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3D{component}"
    _wait(lambda: static_pod_problem(kube.get(pods), node, versions[0]), node,
          f"{component} pod at config version {versions[0]} Ready", timeout=min(timeout, STATIC_POD_TIMEOUT), **wait)
    on_event(f"{component} ready (config version {versions[0]})", node.name)


def patch_proxy(client: TalosClient, node: RollNode, image: str, *, timeout: float, on_event: Event) -> None:
    """kube-proxy's image in `node`'s configuration; its DaemonSet rolls out with the manifest sync."""
    if component_image(_running_config(client, node, timeout), "kube-proxy") == image:
        on_event(f"kube-proxy already at {image}", node.name)
        return
    on_event(f"kube-proxy -> {image}", node.name)
    _apply_running_with(client, node, "kube-proxy", image, timeout)


def kubelet_problem(found: Optional[Mapping], version: str) -> Optional[str]:
    """None once the Node `found` reports kubelet `version` and Ready; else what it reports."""
    if found is None:
        return "its Node is not registered"
    status = found.get("status") or {}
    running = (status.get("nodeInfo") or {}).get("kubeletVersion")
    if running != version:
        return f"its Node reports kubelet {running}"
    return None if _ready(status) else "its Node is not Ready"


def _retry_while_waiting(error: BaseException) -> bool:
    return isinstance(error, NodeNotHealthy) or errors.transient_while_rebooting(error) or (
        isinstance(error, KubeApiError) and error.retryable)


# --- the whole upgrade ------------------------------------------------------------------------------


def upgrade(nodes: Sequence[RollNode], configs: Mapping[str, str], version: str, *,
            client_for: Callable[[RollNode], TalosClient], kube: KubeApi, apply_node: Callable[[RollNode], None],
            sync_manifests: Callable[[TalosClient], None], timeout: float, backoff: Backoff, on_event: Event,
            guard: Callable[[str, RollNode], ContextManager] = lambda _what, _node: contextlib.nullcontext(),
            clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Upgrade the cluster of `nodes` to Kubernetes `version`, `configs` being each node's new configuration
    (by name). `apply_node` sends a node its whole new configuration and waits until it is healthy (the
    kubelet step); `sync_manifests` syncs the bootstrap manifests through the first control plane's client.
    Each step on a node runs inside `guard(what, node)` (the cluster's operations lock). The first failure
    raises RollError naming the node and the component."""
    ordered = roll_order(nodes)
    control_planes = [node for node in ordered if node.role == "controlplane"]
    kubelet_version = f"v{version.lstrip('v')}"
    wait = dict(backoff=backoff, clock=clock, sleep=sleep)
    clients: dict[str, TalosClient] = {}

    def on(node: RollNode, what: str, step: Callable[[TalosClient], None]) -> None:
        """`step` with `node`'s client; a Talos API error stops the upgrade naming the node and `what`."""
        if node.name not in clients:
            clients[node.name] = client_for(node)
        try:
            with guard(what, node):
                step(clients[node.name])
        except errors.TalosApiError as exc:
            raise RollError(node, f"{what} failed: {exc}") from None

    def pre_pull(node: RollNode, namespace: str, image: str) -> None:
        on_event(f"pre-pull {image}", node.name)

        def pull(client: TalosClient) -> None:
            try:
                client.image_pull(image, namespace=namespace, timeout=timeout, node=node.address)
            except errors.TalosApiError as exc:
                if exc.code is None or exc.code.name != "UNIMPLEMENTED":
                    raise
                on_event("pre-pull skipped: the node does not pull on request", node.name)
        on(node, f"pre-pulling {image}", pull)

    try:
        for node, namespace, image in pre_pulls(ordered, configs):
            pre_pull(node, namespace, image)
        for component in STATIC_PODS:
            for node in control_planes:
                image = component_image(configs[node.name], component)
                on(node, f"upgrading {component}", lambda client: upgrade_static_pod(
                    client, kube, node, component, image, timeout=timeout, on_event=on_event, **wait))
        for node in control_planes:
            if proxy_enabled(configs[node.name]):
                image = component_image(configs[node.name], "kube-proxy")
                on(node, "setting kube-proxy's image", lambda client: patch_proxy(
                    client, node, image, timeout=timeout, on_event=on_event))
        for node in ordered:
            on_event(f"kubelet -> {component_image(configs[node.name], 'kubelet')}", node.name)
            with guard("kubelet upgrade", node):
                apply_node(node)
            _wait(lambda: kubelet_problem(kube.get(f"/api/v1/nodes/{node.name}"), kubelet_version), node,
                  f"its Node reporting kubelet {kubelet_version}", timeout=min(timeout, KUBELET_NODE_TIMEOUT), **wait)
            on_event(f"kubelet {kubelet_version} ready", node.name)
        on(control_planes[0], "syncing the bootstrap manifests", sync_manifests)
    finally:
        for opened in clients.values():
            opened.close()
