"""Talos config patches, one rule at a time: strategic merge (documents matched by apiVersion/kind/name,
maps merged, lists appended or replaced or merged by key, `$patch: delete`) and RFC 6902 JSON patches,
through `apply_patch` and `parse_patch` on a small config, and the exact refusal naming the patch."""

import copy

import pytest

from talos_proxmox.talos_config import machine_config as mc
from talos_proxmox.talos_config.machine_config import MachineConfigError, apply_patch, document_id, parse_patch
from tests.support import seed_cluster as seed

ETH0 = {"interface": "eth0", "dhcp": True, "vlans": [{"vlanId": 10, "dhcp": True}]}
NIC = {"deviceSelector": {"hardwareAddr": "bc:24:11:00:00:01"}, "addresses": ["10.0.0.2/24"]}
POD_SECURITY = {"name": "PodSecurity", "configuration": {"defaults": {"enforce": "baseline", "audit": "restricted"}}}
MACHINE_CONFIG = {
    "version": "v1alpha1",
    "machine": {
        "type": "controlplane",
        "certSANs": ["a.example"],
        "kubelet": {"extraArgs": {"rotate-server-certificates": "true", "node-ip": ["10.0.0.0/8"]}},
        "network": {"interfaces": [ETH0, NIC], "kubespan": {"enabled": True, "mtu": 1420}},
        "install": {"disk": "/dev/sda", "wipe": True},
        "features": {"hostDNS": {"enabled": True, "forwardKubeDNSToHost": True},
                     "kubePrism": {"enabled": True, "port": 7445}},
        "nodeLabels": {"zone": "a"},
        "registries": {"mirrors": {"docker.io": {"endpoints": ["https://mirror-1"]}},
                       "config": {"registry.example": {"tls": {"ca": "Y2E="}, "auth": {"username": "u"}}}},
    },
    "cluster": {
        "network": {"dnsDomain": "cluster.local", "podSubnets": ["10.244.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]},
        "apiServer": {"admissionControl": [POD_SECURITY],
                      "auditPolicy": {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata"}]}},
    },
}
HOSTNAME = {"apiVersion": "v1alpha1", "kind": "HostnameConfig", "auto": "stable"}
SERVICE = {"apiVersion": "v1alpha1", "kind": "ExtensionServiceConfig", "name": "tailscale",
           "configFiles": [{"mountPath": "/etc/a", "content": "a"}], "environment": ["A=1"]}
RULE = {"apiVersion": "v1alpha1", "kind": "NetworkRuleConfig", "name": "kubelet",
        "portSelector": {"ports": [10250], "protocol": "tcp"}, "ingress": [{"subnet": "10.0.0.0/8"}]}
CONFIG = [MACHINE_CONFIG, HOSTNAME, SERVICE, RULE]


def patched(*patches, documents=CONFIG):
    documents = copy.deepcopy(documents)
    for number, patch in enumerate(patches, start=1):
        documents = apply_patch(documents, patch, f"patch {number}")
    return documents


def refusal(*patches, documents=CONFIG) -> str:
    with pytest.raises(MachineConfigError) as refused:
        patched(*patches, documents=documents)
    return str(refused.value)


def machine_config(documents):
    [found] = [d for d in documents if document_id(d) == ("", "v1alpha1", "")]
    return found


def at(document, path):
    for part in path:
        document = document[part]
    return document


def replaced(document, path, value):
    """A copy of document with the value at path replaced."""
    document = copy.deepcopy(document)
    at(document, path[:-1])[path[-1]] = value
    return document


# --- which document a patch addresses ---------------------------------------------------------------


@pytest.mark.parametrize("document, expected", [
    ({"machine": {}}, ("", "v1alpha1", "")),
    ({"apiVersion": "v1alpha1", "kind": "HostnameConfig"}, ("v1alpha1", "HostnameConfig", "")),
    ({"apiVersion": "v1alpha1", "kind": "LinkConfig", "name": "net0"}, ("v1alpha1", "LinkConfig", "net0")),
    ({"apiVersion": "v1alpha1", "kind": "LinkConfig", "name": None}, ("v1alpha1", "LinkConfig", "")),
    ({"apiVersion": "v1alpha1", "kind": "Layer2VIPConfig", "name": 10}, ("v1alpha1", "Layer2VIPConfig", "10")),
    ({"kind": "HostnameConfig"}, ("", "HostnameConfig", "")),
    ({"apiVersion": "v1alpha1", "name": "x"}, ("v1alpha1", "", "x")),
])
def test_a_document_is_identified_by_api_version_kind_and_name(document, expected):
    assert document_id(document) == expected


def test_documents_are_patched_in_place_matched_by_kind_and_name_or_appended():
    documents = patched(
        "apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: other\nenvironment: [C=3]\n"
        "---\napiVersion: v1alpha1\nkind: HostnameConfig\nhostname: cp-1\nauto: \"off\"\n"
        "---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: tailscale\nenvironment: [B=2]\n",
        {"machine": {"certSANs": ["b.example"]}},
    )
    assert documents == [
        replaced(MACHINE_CONFIG, ("machine", "certSANs"), ["a.example", "b.example"]),
        {"apiVersion": "v1alpha1", "kind": "HostnameConfig", "auto": "off", "hostname": "cp-1"},
        replaced(SERVICE, ("environment",), ["A=1", "B=2"]),
        RULE,
        {"apiVersion": "v1alpha1", "kind": "ExtensionServiceConfig", "name": "other", "environment": ["C=3"]},
    ]


# --- strategic merge of the v1alpha1 document ------------------------------------------------------------


@pytest.mark.parametrize("patch, path, expected", [
    # maps merge key by key, lists append
    ({"machine": {"features": {"kubePrism": {"port": 7446}}}}, ("machine", "features"),
     {"hostDNS": {"enabled": True, "forwardKubeDNSToHost": True}, "kubePrism": {"enabled": True, "port": 7446}}),
    ({"machine": {"certSANs": ["b.example"]}}, ("machine", "certSANs"), ["a.example", "b.example"]),
    # a null changes nothing, and the keys after it still apply
    ({"machine": {"nodeLabels": None, "certSANs": ["b.example"]}}, ("machine",),
     replaced(MACHINE_CONFIG, ("machine", "certSANs"), ["a.example", "b.example"])["machine"]),
    # subnets and the audit policy are replaced whole
    ({"cluster": {"network": {"podSubnets": ["10.42.0.0/16"], "serviceSubnets": ["10.43.0.0/16"]}}},
     ("cluster", "network"),
     {"dnsDomain": "cluster.local", "podSubnets": ["10.42.0.0/16"], "serviceSubnets": ["10.43.0.0/16"]}),
    ({"cluster": {"apiServer": {"auditPolicy": {"rules": [{"level": "None"}]}}}}, ("cluster", "apiServer", "auditPolicy"),
     {"rules": [{"level": "None"}]}),
    # extraArgs merge key by key; a key's value ("" or a list too) replaces the old one
    ({"machine": {"kubelet": {"extraArgs": {"rotate-server-certificates": "", "node-ip": ["192.168.0.0/16"],
                                            "cloud-provider": "external"}}}},
     ("machine", "kubelet", "extraArgs"),
     {"rotate-server-certificates": "", "node-ip": ["192.168.0.0/16"], "cloud-provider": "external"}),
    # other string maps merge key by key, where "" leaves a set value
    ({"machine": {"nodeLabels": {"zone": "", "rack": "r1"}}}, ("machine", "nodeLabels"), {"zone": "a", "rack": "r1"}),
    # a map of structs merges each entry as that struct
    ({"machine": {"registries": {"mirrors": {"docker.io": {"endpoints": ["https://mirror-2"]},
                                             "ghcr.io": {"endpoints": ["https://mirror-3"]}}}}},
     ("machine", "registries", "mirrors"),
     {"docker.io": {"endpoints": ["https://mirror-1", "https://mirror-2"]}, "ghcr.io": {"endpoints": ["https://mirror-3"]}}),
    # a map of structs merges each entry as that struct: "" leaves the username, replaces the CA's bytes
    ({"machine": {"registries": {"config": {"registry.example": {"tls": {"ca": ""}, "auth": {"username": ""}}}}}},
     ("machine", "registries", "config"), {"registry.example": {"tls": {"ca": ""}, "auth": {"username": "u"}}}),
    # "" and 0 leave a set string/integer, false and other values replace; a pointer takes its 0
    ({"machine": {"install": {"disk": "", "wipe": False}}}, ("machine", "install"), {"disk": "/dev/sda", "wipe": False}),
    ({"machine": {"install": {"disk": "/dev/vda"}}}, ("machine", "install"), {"disk": "/dev/vda", "wipe": True}),
    ({"machine": {"features": {"kubePrism": {"port": 0}}}}, ("machine", "features", "kubePrism", "port"), 7445),
    ({"machine": {"features": {"kubePrism": {"port": 1}}}}, ("machine", "features", "kubePrism", "port"), 1),
    ({"machine": {"network": {"kubespan": {"mtu": 0}}}}, ("machine", "network", "kubespan"), {"enabled": True, "mtu": 0}),
    # interfaces merge by name, or by an equal device selector; others are appended
    ({"machine": {"network": {"interfaces": [{"interface": "eth0", "mtu": 1400}]}}},
     ("machine", "network", "interfaces"), [{**ETH0, "mtu": 1400}, NIC]),
    ({"machine": {"network": {"interfaces": [{"deviceSelector": {"hardwareAddr": "bc:24:11:00:00:01"},
                                              "addresses": ["10.0.0.3/24"]}]}}},
     ("machine", "network", "interfaces"), [ETH0, {**NIC, "addresses": ["10.0.0.2/24", "10.0.0.3/24"]}]),
    ({"machine": {"network": {"interfaces": [{"deviceSelector": {"hardwareAddr": "bc:24:11:00:00:02"}, "dhcp": True},
                                             {"interface": "eth1", "dhcp": True}]}}},
     ("machine", "network", "interfaces"),
     [ETH0, NIC, {"deviceSelector": {"hardwareAddr": "bc:24:11:00:00:02"}, "dhcp": True}, {"interface": "eth1", "dhcp": True}]),
    # an empty interface name does not match: the device selector does
    ({"machine": {"network": {"interfaces": [{"interface": "", "deviceSelector": {"hardwareAddr": "bc:24:11:00:00:01"},
                                              "mtu": 9000}]}}},
     ("machine", "network", "interfaces"), [ETH0, {**NIC, "interface": "", "mtu": 9000}]),
    # VLANs merge by vlanId; a VLAN without one is appended
    ({"machine": {"network": {"interfaces": [{"interface": "eth0", "vlans": [{"vlanId": 10, "mtu": 1400},
                                                                            {"vlanId": 20}, {"dhcp": False}]}]}}},
     ("machine", "network", "interfaces", 0, "vlans"),
     [{"vlanId": 10, "dhcp": True, "mtu": 1400}, {"vlanId": 20}, {"dhcp": False}]),
    # admission plugins merge by name
    ({"cluster": {"apiServer": {"admissionControl": [
        {"name": "PodSecurity", "configuration": {"defaults": {"enforce": "restricted"}}},
        {"name": "EventRateLimit", "configuration": {"limits": [{"type": "Server", "qps": 10}]}}]}}},
     ("cluster", "apiServer", "admissionControl"),
     [{"name": "PodSecurity", "configuration": {"defaults": {"enforce": "restricted", "audit": "restricted"}}},
      {"name": "EventRateLimit", "configuration": {"limits": [{"type": "Server", "qps": 10}]}}]),
])
def test_strategic_merge_rules_of_the_v1alpha1_document(patch, path, expected):
    assert at(machine_config(patched(patch)), path) == expected


@pytest.mark.parametrize("patch, expected", [
    # ExtensionServiceConfig: configFiles merge by mountPath, other lists append
    ({"apiVersion": "v1alpha1", "kind": "ExtensionServiceConfig", "name": "tailscale", "environment": ["B=2"],
      "configFiles": [{"mountPath": "/etc/a", "content": "b"}, {"mountPath": "/etc/b", "content": "c"}]},
     {**SERVICE, "environment": ["A=1", "B=2"],
      "configFiles": [{"mountPath": "/etc/a", "content": "b"}, {"mountPath": "/etc/b", "content": "c"}]}),
    # NetworkRuleConfig: ports and ingress are replaced
    ({"apiVersion": "v1alpha1", "kind": "NetworkRuleConfig", "name": "kubelet",
      "portSelector": {"ports": [10255]}, "ingress": [{"subnet": "192.168.0.0/16"}]},
     {**RULE, "portSelector": {"ports": [10255], "protocol": "tcp"}, "ingress": [{"subnet": "192.168.0.0/16"}]}),
    # a kind without rules of its own merges maps and overwrites scalars
    ({"apiVersion": "v1alpha1", "kind": "HostnameConfig", "auto": "off", "hostname": "cp-1"},
     {**HOSTNAME, "auto": "off", "hostname": "cp-1"}),
])
def test_other_documents_merge_by_the_rules_of_their_kind(patch, expected):
    documents = patched(patch)
    assert [d for d in documents if document_id(d) == document_id(patch)] == [expected]
    assert machine_config(documents) == MACHINE_CONFIG


def test_an_empty_string_in_a_document_of_its_own_leaves_the_set_value_as_in_v1alpha1():
    v1_14_disk = {"apiVersion": "v1alpha1", "kind": "UnattendedInstallConfig",
                  "provisioning": {"diskSelector": {"match": 'disk.dev_path == "/dev/sda"'}}}
    documents = mc.render_documents(seed.shared_bundle(), seed.CLUSTER_NAME, seed.ENDPOINT, "worker", "v1.14.0",
                                    "1.37.0", [v1_14_disk, {"apiVersion": "v1alpha1", "kind": "KubeNetworkConfig",
                                                            "dnsDomain": "", "podSubnets": ["10.42.0.0/16"]}])
    assert [d for d in documents if d.get("kind") == "KubeNetworkConfig"] == [
        {"apiVersion": "v1alpha1", "kind": "KubeNetworkConfig", "dnsDomain": "cluster.local",
         "podSubnets": ["10.42.0.0/16"], "serviceSubnets": ["10.96.0.0/12"]}]


# --- $patch: delete --------------------------------------------------------------------------------


@pytest.mark.parametrize("patch, path, expected", [
    ("machine:\n  features:\n    hostDNS:\n      $patch: delete\n", ("machine", "features"),
     {"kubePrism": {"enabled": True, "port": 7445}}),
    ("machine:\n  certSANs:\n    $patch: delete\n  nodeLabels:\n    rack: r1\n", ("machine",),
     {k: v for k, v in {**MACHINE_CONFIG["machine"], "nodeLabels": {"zone": "a", "rack": "r1"}}.items()
      if k != "certSANs"}),
    ("cluster:\n  $patch: delete\n", (), {k: v for k, v in MACHINE_CONFIG.items() if k != "cluster"}),
    # list items: matched by their first other key, the rest of the list merges as usual
    ("machine:\n  network:\n    interfaces:\n      - interface: eth0\n        $patch: delete\n"
     "      - deviceSelector:\n          hardwareAddr: bc:24:11:00:00:01\n        mtu: 1400\n"
     "      - interface: eth1\n        dhcp: true\n",
     ("machine", "network", "interfaces"), [{**NIC, "mtu": 1400}, {"interface": "eth1", "dhcp": True}]),
    ("machine:\n  network:\n    interfaces:\n      - deviceSelector:\n          hardwareAddr: bc:24:11:00:00:01\n"
     "        $patch: delete\n",
     ("machine", "network", "interfaces"), [ETH0]),
])
def test_patch_delete_removes_a_key_or_the_matching_list_items(patch, path, expected):
    assert at(machine_config(patched(patch)), path) == expected


def test_patch_delete_removes_documents_and_the_rest_of_the_patch_still_applies():
    documents = patched("apiVersion: v1alpha1\nkind: HostnameConfig\n$patch: delete\n"
                        "---\napiVersion: v1alpha1\nkind: NetworkRuleConfig\nname: kubelet\ningress: [{subnet: 192.168.0.0/16}]\n"
                        "---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: tailscale\n$patch: delete\n")
    assert documents == [MACHINE_CONFIG, {**RULE, "ingress": [{"subnet": "192.168.0.0/16"}]}]


# --- RFC 6902 JSON patches ------------------------------------------------------------------------------


def test_json_patch_operations_apply_in_order_to_the_v1alpha1_document():
    operations = [
        {"op": "test", "path": "/machine/install/disk", "value": "/dev/sda"},
        {"op": "copy", "from": "/machine/nodeLabels", "path": "/machine/nodeAnnotations"},
        {"op": "move", "from": "/machine/certSANs", "path": "/cluster/apiServer/certSANs"},
        {"op": "add", "path": "/cluster/apiServer/certSANs/-", "value": "b.example"},
        {"op": "replace", "path": "/cluster/network/dnsDomain", "value": "k8s.internal"},
        {"op": "remove", "path": "/machine/features/hostDNS"},
    ]
    expected = copy.deepcopy(MACHINE_CONFIG)
    expected["machine"]["nodeAnnotations"] = {"zone": "a"}
    del expected["machine"]["certSANs"]
    expected["cluster"]["apiServer"]["certSANs"] = ["a.example", "b.example"]
    expected["cluster"]["network"]["dnsDomain"] = "k8s.internal"
    del expected["machine"]["features"]["hostDNS"]
    assert patched(operations) == [expected, HOSTNAME, SERVICE, RULE]
    text = "".join(f"- {{op: {o['op']}, path: {o['path']}"
                   + (f", from: {o['from']}" if "from" in o else "")
                   + (f", value: {o['value']!r}" if "value" in o else "") + "}\n" for o in operations)
    assert patched(text) == [expected, HOSTNAME, SERVICE, RULE]


KIND_ONLY = {"kind": "HostnameConfig", "auto": "off"}


@pytest.mark.parametrize("documents", [
    [MACHINE_CONFIG, HOSTNAME, SERVICE],
    [HOSTNAME, MACHINE_CONFIG, SERVICE],
    [HOSTNAME, SERVICE, MACHINE_CONFIG],
    [KIND_ONLY, MACHINE_CONFIG],
], ids=["first", "middle", "last", "after-a-document-naming-only-its-kind"])
def test_a_json_patch_changes_the_v1alpha1_document_wherever_it_is_and_nothing_else(documents):
    result = patched([{"op": "add", "path": "/machine/nodeLabels/rack", "value": "r1"}], documents=documents)
    index = documents.index(MACHINE_CONFIG)
    assert result == [*documents[:index], replaced(MACHINE_CONFIG, ("machine", "nodeLabels", "rack"), "r1"),
                      *documents[index + 1:]]


# --- what the caller gave is left alone -------------------------------------------------------------------


@pytest.mark.parametrize("patch", [
    "machine:\n  features:\n    hostDNS:\n      $patch: delete\n  network:\n    interfaces:\n"
    "      - interface: eth0\n        mtu: 1400\n        vlans: [{vlanId: 10, mtu: 1400}]\n"
    "  kubelet:\n    extraArgs:\n      node-ip: [192.168.0.0/16]\n"
    "cluster:\n  apiServer:\n    admissionControl:\n      - name: PodSecurity\n"
    "        configuration: {defaults: {enforce: restricted}}\n"
    "---\napiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: tailscale\n"
    "configFiles: [{mountPath: /etc/a, content: b}]\n",
    [{"op": "add", "path": "/machine/nodeLabels/rack", "value": "r1"},
     {"op": "add", "path": "/machine/network/interfaces/0/vlans/-", "value": {"vlanId": 20}}],
], ids=["strategic", "json6902"])
def test_apply_patch_leaves_the_documents_it_was_given_as_they_were(patch):
    documents = copy.deepcopy(CONFIG)
    result = apply_patch(documents, patch, "patch 1")
    assert documents == CONFIG and result != CONFIG


def test_a_parsed_patch_shares_nothing_with_the_callers_patch_or_an_earlier_parse():
    patch = {"machine": {"nodeLabels": {"zone": "b"}, "certSANs": ["b.example"]}}
    kind, [document] = parse_patch(patch, "patch 1")
    assert (kind, document) == ("strategic", patch)
    document["machine"]["nodeLabels"]["zone"] = "c"
    document["machine"]["certSANs"].append("c.example")
    assert patch == {"machine": {"nodeLabels": {"zone": "b"}, "certSANs": ["b.example"]}}

    text = "machine:\n  nodeLabels:\n    zone: b\n"
    _, [first] = parse_patch(text, "patch 1")
    first["machine"]["nodeLabels"]["zone"] = "c"
    assert parse_patch(text, "patch 2") == ("strategic", [{"machine": {"nodeLabels": {"zone": "b"}}}])


# --- refusals ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("patch, expected", [
    # what a patch is
    (42, "patch 1: is a int; expected a mapping, YAML text or a list of RFC 6902 operations"),
    (None, "patch 1: is a NoneType; expected a mapping, YAML text or a list of RFC 6902 operations"),
    ("", "patch 1: is empty"),
    ("---\n", "patch 1: is empty"),
    ("machine: [\n", "patch 1: not valid YAML at line 2, column 1"),
    ("just text", "patch 1: document 1 is a str; expected a mapping (strategic merge) or one list of RFC 6902 operations"),
    ("machine: {}\n---\n- op: remove\n  path: /machine\n",
     "patch 1: document 2 is a list; expected a mapping (strategic merge) or one list of RFC 6902 operations"),
    ("- op: remove\n  path: /machine\n---\nmachine: {}\n",
     "patch 1: document 1 is a list; expected a mapping (strategic merge) or one list of RFC 6902 operations"),
    # RFC 6902 operations
    ([{"op": "add", "value": 1}], "patch 1: operation 1 is not an RFC 6902 operation; expected a mapping with "
                                  "op (add/remove/replace/move/copy/test) and path"),
    ([{"op": "remove", "path": "/machine/nodeLabels"}, "remove /machine"],
     "patch 1: operation 2 is not an RFC 6902 operation; expected a mapping with op (add/remove/replace/move/copy/test) "
     "and path"),
    ("- op: remove\n  path: /machine/nodeLabels\n- op: delete\n  path: /machine\n",
     "patch 1: operation 2 is not an RFC 6902 operation; expected a mapping with op (add/remove/replace/move/copy/test) "
     "and path"),
    ([{"op": "remove", "path": "/machine/sysfs"}],
     "patch 1: operation 1 (remove /machine/sysfs) cannot be applied to the v1alpha1 document (JsonPatchConflict)"),
    ([{"op": "remove", "path": "/machine/nodeLabels"}, {"op": "test", "path": "/machine/install/disk", "value": "/dev/vda"}],
     "patch 1: operation 2 (test /machine/install/disk) cannot be applied to the v1alpha1 document "
     "(JsonPatchTestFailed)"),
    ([{"op": "add", "path": "machine/nodeLabels", "value": {}}],
     "patch 1: operation 1 (add machine/nodeLabels) cannot be applied to the v1alpha1 document (JsonPointerException)"),
    ([{"op": "replace", "path": "", "value": ["x"]}], "patch 1: the v1alpha1 document is no longer a mapping"),
    # documents
    ("apiVersion: v1alpha1\nname: x\n", "patch 1: a document with apiVersion needs a kind too"),
    ({"$patch": "delete"}, "patch 1: the v1alpha1 document cannot be deleted"),
    ("apiVersion: v1alpha1\nkind: KubeSpanConfig\n$patch: delete\n",
     "patch 1: $patch: delete of document v1alpha1/KubeSpanConfig, which the config does not have"),
    ("apiVersion: v1alpha1\nkind: ExtensionServiceConfig\nname: other\n$patch: delete\n",
     "patch 1: $patch: delete of document v1alpha1/ExtensionServiceConfig named 'other', which the config does not have"),
    ("apiVersion: v1alpha1\nkind: KubeSpanConfig\nfilters:\n  $patch: delete\n",
     "patch 1: $patch: delete inside document v1alpha1/KubeSpanConfig, which the config does not have"),
    # keys and list items to delete
    ({"machine": {"sysfs": {"$patch": "delete"}}},
     "patch 1: $patch: delete of machine.sysfs, which the config does not have"),
    ({"machine": {"logging": {"destinations": {"$patch": "delete"}}}},
     "patch 1: $patch: delete of machine.logging.destinations, which the config does not have"),
    ({"machine": {"certSANs": {"first": {"$patch": "delete"}}}},
     "patch 1: $patch: delete of machine.certSANs.first, which the config does not have"),
    ({"machine": {"nodeLabels": [{"zone": "a", "$patch": "delete"}]}},
     "patch 1: $patch: delete expects machine.nodeLabels to be a list"),
    ({"machine": {"network": {"interfaces": [{"interface": "eth9", "$patch": "delete"}]}}},
     "patch 1: $patch: delete found no item of machine.network.interfaces with that interface"),
    ({"machine": {"network": {"interfaces": [
        {"deviceSelector": "{'hardwareAddr': 'bc:24:11:00:00:01'}", "$patch": "delete"}]}}},
     "patch 1: $patch: delete found no item of machine.network.interfaces with that deviceSelector"),
    ({"machine": {"network": {"interfaces": [{"$patch": "delete"}]}}},
     "patch 1: $patch: delete in list machine.network.interfaces needs a key to match the item, "
     "e.g. {interface: eth0, $patch: delete}"),
    ({"machine": {"network": {"interfaces": [{"interface": "eth0", "mtu": 1400},
                                             {"interface": "eth1", "dhcpOptions": {"$patch": "delete"}}]}}},
     "patch 1: cannot delete the inner key machine.network.interfaces[1].dhcpOptions"),
    # An item merged into its match by key is named by the match's index.
    ({"machine": {"network": {"interfaces": [{"deviceSelector": {"hardwareAddr": "bc:24:11:00:00:01"},
                                              "addresses": {"a": 1}}]}}},
     "patch 1: machine.network.interfaces[1].addresses is a mapping in the patch but a list in the config; "
     "expected a list"),
    ({"machine": {"network": {"interfaces": [{"interface": "eth0", "vlans": [{"vlanId": 10, "dhcp": {"on": True}}]}]}}},
     "patch 1: machine.network.interfaces[0].vlans[0].dhcp is a mapping in the patch but a scalar in the config; "
     "expected a scalar"),
    # Talos refuses it too ("searching for complex paths in slices is not supported"), checked with its machinery.
    ({"machine": {"network": {"interfaces": [{"interface": "eth0", "vlans": [{"vlanId": 10, "$patch": "delete"}]}]}}},
     "patch 1: cannot delete an item of the inner list machine.network.interfaces[0].vlans"),
    # shapes
    ({"machine": {"install": "/dev/sda"}},
     "patch 1: machine.install is a scalar in the patch but a mapping in the config; expected a mapping"),
    ({"machine": {"certSANs": {"a.example": True}}},
     "patch 1: machine.certSANs is a mapping in the patch but a list in the config; expected a list"),
    ({"machine": {"nodeLabels": {"zone": ["a", "b"]}}},
     "patch 1: machine.nodeLabels.zone is a list in the patch but a scalar in the config; expected a scalar"),
    ({"machine": {"type": ["worker"]}},
     "patch 1: machine.type is a list in the patch but a scalar in the config; expected a scalar"),
    ({"machine": {"registries": {"mirrors": {"docker.io": {"endpoints": "https://mirror-2"}}}}},
     "patch 1: machine.registries.mirrors.docker.io.endpoints is a scalar in the patch but a list in the config; "
     "expected a list"),
    ({"machine": {"network": {"interfaces": [{"interface": "eth0", "vlans": {"vlanId": 20}}]}}},
     "patch 1: machine.network.interfaces[0].vlans is a mapping in the patch but a list in the config; expected a list"),
])
def test_a_patch_that_cannot_apply_is_refused_naming_it_and_the_place(patch, expected):
    assert refusal(patch) == expected


def test_a_delete_inside_a_missing_v1alpha1_document_is_refused():
    assert refusal({"machine": {"sysfs": {"$patch": "delete"}}}, documents=[HOSTNAME]) == (
        "patch 1: $patch: delete inside the v1alpha1 document, which the config does not have")



# --- YAML aliases -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("patches, path, expected", [
    # components sharing their arguments through an anchor: a later patch of one leaves the other
    (["cluster:\n  controllerManager: &component\n    extraArgs:\n      v: '2'\n  scheduler: *component\n",
      {"cluster": {"scheduler": {"extraArgs": {"bind-address": "0.0.0.0"}}}}],
     ("cluster", "controllerManager"), {"extraArgs": {"v": "2"}}),
    ([{"cluster": {"apiServer": {"extraArgs": {"v": "1"}}, "controllerManager": {"extraArgs": {"v": "1"}}}},
      "cluster:\n  apiServer:\n    extraArgs: &args\n      feature-gates: [A=true]\n"
      "  controllerManager:\n    extraArgs: *args\n",
      [{"op": "add", "path": "/cluster/apiServer/extraArgs/feature-gates/-", "value": "B=true"}]],
     ("cluster", "controllerManager", "extraArgs"), {"v": "1", "feature-gates": ["A=true"]}),
    # interfaces sharing DHCP options through an anchor
    (["machine:\n  network:\n    interfaces:\n      - interface: eth1\n        dhcpOptions: &dhcp\n"
      "          routeMetric: 100\n      - interface: eth2\n        dhcpOptions: *dhcp\n",
      {"machine": {"network": {"interfaces": [{"interface": "eth2", "dhcpOptions": {"routeMetric": 200}}]}}}],
     ("machine", "network", "interfaces", 2), {"interface": "eth1", "dhcpOptions": {"routeMetric": 100}}),
    # and routes appended to two interfaces
    ([{"machine": {"network": {"interfaces": [
        {"interface": "eth0", "routes": [{"network": "10.1.0.0/16", "gateway": "10.0.0.1"}]},
        {"deviceSelector": {"hardwareAddr": "bc:24:11:00:00:01"},
         "routes": [{"network": "10.1.0.0/16", "gateway": "10.0.0.1"}]}]}}},
      "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        routes:\n"
      "          - &default {network: 0.0.0.0/0, gateway: 10.0.0.1}\n"
      "      - deviceSelector: {hardwareAddr: 'bc:24:11:00:00:01'}\n        routes: [*default]\n",
      [{"op": "add", "path": "/machine/network/interfaces/0/routes/1/metric", "value": 1024}]],
     ("machine", "network", "interfaces", 1, "routes"),
     [{"network": "10.1.0.0/16", "gateway": "10.0.0.1"}, {"network": "0.0.0.0/0", "gateway": "10.0.0.1"}]),
])
def test_a_yaml_alias_in_a_patch_gives_each_place_its_own_value(patches, path, expected):
    assert at(machine_config(patched(*patches)), path) == expected
