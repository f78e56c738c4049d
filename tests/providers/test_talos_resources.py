"""Dynamic providers MachineSecrets, MachineConfiguration and Talosconfig, called directly, and their
registration under Pulumi mocks (secret inputs and additional_secret_outputs)."""

import datetime

import pytest
from pulumi.runtime import rpc

from talos_proxmox.talos_config import machine_config, pki, client_config, secrets_bundle
from providers.machine_configuration import MachineConfiguration, MachineConfigurationProvider
from providers.secrets import MachineSecrets, MachineSecretsProvider
from providers.talosconfig import Talosconfig, TalosconfigProvider
from tests.support import seed_cluster as seed
from tests.program.mocked_program import run_program
from tests.paths import REPO

UNKNOWN = rpc.UNKNOWN


@pytest.fixture(scope="module")
def bundle():
    return seed.shared_bundle()


def _secret_values(bundle):
    return [s for s in secrets_bundle.secret_strings(bundle) if len(s) >= 8]


def _assert_no_secrets(bundle, *objects):
    text = " ".join(repr(vars(o)) if hasattr(o, "__dict__") else repr(o) for o in objects)
    for secret in _secret_values(bundle):
        assert secret not in text


# --- MachineSecrets ----------------------------------------------------------------------------


def test_machine_secrets_generates_once_and_never_replaces():
    provider = MachineSecretsProvider()
    inputs = {"talos_version": "v1.13.7", "adopt_yaml": None}
    assert provider.check({}, inputs).failures == []
    created = provider.create(inputs)
    bundle = created.outs["bundle"]
    secrets_bundle.validate_secrets(bundle)
    assert created.outs["adopted"] is False
    assert secrets_bundle.load_secrets(created.outs["secrets_yaml"]) == bundle

    same = provider.diff(created.id, created.outs, inputs)
    assert same.changes is False and same.replaces == []
    upgraded = {"talos_version": "v1.13.8", "adopt_yaml": None}
    diff = provider.diff(created.id, created.outs, upgraded)
    assert diff.changes is False and diff.replaces == []  # a Talos upgrade is no change to the secrets
    updated = provider.update(created.id, created.outs, upgraded)
    assert updated.outs["bundle"] == bundle  # not regenerated
    assert updated.outs["talos_version"] == "v1.13.8"
    assert provider.read(created.id, created.outs).outs["bundle"] == bundle
    _assert_no_secrets(bundle, same, diff)


def test_machine_secrets_adopts_a_bundle_and_refuses_a_different_one(bundle, tmp_path):
    provider = MachineSecretsProvider()
    text = secrets_bundle.dump_secrets(bundle)
    inputs = {"talos_version": "v1.13.7", "adopt_yaml": text}
    assert provider.check({}, inputs).failures == []
    created = provider.create(inputs)
    assert created.outs["bundle"] == bundle and created.outs["adopted"] is True

    other = secrets_bundle.dump_secrets(secrets_bundle.generate_secrets("v1.13.7"))
    refused = provider.check(inputs, {"talos_version": "v1.13.7", "adopt_yaml": other})
    assert [f.property for f in refused.failures] == ["adopt_yaml"]
    assert "never replaces a cluster's secrets in place" in refused.failures[0].reason
    # Adopting into a resource that generated its own bundle is refused too.
    generated_inputs = {"talos_version": "v1.13.7", "adopt_yaml": None}
    late = provider.check(generated_inputs, inputs)
    assert [f.property for f in late.failures] == ["adopt_yaml"]
    # Dropping the adoption input keeps the bundle.
    assert provider.check(inputs, generated_inputs).failures == []
    kept = provider.update(created.id, created.outs, generated_inputs)
    assert kept.outs["bundle"] == bundle
    _assert_no_secrets(bundle, refused.failures[0], late.failures[0])


def test_machine_secrets_check_reports_a_broken_bundle_without_values(bundle):
    broken = secrets_bundle.dump_secrets(bundle).replace(bundle["trustdinfo"]["token"], "nope")
    result = MachineSecretsProvider().check({}, {"talos_version": "v1.13.7", "adopt_yaml": broken})
    assert [f.property for f in result.failures] == ["adopt_yaml"]
    assert "trustdinfo.token: expected a token" in result.failures[0].reason
    _assert_no_secrets(bundle, result.failures[0])
    bad_version = MachineSecretsProvider().check({}, {"talos_version": "latest", "adopt_yaml": None})
    assert [f.property for f in bad_version.failures] == ["talos_version"]
    unknown = MachineSecretsProvider().check({}, {"talos_version": UNKNOWN, "adopt_yaml": None})
    assert unknown.failures == []


