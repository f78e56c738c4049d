"""ConfigurationApply, Bootstrap and Kubeconfig providers called directly against stand-in nodes,
and the resources registered under Pulumi mocks (secret inputs, secret kubeconfig output)."""

import datetime
import functools
import hashlib
import threading
import time

import grpc
import pytest

from talos_proxmox.talos_config import client_config
from talos_proxmox.talos_api import operations
from providers import talos_operations
from talos_proxmox.talos_api.client import TalosClient, read_talosconfig
from talos_proxmox.talos_api.generated.machine import machine_pb2
from talos_proxmox.talos_api.retry import Backoff, GaveUp
from tests.support.day_two import FAST, FakeClock
from tests.program.mocked_program import run_program, stack_config
from tests.stand_ins.talos_api import FakeTalosNode, configured_node, maintenance_node, shared_bundle  # noqa: F401
from tests.paths import REPO

CONFIG = "version: v1alpha1\nmachine:\n  token: abcdef.0123456789abcdef\n"
NEW_CONFIG = CONFIG + "cluster:\n  clusterName: stand-in\n"
KUBECONFIG = "apiVersion: v1\nkind: Config\nusers:\n- name: admin\n"


def _bundle():
    return shared_bundle()


@functools.lru_cache(maxsize=1)
def _talosconfig() -> str:
    return client_config.talosconfig(_bundle(), "stand-in", ["127.0.0.1"])


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(operations, "DEFAULT_BACKOFF", Backoff(initial=0.1, factor=2, maximum=0.4))


def _apply_props(node: FakeTalosNode, config: str = CONFIG, **extra):
    # the stand-in listens on 127.0.0.1:<port>; the node header carries the address apid would route to
    return {"node": "127.0.0.1", "endpoint": node.endpoint, "machine_configuration": config,
            "talosconfig": _talosconfig(), "mode": "auto", "try_timeout_seconds": None, "timeout_seconds": 20,
            **extra}


# An apply keeps these two as outputs for refresh to read the node with, and registers them as secret
# outputs (encrypted in the state): every other output must hold no secret.
APPLY_SECRET_OUTPUTS = ("machine_configuration", "talosconfig")


def _assert_no_secrets(outs: dict):
    text = repr({key: value for key, value in outs.items() if key not in APPLY_SECRET_OUTPUTS})
    assert "token" not in text and "abcdef" not in text
    assert _talosconfig() not in text and "PRIVATE KEY" not in text


# --- ConfigurationApply ---------------------------------------------------------------------------


def test_create_applies_insecure_and_leaves_the_install_wait_to_nodes_installed(maintenance_node):
    provider = talos_operations.ConfigurationApplyProvider()
    result = provider.create(_apply_props(maintenance_node))
    assert result.outs["applied_via"] == "insecure"
    assert result.outs["config_sha256"] == hashlib.sha256(CONFIG.encode()).hexdigest()
    _assert_no_secrets(result.outs)
    [apply] = maintenance_node.calls  # returned at once: the node installs while others get theirs
    assert (apply.rpc, apply.mode, apply.roles, apply.request.data) == ("ApplyConfiguration", "maintenance", (), CONFIG.encode())
    assert apply.request.mode == 1  # AUTO for a first apply
    assert maintenance_node.mode == "maintenance"  # still installing


# --- NodesInstalled -------------------------------------------------------------------------------


def _installing(names_and_downtimes):
    """Stand-in nodes given their first configuration now, each installing for its downtime."""
    fakes = {}
    for name, downtime in names_and_downtimes:
        fake = FakeTalosNode(_bundle(), mode="maintenance", hostname=name, install_downtime=downtime)
        talos_operations.ConfigurationApplyProvider().create(_apply_props(fake))
        fakes[name] = fake
    return fakes


def _installed_props(fakes, names=None):
    return {"nodes": [{"name": name, "address": fakes[name].endpoint} for name in names or fakes],
            "talosconfig": _talosconfig(), "timeout_seconds": 10}


def test_all_nodes_are_waited_for_side_by_side():
    """Each node comes up only once the one before it in `order` was reported ready, and the first in
    stack order comes up last: a wait for one node after another would never see it."""
    fakes = {name: FakeTalosNode(_bundle(), mode="configured", hostname=name) for name in ("cp-1", "cp-2", "worker-1")}
    order, heard = ["worker-1", "cp-2", "cp-1"], []

    def on_ready(name, tag):
        heard.append((name, tag))
        if len(heard) < len(order):
            fakes[order[len(heard)]].come_up()

    try:
        for fake in fakes.values():
            fake.go_down()  # installing
        threading.Timer(0.2, fakes["worker-1"].come_up).start()
        credentials = read_talosconfig(_talosconfig()).credentials
        tags = operations.wait_until_all_ready(
            {name: fake.endpoint for name, fake in fakes.items()},
            lambda address: TalosClient([address], credentials=credentials, node=address), timeout=5,
            on_ready=on_ready)
        assert heard == [(name, "v1.11.5") for name in order]
        assert tags == {name: "v1.11.5" for name in fakes}
    finally:
        for fake in fakes.values():
            fake.stop()


