"""Every node's machine config rendered before anything is touched, so a patch that cannot apply stops
the stack at `pulumi preview` (or the render command) instead of half-way through the first `pulumi up`.

`node_config_problems(settings)` applies each node's patches in order to its role's defaults, the way the
MachineConfiguration resource does, and returns one message per problem, named by the stack key that holds
the patch (`talos-proxmox:cluster.patches[0]: node dev-worker-1: operation 1 (remove /machine/foo) ...`).
A problem only visible once all patches are in (the role changed, a bad hostname) is blamed on the user
patch from which it stayed. Messages never quote patch values. No Pulumi import.
"""

from __future__ import annotations

import functools

from talos_proxmox.cluster_plan.node_patches import DERIVED, labeled_node_patches
from talos_proxmox.cluster_plan.resource_inputs import image_facts
from talos_proxmox.day_two.kubernetes_removals import config_problems as removed_in_kubernetes
from talos_proxmox.settings.model import PROJECT, NodeSettings, Settings
from talos_proxmox.settings.values import is_dns_name
from talos_proxmox.talos_config import machine_config, secrets_bundle



@functools.lru_cache(maxsize=4)
def _placeholder_bundle(talos_version: str) -> dict:
    # Patches apply the same whatever the keys are; the real bundle exists only once the stack runs.
    return secrets_bundle.generate_secrets(talos_version)


def _name_problems(documents: list[dict]) -> list[str]:
    """Names Talos would pass on to the kernel, DNS and Kubernetes: hostname and cluster DNS domain (a
    hostname in machine.network is refused next to the HostnameConfig every node gets)."""
    problems = []
    for document in documents:
        if document.get("kind") == "HostnameConfig" and "hostname" in document \
                and not is_dns_name(document["hostname"], 63):
            problems.append("HostnameConfig hostname is not a DNS hostname (expected lowercase letters, digits "
                            "and '-', at most 63)")
        if document.get("kind") == "KubeNetworkConfig":
            domain, where = document.get("dnsDomain"), "KubeNetworkConfig dnsDomain"
        elif machine_config.document_id(document) == ("", "v1alpha1", ""):
            domain, where = ((document.get("cluster") or {}).get("network") or {}).get("dnsDomain"), \
                "cluster.network.dnsDomain"
        else:
            continue
        if domain is not None and not is_dns_name(domain, 253):
            problems.append(f"{where} is not a DNS domain (expected lowercase labels, e.g. cluster.local)")
    return problems


KUBELET_FLAVOURS = ("-fat", "-slim")  # Sidero Labs' kubelet image comes in both (the plain tag is one of them)


def pinned_image_problems(documents: list[dict], kubernetes_version: str) -> list[str]:
    """A component image a patch pins at another Kubernetes version: it would not move with
    cluster.kubernetesVersion (an upgrade would leave that component behind, outside the skew policy)."""
    problems = []
    for component, where, image in machine_config.component_settings(documents, "image"):
        name = str(image or "").split("@", 1)[0]
        tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
        version = tag.lstrip("v")
        flavour = next((f for f in KUBELET_FLAVOURS if component == "kubelet" and version.endswith(f)), "")
        version = version.removesuffix(flavour)
        if version and version != kubernetes_version.lstrip("v"):
            problems.append(f"{where} is pinned at {tag}, and cluster.kubernetesVersion is {kubernetes_version}: a "
                            f"pinned {component} would stay behind on upgrades (tag it v{kubernetes_version.lstrip('v')}"
                            f"{flavour})")
    return problems


def _state_problems(documents: list[dict], role: str, kubernetes_version: str) -> list[str]:
    """What is wrong with the config as it stands; [] when Talos (and the Kubernetes it runs) would take it."""
    try:
        final = machine_config.finalize([dict(d) for d in documents], role)
    except machine_config.MachineConfigError as err:
        return [line.strip()[2:] for line in str(err).splitlines()[1:]] or [str(err)]
    return (_name_problems(final) + removed_in_kubernetes(final, kubernetes_version)
            + pinned_image_problems(final, kubernetes_version))


def _node_problems(settings: Settings, index: int, node: NodeSettings,
                   installer_image: str) -> list[tuple[str, str]]:
    """(stack key, problem) for one node."""
    c = settings.cluster
    documents = machine_config.default_documents(
        _placeholder_bundle(c.talos_version), c.name, c.endpoint, node.role, c.talos_version, c.kubernetes_version)
    states: list[tuple[str, list[str]]] = []  # after each user patch: its label and what is wrong then
    for number, (label, patch) in enumerate(labeled_node_patches(settings, node, installer_image), start=1):
        try:
            documents = machine_config.apply_patch(documents, patch, label)
        except machine_config.MachineConfigError as err:
            if label == DERIVED:  # a combination of typed settings Talos cannot take
                return [(f"nodes[{index}]", f"the settings' own patch {number} does not apply: "
                                            f"{str(err).removeprefix(f'{label}: ')}")]
            return [(label, str(err).removeprefix(f"{label}: "))]
        if label != DERIVED:
            states.append((label, _state_problems(documents, node.role, c.kubernetes_version)))
    final = states[-1][1] if states else []
    if not final:
        return []
    # Blame the earliest patch from which the config stayed broken.
    blamed = len(states) - 1
    while blamed > 0 and states[blamed - 1][1]:
        blamed -= 1
    return [(states[blamed][0], "leaves the machine config invalid: " + "; ".join(final))]


def node_config_problems(settings: Settings) -> list[str]:
    """One line per patch problem over all nodes; a cluster or role patch failing the same way on several
    nodes is one line naming them."""
    installer_image = image_facts(settings).installer_image
    found: dict[tuple[str, str], list[str]] = {}
    for index, node in enumerate(settings.nodes):
        for label, problem in _node_problems(settings, index, node, installer_image):
            found.setdefault((label, problem), []).append(node.name)
    lines = []
    for (label, problem), names in found.items():
        who = f"node {names[0]}" if len(names) == 1 else f"nodes {', '.join(names)}"
        lines.append(f"{PROJECT}:{label}: {who}: {problem}")
    return lines
