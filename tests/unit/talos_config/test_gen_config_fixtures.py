"""Our gen-config defaults against Talos's own: upstream's stability fixtures as the oracle (talosctl itself
cannot be built here, see scripts/tool-versions.env).

siderolabs/talos pkg/machinery/config/types/v1alpha1/testdata/stability/<contract>/base-<role>.yaml, at the
release tag each directory of tests/data/talos-stability is named after, is what `generate.NewInput("base",
"https://base:6443", "1.28.0")` writes with that contract and the fixtures' secrets.yaml. `talosctl gen
config` passes the same options plus an install image (and disk, which we leave to the stack: see
machine_config's docstring); so before v1.14 our defaults are the fixture plus `machine.install.image`, and
from v1.14, where the install moved to an UnattendedInstallConfig only written with a disk, the fixture itself.
"""

import types

import pytest
import yaml

from talos_proxmox.cluster_plan import node_patches
from talos_proxmox.talos_config import machine_config, talos_yaml
from tests.paths import DATA

FIXTURES = DATA / "talos-stability"
RELEASES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def secrets():
    return yaml.safe_load((FIXTURES / "secrets.yaml").read_text())


def expected_text(release: str, role: str) -> str:
    fixture = (FIXTURES / release / f"base-{role}.yaml").read_text()
    if machine_config.parse_talos_version(release)[0] >= machine_config.MULTIDOC_KUBERNETES:
        return fixture
    documents = talos_yaml.load_documents(fixture)
    install = documents[0]["machine"]["install"]
    documents[0]["machine"]["install"] = {"image": f"{machine_config.INSTALLER_IMAGE}:{release}", **install}
    return talos_yaml.dump_documents(documents)


def ours(secrets, release: str, role: str) -> str:
    documents = machine_config.default_documents(secrets, "base", "https://base:6443", role, release, "1.28.0")
    return talos_yaml.dump_documents([machine_config._normalize_other(d) if "kind" in d else d for d in documents])


def test_the_fixtures_cover_every_supported_contract():
    assert sorted(machine_config.parse_talos_version(r)[0] for r in RELEASES) == \
        sorted(machine_config.SUPPORTED_CONTRACTS)


@pytest.mark.parametrize("role", machine_config.ROLES)
@pytest.mark.parametrize("release", RELEASES)
def test_our_dump_of_a_fixture_is_the_fixture(release, role):
    # The comparison below is of bytes; our YAML encoder must write Talos's documents as Talos does.
    text = (FIXTURES / release / f"base-{role}.yaml").read_text()
    assert talos_yaml.dump_documents(talos_yaml.load_documents(text)) == text


@pytest.mark.parametrize("role", machine_config.ROLES)
@pytest.mark.parametrize("release", RELEASES)
def test_defaults_are_byte_identical_to_gen_config(secrets, release, role):
    assert ours(secrets, release, role) == expected_text(release, role)


@pytest.mark.parametrize("role", machine_config.ROLES)
def test_v1_14_defaults_are_the_multi_document_form(secrets, role):
    documents = talos_yaml.load_documents(ours(secrets, "v1.14.0-rc.1", role))
    v1alpha1 = documents[0]
    assert list(v1alpha1["machine"]) == ["type", "token", "ca", "certSANs", "features"]
    assert list(v1alpha1["cluster"]) == (["token", "etcd"] if role == "controlplane" else ["token"])
    kinds = [d["kind"] for d in documents[1:]]
    assert kinds[:13] == ["DiscoveryServiceConfig", "DiscoveryIdentityConfig", "ResolverConfig", "VolumeConfig",
                          "FilesystemTrimConfig", "SecurityProfileConfig", "HostnameConfig", "KubeClusterConfig",
                          "KubeNodeConfig", "KubeletConfig", "KubeNetworkConfig", "KubeAPIServerCAConfig",
                          "KubePrismConfig"]
    ca = next(d for d in documents[1:] if d["kind"] == "KubeAPIServerCAConfig")
    if role == "worker":
        assert list(ca) == ["apiVersion", "kind", "acceptedCAs"] and len(kinds) == 13
        assert ca["acceptedCAs"][0].startswith("-----BEGIN CERTIFICATE-----\n")
    else:
        assert ca["issuingCA"]["key"].startswith("-----BEGIN EC PRIVATE KEY-----\n")
        assert kinds[13:] == ["KubeAggregatorCAConfig", "KubeAdmissionControlConfig", "KubeAuditPolicyConfig",
                              "KubeAuthenticationConfig", "KubeAuthorizerConfig", "KubeAuthorizerConfig",
                              "KubeEtcdEncryptionConfig", "KubeServiceAccountConfig", "KubeAPIServerConfig",
                              "KubeControllerManagerConfig", "KubeSchedulerConfig", "KubeProxyConfig",
                              "KubeFlannelCNIConfig", "KubeCoreDNSConfig"]


def test_a_bundle_value_that_is_not_base64_pem_is_named_not_echoed(secrets):
    broken = {**secrets, "certs": {**secrets["certs"], "k8s": {**secrets["certs"]["k8s"], "key": "not*base64"}}}
    with pytest.raises(machine_config.SecretsBundleError) as err:
        machine_config.default_documents(broken, "base", "https://base:6443", "controlplane", "v1.14.0", "1.28.0")
    assert str(err.value) == "secrets bundle: certs.k8s.key is not base64-encoded PEM"


def gen_config_with_install_disk(release: str, role: str, disk: str) -> list[dict]:
    """The fixture as `talosctl gen config --install-disk <disk>` writes it (its documents)."""
    documents = talos_yaml.load_documents(expected_text(release, role))
    image = f"{machine_config.INSTALLER_IMAGE}:{release}"
    if machine_config.parse_talos_version(release)[0] < machine_config.MULTIDOC_KUBERNETES:
        documents[0]["machine"]["install"] = {"disk": disk, **documents[0]["machine"]["install"]}
        return documents
    unattended = {"apiVersion": "v1alpha1", "kind": "UnattendedInstallConfig", "installer": {"image": image},
                  "provisioning": {"diskSelector": {"match": f'disk.dev_path == "{disk}"'}, "wipe": False}}
    return documents[:3] + [unattended] + documents[3:]  # init.go: after the discovery documents


@pytest.mark.parametrize("role", machine_config.ROLES)
@pytest.mark.parametrize("release", RELEASES)
def test_a_render_with_our_install_patch_is_gen_config_with_that_disk(secrets, release, role):
    settings = types.SimpleNamespace(cluster=types.SimpleNamespace(install_disk="/dev/vda", talos_version=release))
    patch = node_patches.install_patch(settings, f"{machine_config.INSTALLER_IMAGE}:{release}")
    rendered = machine_config.render_documents(secrets, "base", "https://base:6443", role, release, "1.28.0", [patch])
    expected = gen_config_with_install_disk(release, role, "/dev/vda")
    # A patch appends a new document, gen config writes it third: the same documents, one in another place.
    assert sorted(map(talos_yaml.dump_documents, ([d] for d in rendered))) == \
        sorted(map(talos_yaml.dump_documents, ([d] for d in expected)))
    if machine_config.parse_talos_version(release)[0] < machine_config.MULTIDOC_KUBERNETES:
        assert talos_yaml.dump_documents(rendered) == talos_yaml.dump_documents(expected)