# --- MachineConfiguration ----------------------------------------------------------------------


def _config_inputs(bundle, node, role_patches=None):
    return {
        "secrets": bundle, "cluster_name": seed.CLUSTER_NAME, "endpoint": seed.ENDPOINT, "role": node["role"],
        "talos_version": seed.TALOS_VERSION, "kubernetes_version": seed.KUBERNETES_VERSION,
        "patches": seed.node_patches(node, role_patches=role_patches),
    }


def test_machine_configuration_create_diff_update(bundle):
    provider = MachineConfigurationProvider()
    node = seed.nodes()[0]
    inputs = _config_inputs(bundle, node)
    assert provider.check({}, inputs).failures == []
    created = provider.create(inputs)
    expected = machine_config.render(bundle, seed.CLUSTER_NAME, seed.ENDPOINT, "controlplane", seed.TALOS_VERSION,
                                     seed.KUBERNETES_VERSION, inputs["patches"])
    assert created.outs["machine_configuration"] == expected
    assert len(created.outs["config_sha256"]) == 64
    assert "secrets" not in created.outs  # the bundle is not copied into every node's state

    assert provider.diff(created.id, created.outs, inputs).changes is False
    newer_k8s = {**inputs, "kubernetes_version": "1.34.2"}
    diff = provider.diff(created.id, created.outs, newer_k8s)
    assert diff.changes is True and diff.replaces == []
    updated = provider.update(created.id, created.outs, newer_k8s)
    assert "ghcr.io/siderolabs/kubelet:v1.34.2" in updated.outs["machine_configuration"]
    assert updated.outs["config_sha256"] != created.outs["config_sha256"]
    _assert_no_secrets(bundle, diff)


def test_only_nodes_whose_patches_changed_show_a_diff(bundle):
    provider = MachineConfigurationProvider()
    states = {n["name"]: provider.create(_config_inputs(bundle, n)).outs for n in seed.nodes()}
    changed_roles = {
        "controlplane": seed.PATCH_CONTROLPLANE,
        "worker-disk": seed.PATCH_WORKER_WITH_DISK.replace("iscsi_tcp", "nvme_tcp"),
        "worker": seed.PATCH_WORKER_WITHOUT_DISK,
    }
    diffs = {n["name"]: provider.diff("id", states[n["name"]], _config_inputs(bundle, n, changed_roles))
             for n in seed.nodes()}
    assert sorted(name for name, d in diffs.items() if d.changes) == ["worker-1", "worker-2", "worker-3"]
    assert all(d.replaces == [] for d in diffs.values())
    _assert_no_secrets(bundle, *diffs.values())


def test_patch_written_differently_but_equal_shows_no_diff(bundle):
    provider = MachineConfigurationProvider()
    node = seed.nodes()[4]
    inputs = _config_inputs(bundle, node)
    state = provider.create(inputs).outs
    as_dicts = {**inputs, "patches": [machine_config.parse_config(p)[0] for p in inputs["patches"]]}
    assert provider.diff("id", state, as_dicts).changes is False


def test_machine_configuration_unknowns_and_check_failures(bundle):
    provider = MachineConfigurationProvider()
    node = seed.nodes()[5]
    inputs = _config_inputs(bundle, node)
    state = provider.create(inputs).outs
    assert provider.check({}, {**inputs, "secrets": UNKNOWN}).failures == []
    assert provider.diff("id", state, {**inputs, "patches": [UNKNOWN]}).changes is True

    bad_role = provider.check({}, {**inputs, "role": "master"})
    assert [f.property for f in bad_role.failures] == ["role"]
    leak = {"machine": {"ca": {"key": bundle["certs"]["os"]["key"]}}}
    bad_patch = provider.check({}, {**inputs, "patches": inputs["patches"] + [leak]})
    assert [f.property for f in bad_patch.failures] == ["patches"]
    assert "machine.ca.key must be empty on a worker" in bad_patch.failures[0].reason
    incomplete = {k: v for k, v in bundle.items() if k != "trustdinfo"}
    bad_secrets = provider.check({}, {**inputs, "secrets": incomplete})
    assert [f.property for f in bad_secrets.failures] == ["secrets"]
    _assert_no_secrets(bundle, bad_role.failures[0], bad_patch.failures[0], bad_secrets.failures[0])


