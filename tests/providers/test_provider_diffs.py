"""How the providers' check and diff take what the engine hands them in a preview and across ups: values
not known yet (as the dynamic-provider host deserializes them) and talosconfigs that change only in
their endpoints. (The ups themselves run under the real engine: tests/test_engine_*.py.)"""

from __future__ import annotations

from pulumi.output import Unknown

from providers import machine_configuration, node_lifecycle, talos_operations
from providers.talosconfig import TalosconfigProvider
from talos_proxmox.talos_api import operations
from talos_proxmox.talos_config import client_config
from tests.stand_ins.talos_api import shared_bundle

CP1, TALOS, KUBERNETES = "e2e-cp-1", "v1.13.7", "1.36.2"


def test_providers_take_unknowns_as_the_dynamic_provider_host_passes_them():
    """The host deserializes a value a preview has not computed as pulumi.output.Unknown (not the wire's
    sentinel string): checks must defer, diffs must not fail: a changed configuration is "changed"; a
    talosconfig that is unknown (its resource updating) is no reason to fetch the kubeconfig again."""
    unknown = Unknown()
    config_inputs = {"secrets": unknown, "cluster_name": "dev", "endpoint": "https://127.0.0.100:6443",
                     "role": "worker", "talos_version": "v1.13.7", "kubernetes_version": "1.36.2", "patches": []}
    assert machine_configuration.MachineConfigurationProvider().check({}, config_inputs).failures == []
    talosconfig_inputs = {"secrets": unknown, "context": "dev", "endpoints": ["127.0.0.2"], "nodes": ["127.0.0.2"]}
    assert TalosconfigProvider().check({}, talosconfig_inputs).failures == []
    apply_olds = {"node": "127.0.0.5", "mode": "auto", "timeout_seconds": 600, "config_sha256": "0" * 64}
    apply_news = {**apply_olds, "machine_configuration": unknown}
    assert talos_operations.ConfigurationApplyProvider().diff("127.0.0.5", apply_olds, apply_news).changes is True
    kubeconfig_olds = {"node": "127.0.0.2", "timeout_seconds": 600, "talosconfig_sha256": "0" * 64}
    kubeconfig_news = {**kubeconfig_olds, "talosconfig": unknown}
    assert talos_operations.KubeconfigProvider().diff("kubeconfig-127.0.0.2", kubeconfig_olds, kubeconfig_news).changes is False


def talosconfig(bundle: dict, endpoints: list[str], certificate=None) -> str:
    cert, key = certificate or client_config.issue_admin_certificate(bundle)
    return client_config.talosconfig_with_certificate(bundle, "e2e", endpoints, endpoints[:1], cert, key)


def test_kubeconfig_is_fetched_again_for_new_credentials_not_for_other_endpoints():
    bundle = shared_bundle()
    certificate = client_config.issue_admin_certificate(bundle)
    before = talosconfig(bundle, ["127.0.0.2", "127.0.0.3", "127.0.0.4"], certificate)
    olds = {"node": "127.0.0.2", "endpoint": None, "timeout_seconds": 600,
            "talosconfig_sha256": operations.config_sha256(before),
            "credentials_sha256": operations.credentials_sha256(before)}
    provider = talos_operations.KubeconfigProvider()
    fewer_endpoints = talosconfig(bundle, ["127.0.0.2", "127.0.0.3"], certificate)
    renewed = talosconfig(bundle, ["127.0.0.2", "127.0.0.3", "127.0.0.4"])
    assert provider.diff("k", olds, {**olds, "talosconfig": fewer_endpoints}).changes is False
    assert provider.diff("k", olds, {**olds, "talosconfig": renewed}).changes is True
    older_state = {k: v for k, v in olds.items() if k != "credentials_sha256"}  # made before the field
    assert provider.diff("k", older_state, {**older_state, "talosconfig": before}).changes is False
    assert provider.diff("k", older_state, {**older_state, "talosconfig": fewer_endpoints}).changes is True


def test_node_lifecycle_takes_an_unknown_talosconfig_as_unchanged_credentials():
    bundle = shared_bundle()
    olds = {"node_name": CP1, "address": "127.0.0.2", "endpoint": None, "role": "controlplane",
            "installer_image": "factory/installer/x:v1.13.7", "talos_version": TALOS,
            "kubernetes_version": KUBERNETES, "timeout_seconds": 1200, "reset_on_delete": True,
            "talosconfig": talosconfig(bundle, ["127.0.0.2", "127.0.0.3"])}
    provider = node_lifecycle.NodeLifecycleProvider()
    assert provider.diff(CP1, olds, {**olds, "talosconfig": Unknown()}).changes is False
    upgrade = {**olds, "talosconfig": Unknown(), "installer_image": "factory/installer/x:v1.13.8"}
    assert provider.diff(CP1, olds, upgrade).changes is True
    assert provider.diff(CP1, olds, {**olds, "talosconfig": talosconfig(bundle, ["127.0.0.2"])}).changes is True