def test_nodes_installed_prints_a_line_per_node_as_it_comes_up(capfd):
    fakes = _installing([("cp-1", 0.3), ("worker-1", 0.3)])
    try:
        outs = talos_operations.NodesInstalledProvider().create(_installed_props(fakes)).outs
        assert [n["name"] for n in outs["nodes"]] == ["cp-1", "worker-1"]
        assert all(fake.mode == "configured" for fake in fakes.values())
        lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("talos-proxmox: install")]
        assert sorted(line.rsplit(" (", 1)[0] for line in lines) == [
            "talos-proxmox: install cp-1 (1 of 2): configured (v1.11.5)",
            "talos-proxmox: install cp-1 (1 of 2): waiting",
            "talos-proxmox: install worker-1 (2 of 2): configured (v1.11.5)",
            "talos-proxmox: install worker-1 (2 of 2): waiting"]
        for fake in fakes.values():
            [version, *_] = fake.calls_for("Version")
            assert (version.mode, version.roles) == ("configured", ("os:admin",))
        assert "PRIVATE KEY" not in repr(outs) and _talosconfig() not in repr(outs)
    finally:
        for fake in fakes.values():
            fake.stop()


def test_nodes_installed_names_each_node_that_never_came_up_after_the_others():
    fakes = _installing([("cp-1", 0.2), ("worker-1", 60)])
    try:
        props = {**_installed_props(fakes), "timeout_seconds": 1.5}
        with pytest.raises(operations.NodesNotReady) as failed:
            talos_operations.NodesInstalledProvider().create(props)
        assert failed.value.ready == ("cp-1",) and list(failed.value.failed) == ["worker-1"]
        assert str(failed.value).startswith("1 of 2 nodes did not come up configured: node worker-1: ")
        assert fakes["cp-1"].mode == "configured"
    finally:
        for fake in fakes.values():
            fake.stop()


def test_nodes_installed_waits_for_added_nodes_only_and_for_none_on_removal():
    fakes = _installing([("cp-1", 0.1)])
    try:
        provider = talos_operations.NodesInstalledProvider()
        olds = provider.create(_installed_props(fakes)).outs
        fakes.update(_installing([("worker-2", 0.3)]))
        before = len(fakes["cp-1"].calls)
        news = _installed_props(fakes)
        assert provider.diff("nodes-installed", olds, news).changes is True
        outs = provider.update("nodes-installed", olds, news).outs
        assert len(fakes["cp-1"].calls) == before  # not asked again
        assert fakes["worker-2"].mode == "configured" and fakes["worker-2"].calls_for("Version")
        fewer = _installed_props(fakes, ["cp-1"])
        provider.update("nodes-installed", outs, fewer)
        assert len(fakes["cp-1"].calls) == before
        assert provider.diff("nodes-installed", provider.update("nodes-installed", outs, fewer).outs,
                             fewer).changes is False
    finally:
        for fake in fakes.values():
            fake.stop()


def test_create_on_an_already_configured_node_falls_back_to_mtls(configured_node):
    result = talos_operations.ConfigurationApplyProvider().create(_apply_props(configured_node))
    assert result.outs["applied_via"] == "mtls"
    assert result.outs["applied_mode"] == "NO_REBOOT"
    applies = configured_node.calls_for("ApplyConfiguration")
    assert [(c.roles, c.metadata.get("node")) for c in applies] == [(("os:admin",), ["127.0.0.1"])]
    assert configured_node.config == CONFIG.encode()


def test_diff_compares_hashes_and_never_the_config(configured_node):
    provider = talos_operations.ConfigurationApplyProvider()
    olds = provider.create(_apply_props(configured_node)).outs
    same = provider.diff("id", olds, _apply_props(configured_node))
    assert not same.changes
    changed = provider.diff("id", olds, _apply_props(configured_node, NEW_CONFIG))
    assert changed.changes and changed.replaces == []
    moved = provider.diff("id", olds, {**_apply_props(configured_node), "node": "10.5.0.9"})
    assert moved.replaces == ["node"]


def test_update_reapplies_over_mtls_only_when_the_config_changed(configured_node):
    provider = talos_operations.ConfigurationApplyProvider()
    olds = provider.create(_apply_props(configured_node)).outs
    calls_before = len(configured_node.calls)
    unchanged = provider.update("id", olds, _apply_props(configured_node, mode="staged"))
    assert len(configured_node.calls) == calls_before  # nothing sent
    assert unchanged.outs["mode"] == "staged" and unchanged.outs["config_sha256"] == olds["config_sha256"]

    updated = provider.update("id", olds, _apply_props(configured_node, NEW_CONFIG, mode="try", try_timeout_seconds=120))
    last = configured_node.calls_for("ApplyConfiguration")[-1]
    assert (last.roles, last.request.mode, last.request.try_mode_timeout.seconds) == (("os:admin",), 4, 120)
    assert updated.outs["config_sha256"] == hashlib.sha256(NEW_CONFIG.encode()).hexdigest()
    assert updated.outs["applied_via"] == "mtls"
    _assert_no_secrets(updated.outs)


