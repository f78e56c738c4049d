"""Render a Talos machine configuration: `talosctl gen config` defaults for one role, then patches.

`render(secrets, cluster_name, endpoint, role, talos_version, kubernetes_version, patches)` returns
the complete multi-document YAML for a `controlplane` or `worker` node of Talos contract v1.12, v1.13
or v1.14, byte-for-byte in the layout talosctl writes with `--with-docs=false --with-examples=false`
(same inputs always give the same bytes, so a diff of two renders is exactly the change).

Defaults are those of `talosctl gen config` for the contract (siderolabs/talos v1.13.7 and v1.14.0-rc.1
pkg/machinery/config/generate and the v1.12/v1.13/v1.14 stability fixtures; from v1.14 each Kubernetes
setting is a document of its own, and Talos refuses the legacy v1alpha1 field beside it), with one deliberate
difference: the install disk is not defaulted to /dev/sda. Guessing the disk wipes the wrong one or
fails late; a patch must set `machine.install.disk` (or `diskSelector`), otherwise render refuses.

Patches are applied in order, as `talosctl --config-patch` does:
  - strategic merge: a dict, or YAML text with one or more documents. A document without
    apiVersion/kind patches the v1alpha1 document; others patch the document with the same
    apiVersion/kind/name or are appended. Maps merge, lists append, except podSubnets/serviceSubnets
    and auditPolicy (replaced), network interfaces (merged by `interface` or by equal
    `deviceSelector`), VLANs (by vlanId), admission plugins (by name) and extraArgs (key by key).
    `$patch: delete` removes a key, a list item (matched by its first other key) or a document.
    As in Talos, "" or 0 in a patch does not clear a set string/integer field (use `$patch: delete`).
  - RFC 6902 JSON patch: a list of operations (or YAML/JSON text of one), applied to the v1alpha1
    document. (talosctl refuses JSON patches on multi-document configs; addressing v1alpha1 is
    what such a patch means.)

The patched documents are re-encoded the way Talos re-encodes them (struct key order, Go's
omitempty, inline manifests' leading newlines trimmed), so the output is what `talosctl gen config
--config-patch ...` writes; the upstream configpatcher fixtures reproduce byte for byte.
ExtensionServiceConfig.configFiles merge by mountPath and NetworkRuleConfig ports/ingress are
replaced, as in Talos; other documents merge with the default rules.

The result is validated: unknown keys anywhere in v1alpha1, role mismatches, controlplane-only
sections on a worker, a missing install disk, malformed interfaces. Errors name the patch, the key
and what was expected, and never include values from the secrets bundle.
"""

from __future__ import annotations

import base64
import binascii
import copy
import difflib
import functools
import re
from typing import Any, Iterable, Iterator, Mapping, Sequence
from urllib.parse import urlparse

import jsonpatch
import jsonpointer
import yaml

from talos_proxmox.talos_config import go_yaml, talos_yaml
from talos_proxmox.talos_config.document_layout import DOCUMENT_LAYOUT
from talos_proxmox.talos_config.secrets_bundle import SecretsBundleError
from talos_proxmox.talos_config.v1alpha1_schema import (
    ARGS_FIELDS,
    DOCUMENT_MERGE_STRUCTS,
    INLINE_MANIFEST_TRIM,
    KEYED_LISTS,
    MERGE_STRUCTS,
    ROOT,
    STRUCTS,
)

ROLES = ("controlplane", "worker")
SUPPORTED_CONTRACTS = ((1, 12), (1, 13), (1, 14))
MULTIDOC_KUBERNETES = (1, 14)  # the contract from which each Kubernetes setting is a document of its own

KUBELET_IMAGE = "ghcr.io/siderolabs/kubelet"
APISERVER_IMAGE = "registry.k8s.io/kube-apiserver"
CONTROLLER_MANAGER_IMAGE = "registry.k8s.io/kube-controller-manager"
SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler"
PROXY_IMAGE = "registry.k8s.io/kube-proxy"
INSTALLER_IMAGE = "ghcr.io/siderolabs/installer"  # talosctl's default up to v1.13
DEFAULT_POD_SUBNET = "10.244.0.0/16"
DEFAULT_SERVICE_SUBNET = "10.96.0.0/12"
DEFAULT_DNS_DOMAIN = "cluster.local"
DEFAULT_KUBEPRISM_PORT = 7445
EXCLUDE_FROM_LB_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"
CONTROL_PLANE_ROLE_LABEL = "node-role.kubernetes.io/control-plane"
DEFAULT_DISCOVERY_ENDPOINT = "https://discovery.talos.dev/"

# Sections only a control-plane node uses; on a worker they are a mistake and several carry keys
# that must not reach workers.
CONTROLPLANE_ONLY = (
    ("machine", "controlPlane"),
    ("cluster", "aggregatorCA"),
    ("cluster", "serviceAccount"),
    ("cluster", "secretboxEncryptionSecret"),
    ("cluster", "aescbcEncryptionSecret"),
    ("cluster", "apiServer"),
    ("cluster", "controllerManager"),
    ("cluster", "scheduler"),
    ("cluster", "etcd"),
    ("cluster", "inlineManifests"),
    ("cluster", "extraManifests"),
    ("cluster", "extraManifestHeaders"),
    ("cluster", "adminKubeconfig"),
    ("cluster", "allowSchedulingOnControlPlanes"),
    ("cluster", "allowSchedulingOnMasters"),
)

_FULL_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-[0-9A-Za-z.-]+)?$")
_PATCH_DELETE = "$patch"


class MachineConfigError(ValueError):
    """The inputs or the patched result are not a valid machine configuration."""


# --- inputs ------------------------------------------------------------------------------------


