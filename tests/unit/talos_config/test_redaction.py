"""Masked machine configs and their diffs: what a preview may show, and what it must never show."""

import base64

import pytest

from talos_proxmox.talos_config import secrets_bundle
from talos_proxmox.talos_config.redaction import (
    MASK,
    SECRET_KEY_NAMES,
    SECRET_PATHS,
    RedactionError,
    bundle_values,
    certificate_fingerprint,
    config_diff,
    redact_config,
    redact_documents,
)
from talos_proxmox.talos_config.machine_config import parse_config, render
from tests.support import seed_cluster as seed


@pytest.fixture(scope="module")
def bundle():
    return seed.shared_bundle()


def _render(bundle, role="controlplane", *extra):
    return render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, role, seed.TALOS_VERSION, seed.KUBERNETES_VERSION,
                  [seed.PATCH_INSTALL, *extra])


def _v1alpha1(text):
    return next(d for d in parse_config(text) if "apiVersion" not in d)


def _at(document, path):
    for part in path:
        if not isinstance(document, dict) or part not in document:
            return None
        document = document[part]
    return document


def _bundle_leaves(bundle):
    """Every leaf string of the bundle, public certificates included, and the PEM text inside each."""
    leaves = []

    def walk(node):
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, str):
            leaves.append(node)
            try:
                decoded = base64.b64decode(node, validate=True).decode("ascii")
            except (ValueError, UnicodeDecodeError):
                return
            if "-----BEGIN" in decoded:
                leaves.append(decoded)
                leaves.extend(line for line in decoded.splitlines() if len(line) >= 16 and "-----" not in line)
    walk(bundle)
    return leaves


def _secret_field_values(config_text):
    v1 = _v1alpha1(config_text)
    return [value for path in SECRET_PATHS if (value := _at(v1, path))]


def test_every_talos_secret_field_is_masked_and_the_rest_kept(bundle):
    text = _render(bundle)
    redacted = _v1alpha1(redact_config(text))
    original = _v1alpha1(text)
    present = [path for path in SECRET_PATHS if _at(original, path)]
    # a control plane carries all of them (secretbox for v1.13, not aescbc)
    assert len(present) == len(SECRET_PATHS) - 1
    for path in present:
        assert _at(redacted, path) == MASK, path
    assert redacted["cluster"]["clusterName"] == seed.CLUSTER_NAME
    assert redacted["machine"]["install"] == original["machine"]["install"]
    assert redacted["machine"]["kubelet"] == original["machine"]["kubelet"]
    assert redacted["machine"]["ca"]["crt"] == certificate_fingerprint(bundle["certs"]["os"]["crt"])
    assert redacted["cluster"]["etcd"]["ca"]["crt"] == certificate_fingerprint(bundle["certs"]["etcd"]["crt"])


def test_layout_is_the_renderers_so_only_masked_lines_differ(bundle):
    text = _render(bundle)
    original_lines, redacted_lines = text.splitlines(), redact_config(text).splitlines()
    assert len(original_lines) == len(redacted_lines)
    changed = [(a, b) for a, b in zip(original_lines, redacted_lines) if a != b]
    assert changed and all(b.endswith(f"'{MASK}'") or "<certificate sha256:" in b for _, b in changed)
    # the second document has no secrets and comes out byte for byte
    assert text.split("---\n")[1] == redact_config(text).split("---\n")[1]


def test_worker_blank_ca_key_stays_blank(bundle):
    redacted = _v1alpha1(redact_config(_render(bundle, "worker")))
    assert redacted["machine"]["ca"]["key"] == ""
    assert redacted["cluster"]["ca"]["key"] == ""
    assert redacted["machine"]["token"] == MASK


def test_credentials_in_other_fields_and_documents_are_masked(bundle):
    patch = """\
machine:
  registries:
    config:
      registry.lab:
        auth:
          username: puller
          password: hunter2-registry
  network:
    interfaces:
      - interface: wg0
        wireguard:
          privateKey: wg-private-key-value
---
apiVersion: v1alpha1
kind: WireguardConfig
name: wg1
privateKey: another-private-key
"""
    redacted = redact_config(_render(bundle, "worker", patch))
    for secret in ("hunter2-registry", "wg-private-key-value", "another-private-key"):
        assert secret not in redacted
    assert "username: puller" in redacted