def test_reboot_mode_stages_then_reboots_and_waits(configured_node):
    provider = talos_operations.ConfigurationApplyProvider()
    olds = provider.create(_apply_props(configured_node)).outs
    provider.update("id", olds, _apply_props(configured_node, NEW_CONFIG, mode="reboot"))
    rpcs = [c.rpc for c in configured_node.calls]
    staged = configured_node.calls_for("ApplyConfiguration")[-1]
    assert staged.request.mode == 3  # STAGED: configured Talos refuses the old REBOOT mode
    assert rpcs[rpcs.index("Reboot") - 1] == "ApplyConfiguration" and rpcs[-1] == "Version"
    assert configured_node.config == NEW_CONFIG.encode()  # the staged config took effect at the reboot


def test_an_auto_apply_that_resolves_to_a_reboot_returns_only_when_the_node_is_back(configured_node):
    """Talos answers REBOOT and goes down a moment later: the apply must not return in between, or the
    roll would move on while this node is still going down."""
    provider = talos_operations.ConfigurationApplyProvider()
    olds = provider.create(_apply_props(configured_node)).outs
    configured_node.auto_needs_reboot = True
    configured_node.install_downtime = 0.5
    outs = provider.update("id", olds, _apply_props(configured_node, NEW_CONFIG)).outs
    assert outs["applied_mode"] == "REBOOT"
    assert configured_node.reboots == 1 and configured_node.is_up
    apply = configured_node.calls_for("ApplyConfiguration")[-1]
    assert apply.request.mode == 1  # AUTO was asked; the node chose the reboot
    after = [c for c in configured_node.calls if c.at > apply.at]
    back = [c for c in after if c.rpc == "Version" and c.at > apply.at + 0.5]  # answered after the downtime
    assert back and any(c.rpc == "ServiceList" and c.at >= back[0].at for c in after)  # then health-gated


def test_a_node_that_says_reboot_but_never_goes_down_is_reported():
    client = _AlwaysUp()
    clock = iter(range(0, 1000, 10))
    with pytest.raises(TimeoutError, match="node 10.5.0.7 said the configuration needs a reboot but kept answering"):
        operations.wait_until_down(client, "10.5.0.7", timeout=30, sleep=lambda _s: None, clock=lambda: next(clock))


class _AlwaysUp:
    def version(self, timeout):
        return None


def test_create_gives_up_after_the_timeout_naming_the_node(configured_node):
    configured_node.go_down()
    with pytest.raises(GaveUp) as caught:
        talos_operations.ConfigurationApplyProvider().create(_apply_props(configured_node, timeout_seconds=1))
    assert configured_node.endpoint in str(caught.value) and "unreachable" in str(caught.value)
    assert "token" not in str(caught.value)


def test_check_reports_bad_mode_and_timeout():
    result = talos_operations.ConfigurationApplyProvider().check({}, {"node": "10.5.0.2", "mode": "fast", "timeout_seconds": 0})
    assert sorted(f.property for f in result.failures) == ["mode", "timeout_seconds"]


def _apply_update(node: FakeTalosNode, config: str = NEW_CONFIG) -> dict:
    olds = {**_apply_props(node), "config_sha256": operations.config_sha256(CONFIG), "applied_mode": "NO_REBOOT"}
    return talos_operations.ConfigurationApplyProvider().update("id", olds, _apply_props(node, config, role="worker")).outs


def _down_intervals(node: FakeTalosNode) -> list[tuple[float, float]]:
    downs = [at for at, what in node.power if what == "down"]
    ups = [at for at, what in node.power if what == "up"]
    return [(down, next(up for up in ups if up > down)) for down in downs]