# --- Talosconfig -------------------------------------------------------------------------------


def _talosconfig_inputs(bundle, endpoints=("10.255.200.201",), nodes=()):
    return {"secrets": bundle, "context": seed.CLUSTER_NAME, "endpoints": list(endpoints), "nodes": list(nodes),
            "renew_before_days": 30}


def test_talosconfig_keeps_its_certificate_across_diffs_and_endpoint_changes(bundle):
    provider = TalosconfigProvider()
    inputs = _talosconfig_inputs(bundle)
    assert provider.check({}, inputs).failures == []
    created = provider.create(inputs)
    cert = created.outs["client_certificate"]
    pki.verify_issued_by(cert, secrets_bundle.ca_pair(bundle, "os")[0])
    assert provider.diff(created.id, created.outs, inputs).changes is False

    more = _talosconfig_inputs(bundle, endpoints=["10.255.200.201", "10.255.200.202", "10.255.200.203"],
                               nodes=["10.255.200.204"])
    assert provider.diff(created.id, created.outs, more).changes is True
    updated = provider.update(created.id, created.outs, more)
    assert updated.outs["client_certificate"] == cert and updated.outs["client_key"] == created.outs["client_key"]
    assert updated.outs["talosconfig"] != created.outs["talosconfig"]
    assert "            - 10.255.200.203\n" in updated.outs["talosconfig"]
    assert updated.outs["talosconfig"] == client_config.talosconfig_with_certificate(
        bundle, seed.CLUSTER_NAME, more["endpoints"], more["nodes"], cert.encode(), created.outs["client_key"].encode())


def test_talosconfig_reissues_for_a_new_os_ca_or_an_expiring_certificate(bundle):
    provider = TalosconfigProvider()
    created = provider.create(_talosconfig_inputs(bundle))

    other = secrets_bundle.generate_secrets("v1.13.7")
    moved = _talosconfig_inputs(other)
    assert provider.diff("id", created.outs, moved).changes is True
    reissued = provider.update("id", created.outs, moved)
    assert reissued.outs["client_certificate"] != created.outs["client_certificate"]
    pki.verify_issued_by(reissued.outs["client_certificate"], secrets_bundle.ca_pair(other, "os")[0])

    cert, key = client_config.issue_admin_certificate(bundle, validity=datetime.timedelta(days=10))
    expiring = {**created.outs, "client_certificate": cert.decode(), "client_key": key.decode()}
    inputs = _talosconfig_inputs(bundle)
    assert provider.diff("id", expiring, inputs).changes is True
    renewed = provider.update("id", expiring, inputs)
    assert renewed.outs["client_certificate"] != cert.decode()
    expires = datetime.datetime.fromisoformat(renewed.outs["expires"])
    assert expires - datetime.datetime.now(datetime.timezone.utc) > datetime.timedelta(days=360)


def test_talosconfig_check_failures_name_the_input(bundle):
    provider = TalosconfigProvider()
    no_endpoints = provider.check({}, _talosconfig_inputs(bundle, endpoints=[]))
    assert [f.property for f in no_endpoints.failures] == ["endpoints"]
    broken = {**bundle, "certs": {k: v for k, v in bundle["certs"].items() if k != "os"}}
    no_ca = provider.check({}, _talosconfig_inputs(broken))
    assert [f.property for f in no_ca.failures] == ["secrets"]
    assert provider.check({}, {**_talosconfig_inputs(bundle), "secrets": UNKNOWN}).failures == []
    _assert_no_secrets(bundle, no_endpoints.failures[0], no_ca.failures[0])


# --- registration under mocks ------------------------------------------------------------------


