"""talosconfig: format, the os:admin client certificate, and a real mTLS call with it."""

import base64
import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from talos_proxmox.talos_config import pki, client_config, secrets_bundle, talos_yaml
from talos_proxmox.talos_config.client_config import TalosconfigError, talosconfig
from tests.support import seed_cluster as seed

ENDPOINTS = ["10.255.200.201", "10.255.200.202", "10.255.200.203"]


@pytest.fixture(scope="module")
def bundle():
    return seed.shared_bundle()


def _context(text, name="test-cluster"):
    config = talos_yaml.load_documents(text)[0]
    assert config["context"] == name
    return config["contexts"][name]


def test_talosconfig_has_talosctl_format(bundle):
    text = talosconfig(bundle, "test-cluster", ENDPOINTS, ["10.255.200.201"])
    assert text.startswith("context: test-cluster\ncontexts:\n    test-cluster:\n        endpoints:\n"
                           "            - 10.255.200.201\n")
    entry = _context(text)
    assert list(entry) == ["endpoints", "nodes", "ca", "crt", "key"]
    assert entry["endpoints"] == ENDPOINTS
    assert entry["nodes"] == ["10.255.200.201"]
    assert entry["ca"] == bundle["certs"]["os"]["crt"]
    # Without nodes the key is left out, as talosctl does (omitempty).
    assert "nodes" not in _context(talosconfig(bundle, "test-cluster", ENDPOINTS, []))


def test_client_certificate_is_os_admin_signed_by_the_os_ca(bundle):
    entry = _context(talosconfig(bundle, "test-cluster", ENDPOINTS, []))
    cert_pem, key_pem = base64.b64decode(entry["crt"]), base64.b64decode(entry["key"])
    cert = x509.load_pem_x509_certificate(cert_pem)
    os_ca = x509.load_pem_x509_certificate(base64.b64decode(bundle["certs"]["os"]["crt"]))
    cert.verify_directly_issued_by(os_ca)
    pki.verify_issued_by(cert_pem, base64.b64decode(bundle["certs"]["os"]["crt"]))
    assert [(a.oid, a.value) for a in cert.subject] == [(NameOID.ORGANIZATION_NAME, "os:admin")]
    assert cert.issuer == os_ca.subject
    assert isinstance(cert.public_key(), ed25519.Ed25519PublicKey)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and not usage.key_cert_sign
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(days=365)
    assert key_pem.startswith(b"-----BEGIN ED25519 PRIVATE KEY-----")  # talosctl's label
    pki.check_pair(cert_pem, key_pem)
    # The client certificate does not verify against another cluster's OS CA.
    other = secrets_bundle.generate_secrets("v1.13.7")
    with pytest.raises(pki.PKIError):
        pki.verify_issued_by(cert_pem, base64.b64decode(other["certs"]["os"]["crt"]))


def test_each_call_issues_a_new_certificate_but_reuse_is_byte_stable(bundle):
    assert talosconfig(bundle, "c", ENDPOINTS) != talosconfig(bundle, "c", ENDPOINTS)
    cert, key = client_config.issue_admin_certificate(bundle)
    first = client_config.talosconfig_with_certificate(bundle, "c", ENDPOINTS, [], cert, key)
    assert first == client_config.talosconfig_with_certificate(bundle, "c", ENDPOINTS, [], cert, key)


def test_other_roles_and_refusals(bundle):
    cert, _ = client_config.issue_admin_certificate(bundle, roles=("os:reader",))
    assert pki.load_cert(cert).subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "os:reader"
    with pytest.raises(TalosconfigError, match="roles"):
        client_config.issue_admin_certificate(bundle, roles=("root",))
    with pytest.raises(TalosconfigError, match="endpoints: expected at least one address"):
        talosconfig(bundle, "c", [])
    with pytest.raises(TalosconfigError, match="endpoints: 'a b' is not a host"):
        talosconfig(bundle, "c", ["a b"])
    with pytest.raises(TalosconfigError, match="context: expected a non-empty name"):
        talosconfig(bundle, "", ENDPOINTS)
    foreign_cert, foreign_key = client_config.issue_admin_certificate(secrets_bundle.generate_secrets("v1.13.7"))
    with pytest.raises(TalosconfigError, match="not signed by the bundle's OS CA") as err:
        client_config.talosconfig_with_certificate(bundle, "c", ENDPOINTS, [], foreign_cert, foreign_key)
    for secret in secrets_bundle.secret_strings(bundle):
        assert secret not in str(err.value)


def test_talosconfig_authenticates_to_a_configured_node_over_mutual_tls(bundle):
    """The talosconfig works end to end: the project's Talos API client, real mTLS, stand-in apid."""
    from talos_proxmox.talos_api.client import TalosClient
    from talos_proxmox.talos_api.errors import TalosApiError
    from tests.stand_ins.talos_api import FakeTalosNode

    node = FakeTalosNode(bundle, mode="configured")
    try:
        good = talosconfig(bundle, "test-cluster", [node.endpoint], [])
        with TalosClient.from_talosconfig(good, timeout=10) as client:
            assert client.version().messages[0].version.tag
        # Same server CA, but a client certificate from another cluster's OS CA: the node refuses it.
        foreign_cert, foreign_key = client_config.issue_admin_certificate(secrets_bundle.generate_secrets("v1.13.7"))
        config = talos_yaml.load_documents(good)[0]
        config["contexts"]["test-cluster"].update(crt=pki.b64_pem(foreign_cert), key=pki.b64_pem(foreign_key))
        with TalosClient.from_talosconfig(config, timeout=5) as client:
            with pytest.raises(TalosApiError) as err:
                client.version()
        assert "refused our client certificate" in str(err.value)
    finally:
        node.stop()