def parse_talos_version(talos_version: str) -> tuple[tuple[int, int], str]:
    """((major, minor), "vX.Y.Z") of a full Talos version; the contract must be a supported one."""
    match = _FULL_VERSION_RE.match(str(talos_version).strip())
    if not match:
        raise MachineConfigError(
            f"talos_version {talos_version!r} is not a full Talos version; expected e.g. 'v1.13.7'"
        )
    contract = (int(match.group(1)), int(match.group(2)))
    if contract not in SUPPORTED_CONTRACTS:
        supported = ", ".join(f"v{a}.{b}" for a, b in SUPPORTED_CONTRACTS)
        raise MachineConfigError(f"talos_version {talos_version!r}: contract v{contract[0]}.{contract[1]} "
                                 f"is not supported; expected one of {supported}")
    return contract, "v" + str(talos_version).strip().lstrip("v")


def _kubernetes_version(kubernetes_version: str) -> str:
    version = str(kubernetes_version).strip().lstrip("v")
    if not re.match(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$", version):
        raise MachineConfigError(f"kubernetes_version {kubernetes_version!r} is not a Kubernetes version; "
                                 "expected e.g. '1.34.1'")
    return version


def _check_endpoint(endpoint: str) -> str:
    parsed = urlparse(str(endpoint))
    if parsed.scheme != "https" or not parsed.hostname:
        raise MachineConfigError(f"endpoint {endpoint!r} is not a Kubernetes API URL; "
                                 "expected e.g. 'https://10.255.200.201:6443'")
    return str(endpoint)


def _bundle_value(secrets: Mapping, path: str) -> str:
    node: Any = secrets
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    if not isinstance(node, str) or not node:
        raise SecretsBundleError(f"secrets bundle: {path} is required")
    return node


# --- gen config defaults -----------------------------------------------------------------------


def default_documents(secrets: Mapping, cluster_name: str, endpoint: str, role: str,
                      talos_version: str, kubernetes_version: str) -> list[dict]:
    """The documents `talosctl gen config --with-secrets` writes for this role, before any patch
    (install.disk excepted, see the module docstring)."""
    if role not in ROLES:
        raise MachineConfigError(f"role {role!r} is not a node role; expected one of {', '.join(ROLES)}")
    if not isinstance(cluster_name, str) or not cluster_name.strip():
        raise MachineConfigError("cluster_name must be a non-empty string")
    contract, talos_tag = parse_talos_version(talos_version)
    k8s = _kubernetes_version(kubernetes_version)
    endpoint = _check_endpoint(endpoint)
    if contract >= MULTIDOC_KUBERNETES:
        return _multidoc_documents(secrets, cluster_name, endpoint, role, k8s)
    controlplane = role == "controlplane"
    get = lambda path: _bundle_value(secrets, path)  # noqa: E731

    machine: dict[str, Any] = {
        "type": role,
        "token": get("trustdinfo.token"),
        "ca": {"crt": get("certs.os.crt"), "key": get("certs.os.key") if controlplane else ""},
        "certSANs": [],
        "kubelet": {
            "image": f"{KUBELET_IMAGE}:v{k8s}",
            "defaultRuntimeSeccompProfileEnabled": True,
            "disableManifestsDirectory": True,
        },
    }
    if contract < (1, 13):
        machine["network"] = {}  # v1.13 moved KubeSpan to its own document and stopped emitting this
    machine["install"] = {"image": f"{INSTALLER_IMAGE}:{talos_tag}", "wipe": False, "grubUseUKICmdline": True}
    machine["features"] = {
        "diskQuotaSupport": True,
        "kubePrism": {"enabled": True, "port": DEFAULT_KUBEPRISM_PORT},
        "hostDNS": {"enabled": True, "forwardKubeDNSToHost": True},
    }
    if controlplane:
        machine["nodeLabels"] = {EXCLUDE_FROM_LB_LABEL: ""}

    cluster: dict[str, Any] = {
        "id": get("cluster.id"),
        "secret": get("cluster.secret"),
        "controlPlane": {"endpoint": endpoint},
        "clusterName": cluster_name,
        "network": {
            "dnsDomain": DEFAULT_DNS_DOMAIN,
            "podSubnets": [DEFAULT_POD_SUBNET],
            "serviceSubnets": [DEFAULT_SERVICE_SUBNET],
        },
        "token": get("secrets.bootstraptoken"),
    }
    if controlplane:
        encryption = secrets.get("secrets", {})
        if encryption.get("secretboxencryptionsecret"):
            cluster["secretboxEncryptionSecret"] = encryption["secretboxencryptionsecret"]
        elif encryption.get("aescbcencryptionsecret"):
            cluster["aescbcEncryptionSecret"] = encryption["aescbcencryptionsecret"]
        else:
            raise SecretsBundleError("secrets bundle: secrets.secretboxencryptionsecret is required")
        cluster["ca"] = {"crt": get("certs.k8s.crt"), "key": get("certs.k8s.key")}
        cluster["aggregatorCA"] = {"crt": get("certs.k8saggregator.crt"), "key": get("certs.k8saggregator.key")}
        cluster["serviceAccount"] = {"key": get("certs.k8sserviceaccount.key")}
        cluster["apiServer"] = {
            "image": f"{APISERVER_IMAGE}:v{k8s}",
            "admissionControl": [{"name": "PodSecurity", "configuration": _pod_security_defaults()}],
            "auditPolicy": _audit_policy_defaults(),
        }
        cluster["controllerManager"] = {"image": f"{CONTROLLER_MANAGER_IMAGE}:v{k8s}"}
        cluster["proxy"] = {"image": f"{PROXY_IMAGE}:v{k8s}"}
        cluster["scheduler"] = {"image": f"{SCHEDULER_IMAGE}:v{k8s}"}
    else:
        cluster["ca"] = {"crt": get("certs.k8s.crt"), "key": ""}
    cluster["discovery"] = {"enabled": True, "registries": {"kubernetes": {"disabled": True}, "service": {}}}
    if controlplane:
        cluster["etcd"] = {"ca": {"crt": get("certs.etcd.crt"), "key": get("certs.etcd.key")}}

    v1alpha1 = {"version": "v1alpha1", "debug": False, "persist": True, "machine": machine, "cluster": cluster}
    hostname = {"apiVersion": "v1alpha1", "kind": "HostnameConfig", "auto": "stable"}
    return [v1alpha1, hostname]


def _doc(kind: str, **fields: Any) -> dict:
    return {"apiVersion": "v1alpha1", "kind": kind, **fields}


def _pem(secrets: Mapping, path: str) -> str:
    """A bundle certificate or key as the PEM text the v1.14 documents hold (the bundle has it base64)."""
    try:
        return base64.b64decode(_bundle_value(secrets, path), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise SecretsBundleError(f"secrets bundle: {path} is not base64-encoded PEM") from None


def _multidoc_documents(secrets: Mapping, cluster_name: str, endpoint: str, role: str, k8s: str) -> list[dict]:
    """What `talosctl gen config` writes from contract v1.14 on: v1alpha1 keeps the machine's identity and
    the cluster token, and each Kubernetes setting has a document of its own (pkg/machinery/config/generate
    at v1.14.0-rc.1; its stability fixtures are the test)."""
    controlplane = role == "controlplane"
    get = lambda path: _bundle_value(secrets, path)  # noqa: E731
    machine = {"type": role, "token": get("trustdinfo.token"),
               "ca": {"crt": get("certs.os.crt"), "key": get("certs.os.key") if controlplane else ""},
               "certSANs": [], "features": {"diskQuotaSupport": True}}
    cluster: dict[str, Any] = {"token": get("secrets.bootstraptoken")}
    if controlplane:
        cluster["etcd"] = {"ca": {"crt": get("certs.etcd.crt"), "key": get("certs.etcd.key")}}
    node: dict[str, Any] = {"nodeIP": {}}
    if controlplane:
        node["labels"] = {CONTROL_PLANE_ROLE_LABEL: "", EXCLUDE_FROM_LB_LABEL: ""}
        node["taints"] = {CONTROL_PLANE_ROLE_LABEL: "NoSchedule"}
    kubernetes_ca = ({"issuingCA": {"cert": _pem(secrets, "certs.k8s.crt"), "key": _pem(secrets, "certs.k8s.key")}}
                     if controlplane else {"acceptedCAs": [_pem(secrets, "certs.k8s.crt")]})
    documents = [
        {"version": "v1alpha1", "debug": False, "persist": True, "machine": machine, "cluster": cluster},
        _doc("DiscoveryServiceConfig", name="default", endpoint=DEFAULT_DISCOVERY_ENDPOINT),
        _doc("DiscoveryIdentityConfig", clusterID=get("cluster.id"), clusterSecret=get("cluster.secret")),
        _doc("ResolverConfig", hostDNS={"enabled": True, "forwardKubeDNSToHost": True}),
        _doc("VolumeConfig", name="EPHEMERAL", mount={"secure": True}),
        _doc("FilesystemTrimConfig", interval="168h0m0s"),
        _doc("SecurityProfileConfig", workloadIsolation=True),
        _doc("HostnameConfig", auto="stable"),
        _doc("KubeClusterConfig", clusterName=cluster_name, endpoint=endpoint),
        _doc("KubeNodeConfig", **node),
        _doc("KubeletConfig", image=f"{KUBELET_IMAGE}:v{k8s}", config={}, defaultRuntimeSeccompProfileEnabled=True),
        _doc("KubeNetworkConfig", dnsDomain=DEFAULT_DNS_DOMAIN, podSubnets=[DEFAULT_POD_SUBNET],
             serviceSubnets=[DEFAULT_SERVICE_SUBNET]),
        _doc("KubeAPIServerCAConfig", **kubernetes_ca),
        _doc("KubePrismConfig", port=DEFAULT_KUBEPRISM_PORT),
    ]
    if not controlplane:
        return documents
    encryption = secrets.get("secrets", {})
    if encryption.get("secretboxencryptionsecret"):  # the names and order talosctl keeps, so etcd's data decrypts
        provider = {"name": "key2", "secret": encryption["secretboxencryptionsecret"]}
    elif encryption.get("aescbcencryptionsecret"):
        provider = {"name": "key1", "secret": encryption["aescbcencryptionsecret"]}
    else:
        raise SecretsBundleError("secrets bundle: secrets.secretboxencryptionsecret is required")
    return documents + [
        _doc("KubeAggregatorCAConfig", issuingCA={"cert": _pem(secrets, "certs.k8saggregator.crt"),
                                                  "key": _pem(secrets, "certs.k8saggregator.key")}),
        _doc("KubeAdmissionControlConfig", name="PodSecurity", configuration=_pod_security_defaults()),
        _doc("KubeAuditPolicyConfig", configuration=_audit_policy_defaults()),
        _doc("KubeAuthenticationConfig", configuration={
            "anonymous": {"conditions": [{"path": "/livez"}, {"path": "/readyz"}, {"path": "/healthz"}],
                          "enabled": True},
            "jwt": []}),
        _doc("KubeAuthorizerConfig", name="node", type="Node"),
        _doc("KubeAuthorizerConfig", name="rbac", type="RBAC"),
        _doc("KubeEtcdEncryptionConfig", config={"resources": [
            {"providers": [{"secretbox": {"keys": [provider]}}], "resources": ["secrets"]}]}),
        _doc("KubeServiceAccountConfig", issuer={"privateKey": _pem(secrets, "certs.k8sserviceaccount.key"),
                                                 "issuerURL": endpoint}),
        _doc("KubeAPIServerConfig", image=f"{APISERVER_IMAGE}:v{k8s}"),
        _doc("KubeControllerManagerConfig", image=f"{CONTROLLER_MANAGER_IMAGE}:v{k8s}"),
        _doc("KubeSchedulerConfig", image=f"{SCHEDULER_IMAGE}:v{k8s}", config={}),
        _doc("KubeProxyConfig", image=f"{PROXY_IMAGE}:v{k8s}", config={}),
        _doc("KubeFlannelCNIConfig", backendType="vxlan", backendPort=4789),
        _doc("KubeCoreDNSConfig", enabled=True),
    ]


def _audit_policy_defaults() -> dict:
    return {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata"}]}


def _pod_security_defaults() -> dict:
    return {
        "apiVersion": "pod-security.admission.config.k8s.io/v1alpha1",
        "defaults": {
            "audit": "restricted", "audit-version": "latest",
            "enforce": "baseline", "enforce-version": "latest",
            "warn": "restricted", "warn-version": "latest",
        },
        "exemptions": {"namespaces": ["kube-system"], "runtimeClasses": [], "usernames": []},
        "kind": "PodSecurityConfiguration",
    }


# --- documents ---------------------------------------------------------------------------------


def document_id(document: Mapping) -> tuple[str, str, str]:
    """(apiVersion, kind, name); the legacy v1alpha1 document has no apiVersion/kind: ("", "v1alpha1", "")."""
    if "apiVersion" not in document and "kind" not in document:
        return ("", "v1alpha1", "")
    return (str(document.get("apiVersion", "")), str(document.get("kind", "")), str(document.get("name", "") or ""))


# Where each Kubernetes component's settings are: a section of the v1alpha1 document, and (Talos 1.14's
# contract) a document of its own kind.
COMPONENT_PLACES = {"kube-apiserver": (("cluster", "apiServer"), "KubeAPIServerConfig"),
                    "kube-controller-manager": (("cluster", "controllerManager"), "KubeControllerManagerConfig"),
                    "kube-scheduler": (("cluster", "scheduler"), "KubeSchedulerConfig"),
                    "kube-proxy": (("cluster", "proxy"), "KubeProxyConfig"),
                    "kubelet": (("machine", "kubelet"), "KubeletConfig")}


def component_settings(documents: Iterable[Mapping], key: str) -> Iterator[tuple[str, str, Any]]:
    """(component, where, value) for each Kubernetes component whose `key` (image, extraArgs) the
    documents set; `where` names the place as a user would find it in a patch."""
    for document in documents:
        for component, ((section, field), kind) in COMPONENT_PLACES.items():
            if document_id(document) == ("", "v1alpha1", ""):
                value, where = ((document.get(section) or {}).get(field) or {}).get(key), f"{section}.{field}.{key}"
            elif document.get("kind") == kind:
                value, where = document.get(key), f"{kind} {key}"
            else:
                continue
            if value:
                yield component, where, value


def _describe(doc_id: tuple[str, str, str]) -> str:
    api, kind, name = doc_id
    if not api:
        return "the v1alpha1 document"
    return f"document {api}/{kind}" + (f" named {name!r}" if name else "")


# --- patches -----------------------------------------------------------------------------------


def parse_patch(patch: Any, label: str) -> tuple[str, Any]:
    """("strategic", [documents]) or ("json6902", [operations]) for one patch input."""
    if isinstance(patch, Mapping):
        return "strategic", [copy.deepcopy(dict(patch))]
    if isinstance(patch, (list, tuple)):
        return "json6902", _check_operations(list(patch), label)
    if isinstance(patch, str):
        try:
            documents = copy.deepcopy(_load_patch_text(patch))
        except yaml.YAMLError as exc:
            raise MachineConfigError(f"{label}: not valid YAML{talos_yaml.yaml_error_location(exc)}") from None
        if len(documents) == 1 and isinstance(documents[0], list):
            return "json6902", _check_operations(documents[0], label)
        for index, document in enumerate(documents):
            if not isinstance(document, dict):
                raise MachineConfigError(f"{label}: document {index + 1} is a {type(document).__name__}; "
                                         "expected a mapping (strategic merge) or one list of RFC 6902 operations")
        if not documents:
            raise MachineConfigError(f"{label}: is empty")
        return "strategic", documents
    raise MachineConfigError(f"{label}: is a {type(patch).__name__}; expected a mapping, YAML text or a list "
                             "of RFC 6902 operations")


@functools.lru_cache(maxsize=512)
def _load_patch_text(text: str) -> list:
    # Many nodes share the same role/cluster patch text; parse each text once (callers deep-copy).
    return talos_yaml.load_documents(text)


def _check_operations(operations: list, label: str) -> list:
    for index, op in enumerate(operations):
        if not isinstance(op, Mapping) or op.get("op") not in ("add", "remove", "replace", "move", "copy", "test") \
                or not isinstance(op.get("path"), str):
            raise MachineConfigError(f"{label}: operation {index + 1} is not an RFC 6902 operation; expected "
                                     "a mapping with op (add/remove/replace/move/copy/test) and path")
    return [dict(op) for op in operations]


def _apply_json6902(documents: list[dict], operations: list, label: str) -> list[dict]:
    index = next(i for i, d in enumerate(documents) if document_id(d)[1] == "v1alpha1" and not document_id(d)[0])
    target = documents[index]
    for number, op in enumerate(operations, start=1):
        try:
            target = jsonpatch.apply_patch(target, [op], in_place=False)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, KeyError, IndexError, TypeError) as exc:
            # The library's messages can quote document values (secrets); keep op, path and error class.
            raise MachineConfigError(f"{label}: operation {number} ({op['op']} {op['path']}) cannot be applied "
                                     f"to the v1alpha1 document ({type(exc).__name__})") from None
    if not isinstance(target, dict):
        raise MachineConfigError(f"{label}: the v1alpha1 document is no longer a mapping")
    return documents[:index] + [target] + documents[index + 1:]


def _apply_strategic(documents: list[dict], patch_docs: list[dict], label: str) -> list[dict]:
    result = documents
    for patch_doc in patch_docs:
        doc_id = document_id(patch_doc)
        if doc_id[0] and (not doc_id[1]):
            raise MachineConfigError(f"{label}: a document with apiVersion needs a kind too")
        patch_doc = copy.deepcopy(patch_doc)
        target_index = next((i for i, d in enumerate(result) if document_id(d) == doc_id), None)

        if patch_doc.get(_PATCH_DELETE) == "delete":
            if not doc_id[0]:
                raise MachineConfigError(f"{label}: the v1alpha1 document cannot be deleted")
            if target_index is None:
                raise MachineConfigError(f"{label}: $patch: delete of {_describe(doc_id)}, which the config does not have")
            result = result[:target_index] + result[target_index + 1:]
            continue

        deletes = _collect_deletes(patch_doc, (), label)
        if target_index is None:
            if deletes:
                raise MachineConfigError(f"{label}: $patch: delete inside {_describe(doc_id)}, which the config does not have")
            result = result + [patch_doc]
            continue
        target = copy.deepcopy(result[target_index])
        for path, selector in deletes:
            _delete(target, path, selector, label)
        struct = ROOT if not doc_id[0] else DOCUMENT_MERGE_STRUCTS.get(doc_id[1])
        _merge(target, patch_doc, struct, (), label)
        result = result[:target_index] + [target] + result[target_index + 1:]
    return result


def _collect_deletes(node: Any, path: tuple, label: str) -> list[tuple[tuple, Any]]:
    """Strip `$patch: delete` markers from a patch document; return (path, selector) for each.

    selector is None for "delete the key at path", or (key, value) for "delete the items of the list
    at path whose `key` equals `value`".
    """
    found: list[tuple[tuple, Any]] = []
    if isinstance(node, dict):
        for key in list(node):
            value = node[key]
            if isinstance(value, dict) and value.get(_PATCH_DELETE) == "delete":
                if any(isinstance(p, int) for p in path):
                    raise MachineConfigError(f"{label}: cannot delete the inner key {_dotted(path + (key,))}")
                found.append((path + (key,), None))
                del node[key]
            elif isinstance(value, list):
                kept = []
                for item in value:
                    if isinstance(item, dict) and item.get(_PATCH_DELETE) == "delete":
                        if any(isinstance(p, int) for p in path):  # Talos: no complex paths in slices
                            raise MachineConfigError(f"{label}: cannot delete an item of the inner list "
                                                     f"{_dotted(path + (key,))}")
                        others = [(k, v) for k, v in item.items() if k != _PATCH_DELETE]
                        if not others:
                            raise MachineConfigError(f"{label}: $patch: delete in list {_dotted(path + (key,))} needs "
                                                     "a key to match the item, e.g. {interface: eth0, $patch: delete}")
                        found.append((path + (key,), others[0]))
                    else:
                        found.extend(_collect_deletes(item, path + (key, len(kept)), label))
                        kept.append(item)
                if kept:
                    node[key] = kept
                else:
                    del node[key]
            else:
                found.extend(_collect_deletes(value, path + (key,), label))
    return found


def _delete(target: dict, path: tuple, selector: Any, label: str) -> None:
    parent: Any = target
    for part in path[:-1]:
        parent = parent.get(part) if isinstance(parent, dict) else None
        if parent is None:
            break
    last = path[-1]
    if not isinstance(parent, dict) or last not in parent:
        raise MachineConfigError(f"{label}: $patch: delete of {_dotted(path)}, which the config does not have")
    if selector is None:
        del parent[last]
        return
    key, value = selector
    items = parent[last]
    if not isinstance(items, list):
        raise MachineConfigError(f"{label}: $patch: delete expects {_dotted(path)} to be a list")
    remaining = [item for item in items if not (isinstance(item, dict) and _selector_equal(item.get(key), value))]
    if len(remaining) == len(items):
        raise MachineConfigError(f"{label}: $patch: delete found no item of {_dotted(path)} with that {key}")
    parent[last] = remaining


def _selector_equal(left: Any, right: Any) -> bool:
    if isinstance(left, dict) or isinstance(right, dict):
        return left == right
    return left is not None and str(left) == str(right)


def _merge(left: dict, right: dict, struct: str | None, path: tuple, label: str) -> None:
    """Merge `right` into `left` in place with Talos' rules for the given v1alpha1 struct (None: free-form)."""
    fields = MERGE_STRUCTS.get(struct, {}) if struct else {}
    for key, rvalue in right.items():
        field = fields.get(key)
        here = path + (key,)
        lvalue = left.get(key)
        if rvalue is None:
            continue  # an empty value in a patch changes nothing (Go merges nil as no-op)
        if lvalue is None:
            left[key] = copy.deepcopy(rvalue)
        elif field is not None and field.replace:
            left[key] = copy.deepcopy(rvalue)
        elif isinstance(lvalue, dict) and isinstance(rvalue, dict):
            if field is not None and field.container == "{}" and key in ARGS_FIELDS:
                lvalue.update(copy.deepcopy(rvalue))
            elif field is not None and field.container == "{}":
                for map_key, map_value in rvalue.items():
                    if isinstance(lvalue.get(map_key), dict) and isinstance(map_value, dict):
                        _merge(lvalue[map_key], map_value, field.struct, here + (map_key,), label)
                    else:
                        _merge(lvalue, {map_key: map_value}, None, here, label)
            else:
                _merge(lvalue, rvalue, field.struct if field else None, here, label)
        elif isinstance(lvalue, list) and isinstance(rvalue, list):
            keys = KEYED_LISTS.get(struct, {}).get(key) if struct else None
            if keys:
                left[key] = _merge_keyed(lvalue, rvalue, keys, field.struct if field else None, here, label)
            else:
                left[key] = lvalue + copy.deepcopy(rvalue)
        elif isinstance(lvalue, (dict, list)) or isinstance(rvalue, (dict, list)):
            raise MachineConfigError(f"{label}: {_dotted(here)} is a {_kind(rvalue)} in the patch but a "
                                     f"{_kind(lvalue)} in the config; expected a {_kind(lvalue)}")
        elif not _zero_keeps_existing(field, rvalue):
            left[key] = rvalue


def _zero_keeps_existing(field, value: Any) -> bool:
    """Go's merge leaves a set string/integer alone when the patch has "" or 0 there, unless the
    field is a pointer (booleans always overwrite)."""
    is_zero = value == "" or (isinstance(value, int) and not isinstance(value, bool) and value == 0)
    if not is_zero:
        return False
    if field is None:
        return True  # free-form values, and fields of other documents the layout leaves out: plain Go values
    return not field.pointer and (field.scalar == "s" or field.scalar in INTEGER_SCALARS)


def _merge_keyed(existing: list, incoming: list, keys: tuple, struct: str | None, path: tuple, label: str) -> list:
    result = copy.deepcopy(existing)
    for item in incoming:
        match = None
        if isinstance(item, dict):
            key = next((k for k in keys if item.get(k) not in (None, "")), None)
            if key is not None:
                match = next((i for i, e in enumerate(result) if isinstance(e, dict) and e.get(key) == item[key]), None)
        if match is not None:
            _merge(result[match], item, struct, path + (match,), label)
        else:
            result.append(copy.deepcopy(item))
    return result


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, list):
        return "list"
    return "scalar"


def _dotted(path: Iterable) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document root)"