def test_resources_register_secret_inputs_and_secret_outputs(bundle, tmp_path):
    path = tmp_path / "secrets.yaml"
    path.write_text(secrets_bundle.dump_secrets(bundle))

    def program():
        secrets = MachineSecrets("secrets", seed.TALOS_VERSION, secrets_file=str(path))
        MachineConfiguration("master-1", secrets=secrets.bundle, cluster_name=seed.CLUSTER_NAME,
                             endpoint=seed.ENDPOINT, role="controlplane", talos_version=seed.TALOS_VERSION,
                             kubernetes_version=seed.KUBERNETES_VERSION, patches=[seed.PATCH_INSTALL])
        Talosconfig("talosconfig", secrets=secrets.bundle, context=seed.CLUSTER_NAME, endpoints=["10.255.200.201"])

    run = run_program({}, program=program)
    by_name = {r.name: r for r in run.registrations}
    assert set(by_name["secrets"].additional_secret_outputs) >= {"bundle", "secrets_yaml", "adopt_yaml"}
    assert rpc.is_rpc_secret(by_name["secrets"].inputs["adopt_yaml"])
    assert set(by_name["master-1"].additional_secret_outputs) >= {"machine_configuration", "secrets"}
    assert rpc.is_rpc_secret(by_name["master-1"].inputs["secrets"])
    assert set(by_name["talosconfig"].additional_secret_outputs) >= {"talosconfig", "client_key"}
    assert rpc.is_rpc_secret(by_name["talosconfig"].inputs["secrets"])


def test_secrets_file_that_is_broken_fails_in_the_program_without_values(bundle, tmp_path):
    path = tmp_path / "secrets.yaml"
    path.write_text(secrets_bundle.dump_secrets(bundle).replace("certs:", "certz:"))
    with pytest.raises(secrets_bundle.SecretsBundleError, match="certs.etcd.crt is required") as err:
        run_program({}, program=lambda: MachineSecrets("secrets", seed.TALOS_VERSION, secrets_file=str(path)))
    _assert_no_secrets(bundle, str(err.value))


def test_serialized_providers_work_in_a_fresh_process(bundle):
    """The engine runs each provider from its pickled form in another Python process (cwd: the project)."""
    import json
    import pathlib
    import subprocess
    import sys

    from pulumi.dynamic.dynamic import serialize_provider

    node = seed.nodes()[0]
    inputs = _config_inputs(bundle, node)
    payload = json.dumps({
        "secrets": serialize_provider(MachineSecretsProvider()),
        "config": serialize_provider(MachineConfigurationProvider()),
        "talosconfig": serialize_provider(TalosconfigProvider()),
        "inputs": inputs,
    })
    script = (
        "import base64, json, sys, dill\n"
        "data = json.loads(sys.stdin.read())\n"
        "load = lambda k: dill.loads(base64.b64decode(data[k]))\n"
        "made = load('secrets').create({'talos_version': 'v1.13.7', 'adopt_yaml': None})\n"
        "config = load('config').create(data['inputs'])\n"
        "tc = load('talosconfig').create({'secrets': made.outs['bundle'], 'context': 'c',\n"
        "                                 'endpoints': ['10.255.200.201'], 'nodes': [], 'renew_before_days': 30})\n"
        "print(json.dumps([sorted(made.outs['bundle']), config.outs['config_sha256'],\n"
        "                  load('config').diff('x', config.outs, data['inputs']).changes,\n"
        "                  tc.outs['talosconfig'].startswith('context: c\\n')]))\n")
    done = subprocess.run([sys.executable, "-c", script], input=payload, capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    expected_sha = MachineConfigurationProvider().create(inputs).outs["config_sha256"]
    assert json.loads(done.stdout) == [["certs", "cluster", "secrets", "trustdinfo"], expected_sha, False, True]


def test_whole_numbers_the_engine_sends_as_doubles_render_as_the_integers_they_were(bundle):
    """Through the engine a patch's `mtu: 1420` arrives as 1420.0; Talos's integer fields refuse that."""
    node = seed.nodes()[0]
    inputs = _config_inputs(bundle, node)
    as_doubles = {**inputs, "patches": [*inputs["patches"], {"apiVersion": "v1alpha1", "kind": "LinkConfig",
                                                              "name": "eth1", "mtu": 1420.0},
                                         {"machine": {"kubelet": {"extraMounts": [{
                                             "destination": "/var/mnt", "type": "bind", "source": "/var/mnt",
                                             "uidMappings": [{"containerID": 0.0, "hostID": 1000.0, "size": 1.0}]}]}}}]}
    provider = MachineConfigurationProvider()
    assert provider.check({}, as_doubles).failures == []
    rendered = provider.create(as_doubles).outs["machine_configuration"]
    assert "\nmtu: 1420\n" in rendered and "hostID: 1000\n" in rendered and "1420.0" not in rendered