def test_bundle_values_are_masked_wherever_they_appear(bundle):
    token = bundle["secrets"]["bootstraptoken"]
    key_pem = base64.b64decode(bundle["certs"]["k8s"]["key"]).decode()
    manifest = {"cluster": {"inlineManifests": [
        {"name": "leaky", "contents": f"token: {token}\nkey: |\n{key_pem}"}]}}
    text = _render(bundle, "controlplane", manifest)
    assert token in text
    without_bundle = redact_config(text)
    assert token in without_bundle  # field names alone cannot know a manifest holds a token
    with_bundle = redact_config(text, bundle)
    assert token not in with_bundle and key_pem.splitlines()[1] not in with_bundle
    assert "name: leaky" in with_bundle


def test_preview_diff_of_a_patch_change_shows_the_changed_lines_and_no_secret(bundle):
    # certSANs sits right after machine.ca, so the diff's context lines include the CA lines
    old = _render(bundle, "controlplane", {"machine": {"certSANs": ["10.255.200.201"]}})
    new = _render(bundle, "controlplane", {"machine": {"certSANs": ["10.255.200.201", "api.lab.local"]}})
    diff = config_diff(old, new, bundle)

    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    removed = [line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    assert added == ["+        - api.lab.local"]
    assert removed == []
    assert f"key: '{MASK}'" in diff  # the context reaches machine.ca, masked

    forbidden = _bundle_leaves(bundle) + _secret_field_values(old) + _secret_field_values(new)
    assert len(forbidden) > 20
    for value in forbidden:
        assert value not in diff
    # the same holds without the bundle, by field names alone
    diff_without_bundle = config_diff(old, new)
    for value in forbidden:
        assert value not in diff_without_bundle


def test_a_new_secrets_bundle_shows_only_certificate_fingerprints(bundle):
    other = secrets_bundle.generate_secrets(seed.TALOS_VERSION)
    diff = config_diff(_render(bundle), _render(other))
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed and all("<certificate sha256:" in line for line in changed)
    for value in _bundle_leaves(bundle) + _bundle_leaves(other):
        assert value not in diff


def test_no_change_is_an_empty_diff_and_creation_diffs_against_nothing(bundle):
    text = _render(bundle)
    assert config_diff(text, text, bundle) == ""
    created = config_diff(None, text, bundle)
    assert created.count("\n+") > 20 and bundle["trustdinfo"]["token"] not in created


def test_errors_never_quote_the_config(bundle):
    token = bundle["trustdinfo"]["token"]
    with pytest.raises(RedactionError) as err:
        redact_config(f"machine:\n  token: {token}\n  ca: [unclosed\n")
    assert token not in str(err.value) and "line" in str(err.value)
    with pytest.raises(RedactionError, match="expected a mapping"):
        redact_config(f"- {token}\n")
    assert token not in str(err.value)


# --- the MachineConfiguration resource's redacted_config --------------------------------------

def _config_props(bundle, *extra):
    return {"secrets": bundle, "cluster_name": seed.CLUSTER_NAME, "endpoint": seed.ENDPOINT, "role": "controlplane",
            "talos_version": seed.TALOS_VERSION, "kubernetes_version": seed.KUBERNETES_VERSION,
            "patches": [seed.PATCH_INSTALL, *extra], "machine_configuration": None, "config_sha256": None,
            "redacted_config": None}


def test_machine_configuration_checks_and_outputs_the_redacted_config(bundle):
    from providers.machine_configuration import MachineConfigurationProvider

    provider = MachineConfigurationProvider()
    old_props = _config_props(bundle, {"machine": {"certSANs": ["10.255.200.201"]}})
    new_props = _config_props(bundle, {"machine": {"certSANs": ["10.255.200.201", "api.lab.local"]}})
    old_checked = provider.check({}, old_props)
    new_checked = provider.check(old_checked.inputs, new_props)
    assert not old_checked.failures and not new_checked.failures
    created = provider.create(old_checked.inputs).outs
    assert created["redacted_config"] == old_checked.inputs["redacted_config"]
    assert created["redacted_config"] == redact_config(created["machine_configuration"], bundle)

    # what a preview shows for this node: the checked inputs' redacted_config, old vs new
    preview = config_diff(old_checked.inputs["redacted_config"], new_checked.inputs["redacted_config"])
    added = [line for line in preview.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added == ["+        - api.lab.local"]
    forbidden = _bundle_leaves(bundle) + _secret_field_values(created["machine_configuration"])
    for value in forbidden:
        assert value not in preview
        assert value not in new_checked.inputs["redacted_config"]


def test_redacted_config_is_a_plain_output_while_the_config_stays_secret(bundle):
    import pulumi
    from pulumi.runtime import rpc

    from providers.machine_configuration import MachineConfiguration, MachineConfigurationProvider
    from tests.support.day_two import recording_mocks

    # the engine hands a dynamic provider plain values; mocks see secrets still wrapped
    monitor = recording_mocks(lambda args: MachineConfigurationProvider().create(
        {k: rpc.unwrap_rpc_secret(v) for k, v in args.inputs.items() if k != "__provider"}).outs)

    @pulumi.runtime.test
    def check():
        resource = MachineConfiguration(
            "machineconfig-master-1", secrets=bundle, cluster_name=seed.CLUSTER_NAME, endpoint=seed.ENDPOINT,
            role="controlplane", talos_version=seed.TALOS_VERSION, kubernetes_version=seed.KUBERNETES_VERSION,
            patches=[seed.PATCH_INSTALL])

        def verify(redacted):
            (registration,) = monitor.registrations
            # the engine makes these outputs secret; redacted_config stays readable in previews
            assert {"machine_configuration", "secrets"} <= set(registration.additional_secret_outputs)
            assert "redacted_config" not in registration.additional_secret_outputs
            assert "clusterName: test-cluster" in redacted
            for value in _bundle_leaves(bundle):
                assert value not in redacted

        return resource.redacted_config.apply(verify)

    check()


# --- each rule on its own -----------------------------------------------------------------------------


def _redacted(document, bundle=None):
    [redacted] = redact_documents([document], bundle)
    return redacted


def test_a_bundle_secret_inside_a_longer_one_leaves_no_tail_visible():
    short, long = "zzzzzzzz12", "aaaa-zzzzzzzz12-and-more-secret"  # the shorter one sorts after the longer
    fake_bundle = {"secrets": {"a": short, "b": long}}
    assert bundle_values(fake_bundle) == (long, short)
    assert _redacted({"note": f"x {long} y {short}"}, fake_bundle) == {"note": f"x {MASK} y {MASK}"}


def test_bundle_values_shorter_than_eight_characters_are_not_masked_in_free_text():
    fake_bundle = {"secrets": {"a": "1234567", "b": "12345678"}}
    assert _redacted({"note": "1234567 and 12345678"}, fake_bundle) == {"note": f"1234567 and {MASK}"}
    assert bundle_values(None) == () and bundle_values({}) == ()


@pytest.mark.parametrize("name", sorted(SECRET_KEY_NAMES))
def test_every_credential_key_is_masked_in_any_document(name):
    document = {"apiVersion": "v1alpha1", "kind": "ExtensionServiceConfig", "name": "svc",
                "settings": [{name: "value-of-it", "keep": "visible"}]}
    assert _redacted(document)["settings"] == [{name: MASK, "keep": "visible"}]


def test_talos_secret_paths_are_masked_in_the_v1alpha1_document_only():
    v1alpha1 = {"cluster": {"id": "cluster-id-value", "clusterName": "lab"}}
    assert _redacted(v1alpha1) == {"cluster": {"id": MASK, "clusterName": "lab"}}
    for other in ({"apiVersion": "v1alpha1", **v1alpha1}, {"kind": "Other", **v1alpha1}):
        assert _redacted(other)["cluster"]["id"] == "cluster-id-value"  # `id` is only secret at that path


def test_empty_values_numbers_and_flags_stay_as_they_are():
    document = {"machine": {"token": "", "ca": {"key": "", "crt": ""}}, "port": 6443, "enabled": True,
                "list": [{"password": "p4ss"}, "plain"]}
    assert _redacted(document) == {"machine": {"token": "", "ca": {"key": "", "crt": ""}}, "port": 6443,
                                   "enabled": True, "list": [{"password": MASK}, "plain"]}


def test_a_certificate_shows_as_the_start_of_its_sha256():
    assert certificate_fingerprint("x") == "<certificate sha256:2d711642b726b044>"
    assert _redacted({"crt": "x"}) == {"crt": "<certificate sha256:2d711642b726b044>"}


def test_the_diff_names_both_sides_and_keeps_the_context_asked_for():
    old = "machine:\n  a: 1\n  b: 2\n  c: 3\n"
    new = "machine:\n  a: 1\n  b: 5\n  c: 3\n"
    assert config_diff(old, new, context=0, label="master-1") == (
        "--- master-1 (current)\n+++ master-1 (planned)\n@@ -3 +3 @@\n-    b: 2\n+    b: 5\n")  # Talos YAML: 4 spaces
    assert config_diff(old, new).splitlines()[:2] == ["--- machine config (current)", "+++ machine config (planned)"]
    assert "     a: 1" in config_diff(old, new).splitlines()
    assert redact_config("") == "" and config_diff(None, None) == ""


def test_a_document_that_is_not_a_mapping_is_named_by_its_number_and_kind():
    with pytest.raises(RedactionError) as refused:
        redact_config("machine: {}\n---\n- a\n")
    assert str(refused.value) == "machine configuration document 2 is a list; expected a mapping"


def test_the_diff_masks_bundle_secrets_in_free_text_on_both_sides(bundle):
    token = bundle["secrets"]["bootstraptoken"]

    def with_manifest(contents):
        return _render(bundle, "controlplane", {"cluster": {"inlineManifests": [{"name": "m", "contents": contents}]}})

    diff = config_diff(with_manifest(f"old: {token}"), with_manifest(f"new: {token}"), bundle)
    assert f"-          contents: 'old: {MASK}'" in diff and f"+          contents: 'new: {MASK}'" in diff
    assert token not in diff


def test_the_diff_shows_three_lines_of_context_by_default():
    old = "".join(f"k{i}: {i}\n" for i in range(10))
    new = old.replace("k5: 5", "k5: 50")
    lines = config_diff(old, new).splitlines()
    assert [line for line in lines if line.startswith(" ")] == [f" k{i}: {i}" for i in (2, 3, 4, 6, 7, 8)]


@pytest.mark.parametrize("role", ["controlplane", "worker"])
def test_a_v1_14_config_shows_no_secret_even_without_the_bundle(role):
    # Its keys are PEM text in the Kubernetes documents and the discovery identity has a document of its own.
    bundle = secrets_bundle.generate_secrets("v1.14.0")
    disk = {"apiVersion": "v1alpha1", "kind": "UnattendedInstallConfig",
            "provisioning": {"diskSelector": {"match": 'disk.dev_path == "/dev/sda"'}}}
    text = render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, role, "v1.14.0", "1.37.0", [disk])
    redacted = redact_config(text)
    secrets = [s for s in secrets_bundle.secret_strings(bundle) if len(s) >= 8]
    pem_lines = [line for s in secrets for line in _bundle_leaves({"s": s})[1:] if "-----" not in line]
    assert [s for s in secrets + pem_lines if s in redacted] == []
    documents = {d.get("kind", "v1alpha1"): d for d in parse_config(redacted)}
    assert documents["DiscoveryIdentityConfig"]["clusterSecret"] == MASK
    ca = documents["KubeAPIServerCAConfig"]
    shown = ca["issuingCA"]["cert"] if role == "controlplane" else ca["acceptedCAs"][0]
    assert shown.startswith("-----BEGIN CERTIFICATE-----") or shown.startswith("<certificate sha256:")
    if role == "controlplane":
        assert ca["issuingCA"] == {"cert": certificate_fingerprint(ca_pem(bundle)), "key": MASK}
        assert documents["KubeServiceAccountConfig"]["issuer"]["privateKey"] == MASK


def ca_pem(bundle):
    return base64.b64decode(bundle["certs"]["k8s"]["crt"]).decode()