# --- order and validation ----------------------------------------------------------------------


def _normalize(value: Any, struct: str | None, path: tuple, errors: list[str]) -> Any:
    """The value as Talos re-encodes it: struct key order, free-form maps sorted, Go's omitempty
    (empty values of omitempty fields dropped, empty non-omitempty fields written out);
    unknown keys and wrong shapes reported in `errors`."""
    if struct is None:
        if isinstance(value, dict):
            return {k: _normalize(value[k], None, path + (k,), errors) for k in sorted(value, key=str)}
        if isinstance(value, list):
            return [_normalize(v, None, path + (i,), errors) for i, v in enumerate(value)]
        return value
    fields = STRUCTS[struct]
    if not isinstance(value, dict):
        errors.append(f"{_dotted(path)}: expected a mapping, got a {_kind(value)}")
        return value
    for key in value:
        if key not in fields:
            hint = difflib.get_close_matches(str(key), list(fields), n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else f"; expected one of: {', '.join(fields)}"
            where = f"{_dotted(path)}" if path else "top level of the v1alpha1 document"
            errors.append(f"unknown key {key!r} at {where}{suggestion}")
    ordered: dict[str, Any] = {}
    for name, field in fields.items():
        here = path + (name,)
        if name not in value or (value[name] is None and not field.pointer):  # Go decodes null as the zero value
            if field.always:
                ordered[name] = _zero(field, here, errors)
            continue
        child = value[name]
        if field.container == "[]":
            if not isinstance(child, list):
                errors.append(f"{_dotted(here)}: expected a list, got a {_kind(child)}")
            else:
                child = [_normalize(v, field.struct, here + (i,), errors) for i, v in enumerate(child)]
        elif field.container == "{}":
            if not isinstance(child, dict):
                errors.append(f"{_dotted(here)}: expected a mapping, got a {_kind(child)}")
            else:
                child = {k: _normalize(child[k], field.struct, here + (k,), errors) for k in sorted(child, key=str)}
        else:
            _check_scalar(field.scalar, child, here, errors)
            child = _normalize(_as_field_type(field.scalar, child), field.struct, here, errors)
        if field.always or not _omitted_when_empty(field, child):
            ordered[name] = child
    if struct == "ClusterInlineManifest" and isinstance(ordered.get("contents"), str):
        ordered["contents"] = ordered["contents"].lstrip(INLINE_MANIFEST_TRIM)
    return ordered


_SCALAR_KINDS = {"s": "a string", "b": "true or false", "i": "an integer", "m": "an integer"}
INTEGER_SCALARS = ("i", "m")  # a file mode is an integer that Talos writes in octal


def _check_scalar(scalar: str, value: Any, path: tuple, errors: list[str]) -> None:
    """What Go's YAML decoder refuses for a typed field: a list or mapping for any scalar, a non-bool for a
    bool, a non-integer for an integer (a string field takes any scalar, as Go's decoder does)."""
    if not scalar or value is None:
        return
    wrong = isinstance(value, (list, dict)) or (
        scalar == "b" and not isinstance(value, bool)) or (
        scalar in INTEGER_SCALARS and (isinstance(value, bool) or not isinstance(value, int)))
    if wrong:
        got = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(type(value)) \
            or f"a {_kind(value)}"
        errors.append(f"{_dotted(path)}: expected {_SCALAR_KINDS[scalar]}, got {got}")


def _as_field_type(scalar: str, value: Any) -> Any:
    """A scalar as Go's decoder stores it in the field: a string field keeps a number's or boolean's text
    (so Talos writes `image: "123"` quoted), a file mode is written back in octal."""
    if scalar == "s" and isinstance(value, (bool, int, float)):
        return str(value) if type(value) is int else go_yaml.plain_text(value, "")  # any size of integer
    if scalar == "m" and isinstance(value, int) and not isinstance(value, bool):
        return go_yaml.OctalInt(value)
    return value


def _zero(field, path: tuple, errors: list[str]) -> Any:
    """How Go encodes an unset field that has no omitempty (the free-form ones are Unstructured: an empty mapping)."""
    if field.container == "[]":
        return []
    if field.container == "{}":
        return {}
    if field.pointer:
        return None
    if field.struct:
        return _normalize({}, field.struct, path, errors)
    return {"s": "", "b": False, "i": 0, "m": go_yaml.OctalInt(0)}.get(field.scalar, {})


def _omitted_when_empty(field, value: Any) -> bool:
    """Go's omitempty: nil, empty lists/maps, and for non-pointers "", false, 0 or an all-empty struct."""
    if value is None:
        return True
    if field.container:
        return value in ([], {})
    if field.pointer:
        return False
    if field.struct:
        return value == {}
    return (field.scalar == "s" and value == "") or (field.scalar == "b" and value is False) \
        or (field.scalar in INTEGER_SCALARS and value == 0 and value is not False)


def _ordered(mapping: Mapping, order: Iterable[str] = ()) -> dict:
    """`mapping` with the keys of `order` first, in that order, then the rest sorted."""
    order = tuple(order)
    return {**{k: mapping[k] for k in order if k in mapping}, **{k: mapping[k] for k in sorted(mapping) if k not in order}}


def _laid_out(value: Any, layout: Mapping | None) -> Any:
    """`value` with its keys in Talos's encoding order: a struct's fields in `layout` order (the engine hands
    a dynamic provider each mapping with its keys in its own order, so without this a config rendered by
    `pulumi up` could differ from the offline render's); free-form mappings sorted, as Go encodes maps."""
    if isinstance(value, list):
        return [_laid_out(item, layout) for item in value]
    if not isinstance(value, Mapping):
        return value
    layout = layout or {}
    return {k: _laid_out(v, layout.get(k)) for k, v in _ordered(value, layout).items()}


def _normalize_other(document: dict) -> dict:
    head = {k: document[k] for k in ("apiVersion", "kind", "name") if k in document}
    rest = {k: v for k, v in document.items() if k not in head}
    return {**head, **_laid_out(rest, DOCUMENT_LAYOUT.get(document.get("kind")))}


# v1alpha1 fields Talos refuses next to a document that holds the same setting (each document's
# V1Alpha1ConflictValidate, siderolabs/talos v1.14.0-rc.1 pkg/machinery/config/types).
CONFLICTING_FIELDS = {
    "DiscoveryServiceConfig": (("cluster", "discovery"),),
    "DiscoveryIdentityConfig": (("cluster", "id"), ("cluster", "secret")),
    "HostnameConfig": (("machine", "network", "hostname"),),
    "ResolverConfig": (("machine", "network", "nameservers"), ("machine", "network", "searchDomains")),
    "KubeSpanConfig": (("machine", "network", "kubespan"),),
    "UnattendedInstallConfig": (("machine", "install"),),
    "KubeClusterConfig": (("cluster", "clusterName"), ("cluster", "controlPlane", "endpoint")),
    "KubeNodeConfig": (("cluster", "allowSchedulingOnControlPlanes"), ("cluster", "allowSchedulingOnMasters"),
                       ("machine", "kubelet", "skipNodeRegistration"), ("machine", "kubelet", "registerWithFQDN"),
                       ("machine", "kubelet", "nodeIP"), ("machine", "nodeLabels"), ("machine", "nodeAnnotations"),
                       ("machine", "nodeTaints")),
    "KubeletConfig": (("machine", "kubelet"),),
    "KubeCredentialProviderConfig": (("machine", "kubelet"),),
    "KubeNetworkConfig": (("cluster", "network"),),
    "KubeFlannelCNIConfig": (("cluster", "network"),),
    "KubeAPIServerCAConfig": (("cluster", "ca"),),
    "KubeAggregatorCAConfig": (("cluster", "aggregatorCA"),),
    "KubeServiceAccountConfig": (("cluster", "serviceAccount"),),
    "KubeEtcdEncryptionConfig": (("cluster", "secretboxEncryptionSecret"), ("cluster", "aescbcEncryptionSecret")),
    "KubeAdmissionControlConfig": (("cluster", "apiServer", "admissionControl"),),
    "KubeAuthorizerConfig": (("cluster", "apiServer", "admissionControl"),),
    "KubeAuditPolicyConfig": (("cluster", "apiServer", "auditPolicy"),),
    "KubeAPIServerConfig": (("cluster", "apiServer"), ("cluster", "controlPlane", "localAPIServerPort")),
    "KubeControllerManagerConfig": (("cluster", "controllerManager"), ("machine", "controlPlane", "controllerManager")),
    "KubeSchedulerConfig": (("cluster", "scheduler"), ("machine", "controlPlane", "scheduler")),
    "KubeProxyConfig": (("cluster", "proxy"),),
    "KubeCoreDNSConfig": (("cluster", "coreDNS"),),
    "KubePrismConfig": (("machine", "features", "kubePrism"),),
    "KubeTalosAPIAccessConfig": (("machine", "features", "kubernetesTalosAPIAccess"),),
}
# Documents holding control-plane keys: on a worker they would hand it the cluster's secrets.
CONTROLPLANE_ONLY_DOCUMENTS = ("KubeAggregatorCAConfig", "KubeServiceAccountConfig", "KubeEtcdEncryptionConfig")


def _at(document: Mapping, path: tuple) -> Any:
    node: Any = document
    for part in path:
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _present(value: Any) -> bool:
    return value not in (None, "", [], {})


def _validate(v1alpha1: dict, others: list[dict], role: str, errors: list[str]) -> None:
    machine = v1alpha1.get("machine") if isinstance(v1alpha1.get("machine"), dict) else {}
    cluster = v1alpha1.get("cluster") if isinstance(v1alpha1.get("cluster"), dict) else {}
    by_kind = {}
    for document in others:
        by_kind.setdefault(document.get("kind"), document)
    if v1alpha1.get("version") != "v1alpha1":
        errors.append("version: expected 'v1alpha1'")
    node_type = machine.get("type")
    if node_type != role:
        errors.append(f"machine.type is {node_type!r} but this node's role is {role!r}; patches must not change the role")
    for kind, paths in CONFLICTING_FIELDS.items():
        for path in paths:
            if kind in by_kind and _present(_at(v1alpha1, path)):
                errors.append(f"{_dotted(path)} of the v1alpha1 document and the {kind} document set the same thing, "
                              f"which Talos refuses; expected it in the {kind} document only")
    install = machine.get("install") if isinstance(machine.get("install"), dict) else {}
    unattended = by_kind.get("UnattendedInstallConfig")
    if unattended is not None:
        if not _present(_at(unattended, ("provisioning", "diskSelector", "match"))):
            errors.append("UnattendedInstallConfig provisioning.diskSelector.match is missing; expected the install "
                          'disk, e.g. disk.dev_path == "/dev/sda"')
    elif not install.get("disk") and not install.get("diskSelector"):
        errors.append("machine.install.disk is missing; expected a patch setting the install disk, "
                      "e.g. {machine: {install: {disk: /dev/sda}}} (or machine.install.diskSelector)")
    kube_cluster = by_kind.get("KubeClusterConfig")
    endpoint = _at(kube_cluster if kube_cluster is not None else cluster,
                   ("endpoint",) if kube_cluster is not None else ("controlPlane", "endpoint"))
    if not isinstance(endpoint, str) or urlparse(endpoint).scheme != "https":
        where = "KubeClusterConfig endpoint" if kube_cluster is not None else "cluster.controlPlane.endpoint"
        errors.append(f"{where}: expected an https:// URL of the Kubernetes API")
    if role == "worker":
        for section, key in CONTROLPLANE_ONLY:
            container = machine if section == "machine" else cluster
            if key in container:
                errors.append(f"{section}.{key} is only valid on controlplane nodes, but this node's role is worker")
        for section, container in (("machine", machine), ("cluster", cluster)):
            ca = container.get("ca")
            if isinstance(ca, dict) and ca.get("key"):
                errors.append(f"{section}.ca.key must be empty on a worker (the CA key stays on control planes)")
        for kind in CONTROLPLANE_ONLY_DOCUMENTS:
            if kind in by_kind:
                errors.append(f"the {kind} document is only valid on controlplane nodes, but this node's role is worker")
        if _present(_at(by_kind.get("KubeAPIServerCAConfig") or {}, ("issuingCA", "key"))):
            errors.append("KubeAPIServerCAConfig issuingCA.key must be empty on a worker (the CA key stays on "
                          "control planes)")
    network = machine.get("network") if isinstance(machine.get("network"), dict) else {}
    for index, device in enumerate(network.get("interfaces") or []):
        if not isinstance(device, dict):
            continue
        has_name, has_selector = bool(device.get("interface")), device.get("deviceSelector") is not None
        if has_name == has_selector:
            errors.append(f"machine.network.interfaces[{index}]: expected exactly one of interface or deviceSelector")


def finalize(documents: list[dict], role: str) -> list[dict]:
    """Order keys the way Talos encodes them and validate; raises MachineConfigError listing every problem."""
    errors: list[str] = []
    seen: set = set()
    result = []
    for document in documents:
        doc_id = document_id(document)
        if doc_id in seen:
            errors.append(f"{_describe(doc_id)} appears twice")
        seen.add(doc_id)
        if not doc_id[0]:
            result.append(_normalize(document, ROOT, (), errors))
        else:
            if not doc_id[1]:
                errors.append(f"a document with apiVersion {doc_id[0]!r} has no kind")
            result.append(_normalize_other(document))
    v1alpha1 = next((d for d in result if not document_id(d)[0]), {})
    _validate(v1alpha1, [d for d in result if document_id(d)[0]], role, errors)
    if errors:
        raise MachineConfigError("machine configuration is invalid:\n  - " + "\n  - ".join(errors))
    return result


# --- entry point -------------------------------------------------------------------------------


def render_documents(secrets: Mapping, cluster_name: str, endpoint: str, role: str, talos_version: str,
                     kubernetes_version: str, patches: Sequence[Any] = ()) -> list[dict]:
    """Like `render`, as parsed documents."""
    documents = default_documents(secrets, cluster_name, endpoint, role, talos_version, kubernetes_version)
    for number, patch in enumerate(patches or (), start=1):
        documents = apply_patch(documents, patch, f"patch {number}")
    return finalize(documents, role)


def apply_patch(documents: list[dict], patch: Any, label: str) -> list[dict]:
    """`documents` with one patch applied (strategic merge or RFC 6902); errors start with `label`."""
    kind, body = parse_patch(patch, label)
    if kind == "json6902":
        return _apply_json6902(documents, body, label)
    return _apply_strategic(documents, body, label)


def render(secrets: Mapping, cluster_name: str, endpoint: str, role: str, talos_version: str,
           kubernetes_version: str, patches: Sequence[Any] = ()) -> str:
    """The complete machine configuration YAML for one node (see the module docstring)."""
    return talos_yaml.dump_documents(
        render_documents(secrets, cluster_name, endpoint, role, talos_version, kubernetes_version, patches)
    )


def parse_config(text: str) -> list[dict]:
    """The documents of a rendered (or talosctl-written) machine configuration."""
    return talos_yaml.load_documents(text)