def test_applies_that_need_a_reboot_take_the_clusters_lock_one_node_at_a_time(capfd):
    """Two nodes whose new config Talos takes only by rebooting, updated at once (as the engine runs two
    apply resources at once): the second reboots only once the first is back and healthy."""
    nodes = [FakeTalosNode(shared_bundle(), mode="configured", install_downtime=0.5) for _ in range(2)]
    try:
        for node in nodes:
            node.config, node.auto_needs_reboot = CONFIG.encode(), True
        outs: list[dict] = []
        threads = [threading.Thread(target=lambda n=node: outs.append(_apply_update(n))) for node in nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(outs) == 2 and {o["applied_mode"] for o in outs} == {"REBOOT"}
        assert all(node.reboots == 1 and node.config == NEW_CONFIG.encode() for node in nodes)
        (first_down, first_up), = _down_intervals(nodes[0])
        (second_down, second_up), = _down_intervals(nodes[1])
        assert second_down >= first_up or first_down >= second_up, "both nodes were down at once"
        for node in nodes:  # Talos's dry run first, then the apply
            assert [c.request.dry_run for c in node.calls_for("ApplyConfiguration")] == [True, False]
        assert capfd.readouterr().err.count(": rebooted into its configuration and healthy") == 2
    finally:
        for node in nodes:
            node.stop()


def test_an_apply_that_needs_no_reboot_does_not_wait_for_the_clusters_lock(configured_node):
    from talos_proxmox.day_two import cluster_lock

    configured_node.config = CONFIG.encode()
    with cluster_lock.hold(cluster_lock.key_for(_talosconfig()), "a roll elsewhere"):
        done = []
        worker = threading.Thread(target=lambda: done.append(_apply_update(configured_node)))
        worker.start()
        worker.join(20)
    assert done and done[0]["applied_mode"] == "NO_REBOOT" and configured_node.reboots == 0


# --- Bootstrap ------------------------------------------------------------------------------------


def _props(node: FakeTalosNode, **extra):
    return {"node": "127.0.0.1", "endpoint": node.endpoint, "talosconfig": _talosconfig(), "timeout_seconds": 10,
            **extra}


def test_bootstrap_twice_is_success_both_times(configured_node):
    first = talos_operations.BootstrapProvider().create(_props(configured_node))
    second = talos_operations.BootstrapProvider().create(_props(configured_node))
    assert (first.outs["already_bootstrapped"], second.outs["already_bootstrapped"]) == (False, True)
    calls = configured_node.calls_for("Bootstrap")
    assert len(calls) == 2 and all(call.metadata.get("node") == ["127.0.0.1"] for call in calls)  # that node, by name
    _assert_no_secrets(first.outs)


def test_a_recovery_snapshot_that_changed_since_the_load_is_refused_before_any_node_call(configured_node, tmp_path):
    snapshot = tmp_path / "etcd.snapshot"
    snapshot.write_bytes((REPO / "tests" / "data" / "etcd" / "dr-cp-1.snapshot").read_bytes())
    loaded = hashlib.sha256(snapshot.read_bytes()).hexdigest()
    snapshot.write_bytes((REPO / "tests" / "data" / "etcd" / "other-cluster.snapshot").read_bytes())
    with pytest.raises(ValueError) as err:
        talos_operations.BootstrapProvider().create(
            _props(configured_node, recover_from=str(snapshot), recover_from_sha256=loaded))
    assert str(err.value) == (f"cluster.recoverFrom: {str(snapshot)!r} changed since the stack was loaded (its sha256 "
                              "differs): nothing was uploaded; run `pulumi up` again to check and recover from it as "
                              "it is now")
    assert configured_node.calls == []


def test_bootstrap_waits_while_not_available_yet(configured_node):
    configured_node.fail_next("Bootstrap", grpc.StatusCode.FAILED_PRECONDITION, "bootstrap is not available yet", times=2)
    result = talos_operations.BootstrapProvider().create(_props(configured_node))
    assert result.outs["already_bootstrapped"] is False
    assert len(configured_node.calls_for("Bootstrap")) == 3


def test_another_first_control_plane_is_recorded_never_bootstrapped(configured_node):
    provider = talos_operations.BootstrapProvider()
    outs = provider.create(_props(configured_node)).outs
    moved = {**_props(configured_node), "node": "127.0.0.9"}
    diff = provider.diff("id", outs, moved)
    assert (diff.changes, diff.replaces) == (True, [])
    assert provider.update("id", outs, moved).outs["node"] == "127.0.0.9"
    assert len(configured_node.calls_for("Bootstrap")) == 1  # the create's only
    assert provider.diff("id", {**outs, "node": "127.0.0.9"}, moved).changes is False


def test_bootstrap_on_a_worker_fails_at_once(configured_node):
    configured_node.fail_next("Bootstrap", grpc.StatusCode.UNIMPLEMENTED, "bootstrap is only available on control plane nodes")
    with pytest.raises(Exception, match="only available on control plane nodes"):
        talos_operations.BootstrapProvider().create(_props(configured_node))
    assert len(configured_node.calls_for("Bootstrap")) == 1


# --- Kubeconfig -----------------------------------------------------------------------------------


def test_kubeconfig_is_fetched_once_and_refetched_when_its_source_changes(configured_node):
    configured_node.kubeconfig_yaml = KUBECONFIG
    configured_node.kubeconfig_chunk = 32
    provider = talos_operations.KubeconfigProvider()
    outs = provider.create(_props(configured_node)).outs
    assert outs["kubeconfig"] == KUBECONFIG
    assert _talosconfig() not in repr(outs)
    assert not provider.diff("id", outs, _props(configured_node)).changes
    provider.update("id", outs, _props(configured_node, timeout_seconds=30))
    assert len(configured_node.calls_for("Kubeconfig")) == 1
    other = client_config.talosconfig(_bundle(), "stand-in", ["127.0.0.1"])  # new client certificate
    assert provider.diff("id", outs, {**_props(configured_node), "talosconfig": other}).changes
    provider.update("id", outs, {**_props(configured_node), "talosconfig": other})
    assert len(configured_node.calls_for("Kubeconfig")) == 2


def _kubeconfig_valid_for(days: int) -> str:
    """An admin kubeconfig as Talos hands it out, its client certificate valid for `days` from now."""
    from talos_proxmox.talos_config import pki, secrets_bundle
    from tests.stand_ins.kubernetes_cluster import kubeconfig_yaml

    ca_cert, ca_key = secrets_bundle.ca_pair(_bundle(), "k8s")
    cert, key = pki.issue_certificate(ca_cert, ca_key, common_name="admin", organizations=("system:masters",),
                                      client=True, validity=datetime.timedelta(days=days))
    return kubeconfig_yaml("https://127.0.0.1:6443", ca_cert, cert, key, "admin")


def test_a_kubeconfig_near_its_expiry_is_warned_about_on_refresh_and_fetched_again_by_the_next_up(
        configured_node, capfd):
    provider = talos_operations.KubeconfigProvider()
    configured_node.kubeconfig_yaml = _kubeconfig_valid_for(400)
    lasting = provider.create(_props(configured_node)).outs
    left = datetime.datetime.fromisoformat(lasting["expires"]) - datetime.datetime.now(datetime.timezone.utc)
    assert datetime.timedelta(days=399) < left <= datetime.timedelta(days=400)
    assert provider.read("id", lasting).outs == lasting
    assert not provider.diff("id", lasting, _props(configured_node)).changes
    assert "kubeconfig" not in capfd.readouterr().err

    configured_node.kubeconfig_yaml = _kubeconfig_valid_for(10)
    expiring = provider.create(_props(configured_node)).outs
    provider.read("id", expiring)
    warned = capfd.readouterr().err
    assert "talos-proxmox: refresh: the kubeconfig's client certificate expires " in warned
    assert "(9 days left): the next `pulumi up` fetches a new one" in warned
    assert provider.diff("id", expiring, _props(configured_node)).changes is True
    configured_node.kubeconfig_yaml = _kubeconfig_valid_for(365)
    renewed = provider.update("id", expiring, _props(configured_node)).outs
    assert renewed["kubeconfig"] == configured_node.kubeconfig_yaml
    assert len(configured_node.calls_for("Kubeconfig")) == 3
    older_state = {k: v for k, v in expiring.items() if k != "expires"}  # made before `expires` was kept
    assert provider.diff("id", older_state, _props(configured_node)).changes is True


def test_a_kubeconfig_without_a_client_certificate_has_no_expiry_and_is_kept(configured_node):
    configured_node.kubeconfig_yaml = KUBECONFIG
    provider = talos_operations.KubeconfigProvider()
    outs = provider.create(_props(configured_node)).outs
    assert outs["expires"] is None
    assert not provider.diff("id", outs, _props(configured_node)).changes


# --- registered under Pulumi mocks ----------------------------------------------------------------


def test_registered_resources_keep_configs_secret_and_kubeconfig_secret():
    def program():
        apply = talos_operations.ConfigurationApply("apply-cp1", node="10.5.0.2", machine_configuration=CONFIG,
                                             talosconfig="talosconfig-text")
        bootstrap = talos_operations.Bootstrap("bootstrap", node="10.5.0.2", talosconfig="talosconfig-text")
        talos_operations.Kubeconfig("kubeconfig", node="10.5.0.2", talosconfig="talosconfig-text")
        assert apply and bootstrap

    run = run_program(stack_config("test-cluster"), program=program)
    by_name = {r.name: r for r in run.registrations}
    assert by_name["kubeconfig"].additional_secret_outputs == ["kubeconfig"]
    for name, secret_inputs in (("apply-cp1", ("machine_configuration", "talosconfig")),
                                ("bootstrap", ("talosconfig",)), ("kubeconfig", ("talosconfig",))):
        registered = by_name[name].inputs
        for key in secret_inputs:
            assert _is_secret_value(registered[key]), f"{name}.{key} is not registered as a secret"
        assert registered["node"] == "10.5.0.2"


def _is_secret_value(value) -> bool:
    from pulumi.runtime import rpc

    return isinstance(value, dict) and value.get(rpc._special_sig_key) == rpc._special_secret_sig


def test_resource_rejects_an_unknown_mode_in_the_program():
    with pytest.raises(ValueError, match="mode 'fast'"):
        talos_operations.ConfigurationApply("x", node="10.5.0.2", machine_configuration="", talosconfig="", mode="fast")


# --- the operations' retries and outcomes, pinned ---------------------------------------------------


def _apply(node, **kwargs):
    return operations.apply_machine_configuration(
        "127.0.0.1", kwargs.pop("config", CONFIG), _talosconfig(), endpoint=node.endpoint,
        **{"insecure_first": False, "timeout": 10, **kwargs})


def test_an_apply_already_in_progress_is_retried(configured_node):
    configured_node.fail_next("ApplyConfiguration", grpc.StatusCode.FAILED_PRECONDITION,
                              "config apply is already in progress")
    outcome = _apply(configured_node)
    assert len(configured_node.calls_for("ApplyConfiguration")) == 2
    assert (outcome.via, outcome.mode, outcome.rebooted) == ("mtls", "NO_REBOOT", False)


def test_any_other_failed_precondition_of_an_apply_fails_at_once(configured_node):
    configured_node.fail_next("ApplyConfiguration", grpc.StatusCode.FAILED_PRECONDITION, "bad machine type")
    with pytest.raises(operations.errors.TalosApiError, match="bad machine type"):
        _apply(configured_node)
    assert len(configured_node.calls_for("ApplyConfiguration")) == 1


def test_an_apply_says_whether_the_node_rebooted(maintenance_node, configured_node):
    first = operations.apply_machine_configuration("127.0.0.1", CONFIG, _talosconfig(),
                                                   endpoint=maintenance_node.endpoint, timeout=10)
    assert (first.via, first.rebooted) == ("insecure", True)  # it installs and reboots
    assert _apply(configured_node, mode="no-reboot").rebooted is False
    assert _apply(configured_node, config=NEW_CONFIG, mode="reboot").rebooted is True
    configured_node.auto_needs_reboot = True
    resolved = _apply(configured_node, config=CONFIG + "# changed\n")
    assert (resolved.mode, resolved.rebooted) == ("REBOOT", True)


def test_bootstrap_and_kubeconfig_wait_through_a_reboot(configured_node):
    configured_node.kubeconfig_yaml = KUBECONFIG
    configured_node.go_down()
    configured_node.reboot(0.3, after=0.0)  # comes back in 0.3 s
    assert operations.bootstrap_etcd("127.0.0.1", _talosconfig(), endpoint=configured_node.endpoint, timeout=10)
    configured_node.fail_next("Kubeconfig", grpc.StatusCode.UNAVAILABLE, "apid restarting")
    assert operations.fetch_kubeconfig("127.0.0.1", _talosconfig(), endpoint=configured_node.endpoint,
                                       timeout=10) == KUBECONFIG
    assert len(configured_node.calls_for("Kubeconfig")) == 2


@pytest.mark.parametrize("trailer, skip_hash_check", [(True, False), (False, True)], ids=["snapshot", "db-copy"])
def test_a_recovery_uploads_the_snapshot_then_bootstraps_from_it_once(configured_node, trailer, skip_hash_check):
    snapshot = (REPO / "tests" / "data" / "etcd" / "dr-cp-1.snapshot").read_bytes()
    snapshot = snapshot if trailer else snapshot[:-32]  # a data-directory copy has no sha256 at its end
    assert operations.bootstrap_etcd("127.0.0.1", _talosconfig(), endpoint=configured_node.endpoint, timeout=10,
                                     recover_from=snapshot)
    calls = [c for c in configured_node.calls if c.rpc in ("EtcdRecover", "Bootstrap")]
    assert [c.rpc for c in calls] == ["EtcdRecover", "Bootstrap"]
    assert calls[0].request.bytes == snapshot
    assert (calls[1].request.recover_etcd, calls[1].request.recover_skip_hash_check) == (True, skip_hash_check)
    assert configured_node.etcd_restored_from == snapshot
    # Once etcd holds data, Talos refuses a second bootstrap: recorded as "already", nothing restored again.
    assert not operations.bootstrap_etcd("127.0.0.1", _talosconfig(), endpoint=configured_node.endpoint,
                                         timeout=10, recover_from=snapshot)


def test_a_hung_kubeconfig_call_is_bounded_by_the_timeout_and_named(configured_node):
    configured_node.delays["Kubeconfig"] = 10.0
    started = time.monotonic()
    with pytest.raises(GaveUp) as gave_up:
        operations.fetch_kubeconfig("127.0.0.1", _talosconfig(), endpoint=configured_node.endpoint, timeout=1.0)
    assert str(gave_up.value).startswith("kubeconfig from 127.0.0.1: gave up after 1s")
    assert time.monotonic() - started < 5


def test_kubeconfig_asks_the_node_by_name_and_waits_for_a_node_not_ready_yet(configured_node):
    configured_node.kubeconfig_yaml = KUBECONFIG
    configured_node.fail_next("Kubeconfig", grpc.StatusCode.FAILED_PRECONDITION, "time is not in sync yet")
    configured_node.fail_next("Kubeconfig", grpc.StatusCode.UNIMPLEMENTED, "machine type is not set", times=1)
    assert operations.fetch_kubeconfig("127.0.0.1", _talosconfig(), endpoint=configured_node.endpoint,
                                       timeout=10) == KUBECONFIG
    calls = configured_node.calls_for("Kubeconfig")
    assert len(calls) >= 2 and all(c.metadata.get("node") == ["127.0.0.1"] for c in calls)


def test_any_other_unimplemented_answer_is_not_waited_on(configured_node):
    configured_node.fail_next("Kubeconfig", grpc.StatusCode.UNIMPLEMENTED, "no such method", times=5)
    with pytest.raises(operations.errors.TalosApiError, match="no such method"):
        operations.fetch_kubeconfig("127.0.0.1", _talosconfig(), endpoint=configured_node.endpoint, timeout=10)
    assert len(configured_node.calls_for("Kubeconfig")) == 1
    assert operations._not_ready_yet(ValueError("not an API error")) is False


def test_kubeconfig_waits_go_through_the_given_clock_and_sleep(configured_node):
    configured_node.go_down()
    clock = FakeClock()
    with pytest.raises(GaveUp):
        operations.fetch_kubeconfig("127.0.0.1", _talosconfig(), endpoint=configured_node.endpoint, timeout=1.0,
                                    backoff=FAST, sleep=clock.sleep, clock=clock)
    assert clock.slept_as(FAST, within=1.0)


def test_the_credentials_hash_keeps_the_form_earlier_states_stored():
    """Kubeconfig states store this hash; a new form would refetch every cluster's kubeconfig once."""
    credentials = operations.read_talosconfig(_talosconfig()).credentials
    expected = hashlib.sha256(credentials.ca_pem + b"\0" + credentials.cert_pem + b"\0" + credentials.key_pem)
    assert operations.credentials_sha256(_talosconfig()) == expected.hexdigest()


# --- each wait uses the backoff, clock and sleep it is given, and names itself --------------------

SLOW_TO_TELL = Backoff(initial=1.0, factor=3.0, maximum=7.0)  # unlike any default, so its use shows


def _mtls(node: FakeTalosNode) -> TalosClient:
    return TalosClient([node.endpoint], credentials=read_talosconfig(_talosconfig()).credentials, node="127.0.0.1")


def _apply_timed(node: FakeTalosNode, clock: FakeClock, **kwargs):
    return operations.apply_machine_configuration(
        "127.0.0.1", CONFIG, _talosconfig(), endpoint=node.endpoint, **{
            "mode": "no-reboot", "insecure_first": False, "timeout": 30, "backoff": SLOW_TO_TELL,
            "sleep": clock.sleep, "clock": clock, **kwargs})


@pytest.mark.parametrize("case", ["apply", "apply then wait", "reboot", "reboot never starts", "bootstrap",
                                  "wait until ready", "went down", "wait until down"])
def test_each_wait_goes_through_the_given_backoff_clock_and_sleep_and_names_itself(configured_node, case):
    node, clock = configured_node, FakeClock()
    if case == "apply":
        node.go_down()
        with pytest.raises(GaveUp, match=r"^apply configuration to 127\.0\.0\.1: gave up after 30s"):
            _apply_timed(node, clock)
    elif case == "apply then wait":
        node.fail_next("Version", grpc.StatusCode.UNAVAILABLE, "rebooting", times=1000)  # applied, then away
        with pytest.raises(GaveUp, match=r"^wait for 127\.0\.0\.1 after apply: gave up after 30s"):
            _apply_timed(node, clock)
    elif case == "reboot":
        node.fail_next("Reboot", grpc.StatusCode.UNAVAILABLE, "connection reset", times=1000)
        with pytest.raises(GaveUp, match=r"^reboot 127\.0\.0\.1: gave up after "):
            _apply_timed(node, clock, mode="reboot")
    elif case == "reboot never starts":
        node.auto_needs_reboot = True
        node.behaviours["ApplyConfiguration"] = lambda n, r, c: machine_pb2.ApplyConfigurationResponse(
            messages=[machine_pb2.ApplyConfiguration(mode=machine_pb2.ApplyConfigurationRequest.REBOOT)])
        with pytest.raises(TimeoutError, match=r"^node 127\.0\.0\.1 said the configuration needs a reboot but kept "
                                               r"answering for 30s without going down$"):
            _apply_timed(node, clock, mode="auto")
    elif case == "bootstrap":
        node.go_down()
        with pytest.raises(GaveUp, match=r"^bootstrap etcd on 127\.0\.0\.1: gave up after 30s"):
            operations.bootstrap_etcd("127.0.0.1", _talosconfig(), endpoint=node.endpoint, timeout=30,
                                      backoff=SLOW_TO_TELL, sleep=clock.sleep, clock=clock)
    elif case == "wait until ready":
        node.go_down()
        with _mtls(node) as client, pytest.raises(GaveUp, match=r"^waiting for the stand-in: gave up after 30s"):
            operations.wait_until_ready(client, timeout=30, what="waiting for the stand-in", backoff=SLOW_TO_TELL,
                                        sleep=clock.sleep, clock=clock)
    elif case == "went down":
        with _mtls(node) as client:
            assert operations.went_down(client, "cp-9", timeout=30, backoff=SLOW_TO_TELL, sleep=clock.sleep,
                                        clock=clock) is False
    else:
        with _mtls(node) as client, pytest.raises(TimeoutError, match=r"^node cp-9 said the configuration needs a "
                                                                       r"reboot but kept answering for 30s"):
            operations.wait_until_down(client, "cp-9", timeout=30, backoff=SLOW_TO_TELL, sleep=clock.sleep,
                                       clock=clock)
    assert clock.slept_as(SLOW_TO_TELL, within=30), clock.slept


def test_a_wait_left_no_time_by_the_apply_says_it_had_none(configured_node):
    """The time left after the apply is what the wait for the node gets: none, here, not a second more."""
    clock = FakeClock()

    def apply_taking_all_the_time(node, request, context):
        clock.now += 30
        return FakeTalosNode._rpc_ApplyConfiguration(node, request, context)

    configured_node.behaviours["ApplyConfiguration"] = apply_taking_all_the_time
    configured_node.fail_next("Version", grpc.StatusCode.UNAVAILABLE, "rebooting", times=1000)
    with pytest.raises(GaveUp, match=r"^wait for 127\.0\.0\.1 after apply: gave up after 0s and 1 attempts"):
        _apply_timed(configured_node, clock)


@pytest.mark.parametrize("case", ["insecure apply", "mtls apply", "reboot", "bootstrap", "version", "went down"])
def test_a_hung_call_is_bounded_by_the_time_left(maintenance_node, configured_node, case):
    """One RPC gets at most what is left of the operation, never the client's own 60 s."""
    node = maintenance_node if case == "insecure apply" else configured_node
    rpc = {"insecure apply": "ApplyConfiguration", "mtls apply": "ApplyConfiguration", "reboot": "Reboot",
           "bootstrap": "Bootstrap", "version": "Version", "went down": "Version"}[case]
    node.delays[rpc] = 10.0
    started = time.monotonic()
    if case == "went down":
        with _mtls(node) as client:
            assert operations.went_down(client, "cp-9", timeout=1.0, backoff=FAST) is True  # no answer in time
    else:
        with pytest.raises((GaveUp, operations.errors.TalosApiError)):
            if case == "bootstrap":
                operations.bootstrap_etcd("127.0.0.1", _talosconfig(), endpoint=node.endpoint, timeout=1.0, backoff=FAST)
            elif case == "version":
                with _mtls(node) as client:
                    operations.wait_until_ready(client, timeout=1.0, what="wait", backoff=FAST)
            else:
                operations.apply_machine_configuration(
                    "127.0.0.1", CONFIG, _talosconfig(), endpoint=node.endpoint, timeout=1.0, backoff=FAST,
                    insecure_first=case == "insecure apply", mode="reboot" if case == "reboot" else "no-reboot")
    assert time.monotonic() - started < 5
    assert node.calls_for(rpc)


def test_retries_after_a_refused_insecure_apply_go_straight_to_mtls(configured_node):
    configured_node.fail_next("ApplyConfiguration", grpc.StatusCode.UNAVAILABLE, "connection reset", times=2)
    outcome = operations.apply_machine_configuration("127.0.0.1", CONFIG, _talosconfig(),
                                                     endpoint=configured_node.endpoint, timeout=10, backoff=FAST)
    assert outcome.via == "mtls" and len(configured_node.calls_for("ApplyConfiguration")) == 3
    assert configured_node.refused_handshakes == 1  # the one insecure try; the retries were mTLS only


def test_an_empty_apply_reply_is_an_outcome_without_details(configured_node):
    configured_node.behaviours["ApplyConfiguration"] = lambda n, r, c: machine_pb2.ApplyConfigurationResponse()
    outcome = operations.apply_machine_configuration("127.0.0.1", CONFIG, _talosconfig(), insecure_first=False,
                                                     endpoint=configured_node.endpoint, timeout=10, backoff=FAST)
    assert (outcome.via, outcome.mode_details, outcome.warnings, outcome.rebooted) == ("mtls", "", (), False)


def test_a_version_reply_without_messages_is_an_empty_tag(configured_node):
    configured_node.behaviours["Version"] = lambda n, r, c: machine_pb2.VersionResponse()
    with _mtls(configured_node) as client:
        assert operations.wait_until_ready(client, timeout=5, what="wait", backoff=FAST) == ""


def test_errors_without_a_code_or_explanation_are_not_waited_on():
    class Coded(Exception):
        def __init__(self, code):
            super().__init__("x")
            self.code = code

    assert operations._transient_apply(ValueError("no code")) is False
    assert operations._transient_apply(Coded(grpc.StatusCode.FAILED_PRECONDITION)) is False
    assert operations._not_ready_yet(Coded(grpc.StatusCode.UNIMPLEMENTED)) is False
    with pytest.raises(ValueError, match=r"^mode 'fast' is not supported; expected one of auto, no-reboot, "):
        operations.check_mode("fast")


def test_every_install_wait_runs_at_once_on_its_own_named_thread(monkeypatch):
    """However many nodes, all wait side by side (a pool smaller than the nodes would not pass the
    barrier), with the backoff given (the default here would give up at the first refusal)."""
    monkeypatch.setattr(operations, "DEFAULT_BACKOFF", Backoff(initial=1000.0, factor=1.0, maximum=1000.0))
    nodes = {f"node-{i}": f"10.0.0.{i}" for i in range(12)}
    barrier, threads = threading.Barrier(len(nodes)), []
    node = FakeTalosNode(shared_bundle(), mode="configured")
    node.fail_next("Version", grpc.StatusCode.UNAVAILABLE, "rebooting", times=len(nodes))
    try:
        def client_for(address):
            threads.append(threading.current_thread().name)
            barrier.wait(timeout=10)
            return _mtls(node)

        tags = operations.wait_until_all_ready(nodes, client_for, timeout=10, backoff=FAST)
        assert tags == dict.fromkeys(nodes, "v1.11.5")
        assert len(threads) == 12 and all(name.startswith("install-wait") for name in threads)
    finally:
        node.stop()


def test_a_node_that_never_comes_up_is_named_with_its_own_wait(monkeypatch):
    node = FakeTalosNode(shared_bundle(), mode="configured")
    node.go_down()
    try:
        with pytest.raises(operations.NodesNotReady) as failed:
            operations.wait_until_all_ready({"node-1": "10.0.0.1"}, lambda _address: _mtls(node), timeout=0.3,
                                            backoff=FAST)
    finally:
        node.stop()
    assert list(failed.value.failed) == ["node-1"] and failed.value.ready == ()
    assert failed.value.failed["node-1"].startswith("wait for node-1 to install: gave up after 0.3s and ")


def test_nodes_not_ready_names_each_node_and_why():
    error = operations.NodesNotReady({"cp-1": "gave up", "cp-2": "refused"}, ready=("w-1",))
    assert str(error) == "2 of 3 nodes did not come up configured: node cp-1: gave up; node cp-2: refused"
