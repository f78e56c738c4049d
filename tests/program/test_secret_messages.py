"""No message names a secret value: keys set with `pulumi config set --secret` are named, never quoted."""

from __future__ import annotations

import copy
import json

import pulumi
import pytest

from talos_proxmox.settings.model import PROJECT, SettingsError
from talos_proxmox.settings.stack_config import MASK, StackConfig, load_stack, mask_secrets
from tests.paths import REPO
from tests.program.mocked_program import run_program, stack_config

SECRET = "s3cr3t-Pa55w0rd-value"


def _refused(config: dict, secret_keys: list[str], other: dict | None = None) -> tuple[str, list[str]]:
    with pytest.raises(pulumi.RunError) as err:
        run_program(config, stack="dev", other_config=other or {}, secret_keys=secret_keys)
    return str(err.value), err.value.program_run.warnings


def test_a_secret_inside_a_bad_patch_is_in_no_message():
    config = stack_config("dev")
    config["cluster"]["patches"] = [{"machine": {"kubelett": {"extraArgs": {"bootstrap": SECRET}}}}]
    message, warnings = _refused(config, [f"{PROJECT}:cluster"])
    assert message == (
        "invalid stack config:\n  - talos-proxmox:cluster.patches[0]: nodes dev-cp-1, dev-worker-1: leaves the "
        "machine config invalid: unknown key 'kubelett' at machine; did you mean 'kubelet'?")
    assert SECRET not in message and not any(SECRET in w for w in warnings)


def test_secret_values_of_misspelled_and_wrong_keys_are_named_not_quoted():
    config = stack_config("dev")
    config["cluster"]["tokn"] = SECRET
    config["cluster"]["name"] = SECRET.upper()
    config["clustr"] = {"token": SECRET}
    other = {"talos-proxmx:ccm": json.dumps({"enabled": SECRET})}
    message, warnings = _refused(config, [f"{PROJECT}:cluster", f"{PROJECT}:clustr", "talos-proxmx:ccm"], other)
    assert message.splitlines() == [
        "invalid stack config:",
        "  - talos-proxmx:ccm: namespace 'talos-proxmx' is not one this program reads, so the key would be "
        "ignored (expected talos-proxmox:ccm)",
        "  - talos-proxmox:clustr: is not a known key (expected one of: cluster, network, proxmox, image, nodes, "
        "cilium, hubble, ccm, csi, backups, health, lifecycle)",
        "  - talos-proxmox:cluster.tokn: [secret] is not a known key (expected one of: name, endpoint, vip, "
        "talosVersion, kubernetesVersion, podSubnets, serviceSubnets, domain, installDisk, kubespan, discovery, "
        "patches, rolePatches, secretsFile, systemDiskEncryption, deletionProtection, allowDowngrade, recoverFrom, recoverIdentityFile)",
        "  - talos-proxmox:cluster.name: [secret] is not a cluster name (expected lowercase letters, digits and "
        "'-', at most 63)",
    ]
    assert SECRET not in message and SECRET.upper() not in message


def test_a_secret_of_another_namespace_pasted_into_plain_config_is_masked():
    """The Proxmox password is secret; the same text in a plain key's bad value is masked there too."""
    config = stack_config("dev")
    config["proxmox"]["node"] = f"pve {SECRET}"
    message, _ = _refused(config, ["proxmoxve:password"], {"proxmoxve:password": SECRET})
    assert message == ("invalid stack config:\n  - talos-proxmox:proxmox.node: 'pve [secret]' is not a Proxmox "
                       "node name (expected e.g. pve)")


def test_masking_goes_longest_first_so_no_tail_of_a_longer_secret_shows():
    assert mask_secrets(["a abcdef-123456 b abcdef"], {"abcdef", "abcdef-123456"}) == [
        f"a {MASK} b {MASK}"]
    assert mask_secrets(["a 123 b"], {"123"}) == ["a 123 b"]  # too short to mask without hiding other text


def test_load_stack_with_secret_keys_from_a_file_shape():
    """From a stack file, a secret project key is ciphertext only Pulumi decrypts: the render command says so."""
    values = {f"{PROJECT}:{k}": v for k, v in stack_config("dev").items()}
    values[f"{PROJECT}:cilium"] = {"secure": "v1:abc:def"}
    with pytest.raises(SettingsError) as err:
        load_stack(StackConfig(values, frozenset({f"{PROJECT}:cilium"})), base_dir=REPO)
    assert err.value.problems == [
        "talos-proxmox:cilium: is a secret, which only `pulumi preview`/`pulumi up` can decrypt (expected a "
        "plain value for the offline render command)"]
    assert "v1:abc:def" not in str(err.value)
