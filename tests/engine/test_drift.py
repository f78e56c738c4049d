"""Drift through the real CLI: `pulumi preview --refresh` reads each node and `pulumi up --refresh` brings it
back (issue 35's config and maintenance parts).

Stand-ins as in tests/engine/test_first_deploy_and_day_two.py: one control plane and two workers at 127.0.0.72-74:50000.
After the first up, e2e-worker-1's config is changed by hand (an ApplyConfiguration over mTLS with the
stack's talosconfig, as `talosctl apply-config` sends it), e2e-worker-2 is reset to maintenance mode
(it boots the ISO again) and e2e-cp-1 runs Talos v1.13.6 (rolled back by hand). Then a preview with
--refresh, and an up with --refresh. Then both workers' configs are changed by hand again, this time in a
way Talos takes back only by rebooting, and another up with --refresh puts them back one node at a time.
"""

from __future__ import annotations

import contextlib
import io
import time

import pytest
import yaml

from talos_proxmox.commands import drift as drift_command
from talos_proxmox.talos_api.client import TalosClient, read_talosconfig
from tests.engine.cluster import engine_cluster, engine_stack, secret_texts

pytestmark = pytest.mark.engine

NODES = [("e2e-cp-1", "controlplane", "127.0.0.72"), ("e2e-worker-1", "worker", "127.0.0.73"),
         ("e2e-worker-2", "worker", "127.0.0.74")]
TALOS = "v1.13.7"
BY_HAND = "8192"  # net.core.somaxconn, set by hand on e2e-worker-1
ROLLED_BACK = "v1.13.6"  # what e2e-cp-1 runs after a rollback by hand


def hand_edited(config: bytes) -> bytes:
    documents = list(yaml.safe_load_all(config))
    for document in documents:
        if isinstance(document, dict) and document.get("version") == "v1alpha1":
            document["machine"].setdefault("sysctls", {})["net.core.somaxconn"] = BY_HAND
    return yaml.safe_dump_all(documents, sort_keys=False).encode()


@pytest.fixture(scope="module")
def drift(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine-drift")
    with engine_cluster(tmp, NODES, TALOS) as (cluster, project):
        config = engine_stack(cluster, NODES, TALOS, tmp / "secrets.yaml")
        first = cluster.deploy(project, config, tmp / "render-first")
        worker, reset = cluster.nodes["e2e-worker-1"], cluster.nodes["e2e-worker-2"]
        credentials = read_talosconfig(first.outputs["talosconfig"]).credentials
        with TalosClient([worker.endpoint], credentials=credentials, node="127.0.0.73") as client:
            client.apply_configuration(hand_edited(worker.config), mode="no-reboot", timeout=10)
        reset.go_down()
        reset.boot_from_iso()
        cluster.nodes["e2e-cp-1"].version_tag = ROLLED_BACK
        calls_before = {name: len(fake.calls) for name, fake in cluster.nodes.items()}
        looked = io.StringIO()
        with contextlib.redirect_stdout(looked):
            looked_status = drift_command.main(["--stack", project.stack, "--secrets", str(tmp / "secrets.yaml"),
                                                "--stacks-dir", str(project.stack_file.parent)])
        preview = project.preview("--refresh", "--diff")
        up = project.up("--refresh")
        rebooting_since = time.monotonic()
        calls_before_reboots = {name: len(fake.calls) for name, fake in cluster.nodes.items()}
        for name, address in (("e2e-worker-1", "127.0.0.73"), ("e2e-worker-2", "127.0.0.74")):
            fake = cluster.nodes[name]
            with TalosClient([fake.endpoint], credentials=credentials, node=address) as client:
                client.apply_configuration(hand_edited(fake.config), mode="no-reboot", timeout=10)
            fake.auto_needs_reboot = True  # putting it back takes a reboot,
            fake.install_downtime = 3.0  # long enough to be seen going down (a real one takes half a minute)
        rebooted = project.up("--refresh")
        yield {"first": first, "preview": preview, "up": up, "cluster": cluster, "project": project,
               "calls_before": calls_before, "looked": looked.getvalue(), "looked_status": looked_status,
               "rebooted": rebooted, "rebooting_since": rebooting_since,
               "calls_before_reboots": calls_before_reboots}


def between(drift, name: str) -> list:
    """What node `name` received from the first refresh to the hand changes that take a reboot."""
    return drift["cluster"].nodes[name].calls[drift["calls_before"][name]:drift["calls_before_reboots"][name]]


def test_the_refreshed_preview_names_each_drifted_node_and_plans_only_their_applies(drift):
    preview = drift["preview"]
    planned = {name: op for name, op in preview.changes().items() if op != "refresh"}  # every resource is read
    assert planned == {"apply-e2e-worker-1": "update", "apply-e2e-worker-2": "update", "lifecycle-e2e-cp-1": "update"}
    printed = "".join(preview.diagnostics("info#err")) + preview.stderr
    # the stack sets no sysctls on it: the hand-set one is two lines (the key and its map), none to add back
    assert "node 127.0.0.73: its running config differs from the stack's (2 line(s) set by hand, 0 to apply back" in printed
    assert "talos-proxmox: refresh: -    sysctls:" in printed
    assert f'talos-proxmox: refresh: -        net.core.somaxconn: "{BY_HAND}"' in printed
    assert "node 127.0.0.74: in maintenance mode; the next up applies its config again" in printed
    assert "node 127.0.0.72" not in printed  # the control plane's config did not drift, its version did:
    assert (f"node e2e-cp-1: runs Talos {ROLLED_BACK}, the stack says {TALOS}: the next up rolls it to {TALOS}"
            in printed)
    assert "not an etcd member" not in printed


def test_the_refreshed_up_applies_the_stack_config_back_and_reinstalls_the_reset_node(drift):
    cluster, first = drift["cluster"], drift["first"]
    assert set(drift["up"].steps("update")) == {"apply-e2e-worker-1", "apply-e2e-worker-2", "lifecycle-e2e-cp-1"}
    cp = cluster.nodes["e2e-cp-1"]
    assert cp.version_tag == TALOS  # rolled back to the stack's version, as an upgrade
    assert [c.rpc for c in cp.calls[drift["calls_before"]["e2e-cp-1"]:] if c.rpc == "LifecycleService/Upgrade"]
    worker, reset = cluster.nodes["e2e-worker-1"], cluster.nodes["e2e-worker-2"]
    assert worker.config == first.rendered["e2e-worker-1"]
    assert reset.mode == "configured" and reset.config == first.rendered["e2e-worker-2"]
    [again] = [c for c in between(drift, "e2e-worker-2") if c.rpc == "ApplyConfiguration"]
    assert again.mode == "maintenance" and again.roles == ()  # its first apply, insecure, as at creation
    dry_run, back = [c for c in between(drift, "e2e-worker-1") if c.rpc == "ApplyConfiguration"]
    assert dry_run.request.dry_run and not back.request.dry_run  # Talos said whether it takes a reboot first
    assert back.roles == ("os:admin",) and back.request.data == first.rendered["e2e-worker-1"]


def test_hand_changes_that_take_a_reboot_are_put_back_one_node_at_a_time_health_gated(drift):
    cluster, first, up = drift["cluster"], drift["first"], drift["rebooted"]
    assert set(up.steps("update")) == {"apply-e2e-worker-1", "apply-e2e-worker-2"}
    workers = [cluster.nodes["e2e-worker-1"], cluster.nodes["e2e-worker-2"]]
    for fake in workers:
        assert fake.config == first.rendered[fake.hostname]
    down = []
    for fake in workers:
        downs = [at for at, what in fake.power if what == "down" and at > drift["rebooting_since"]]
        ups = [at for at, what in fake.power if what == "up" and at > drift["rebooting_since"]]
        assert len(downs) == len(ups) == 1, fake.hostname
        down.append((downs[0], ups[0]))
    (first_down, first_up), (second_down, second_up) = sorted(down)
    assert second_down > first_up, "both workers were down at once"
    printed = "".join(up.diagnostics("info#err")) + up.stderr
    assert printed.count(": rebooted into its configuration and healthy") == 2


def test_a_refresh_prints_and_stores_no_secret(drift):
    needles = secret_texts(drift["cluster"])
    printed = drift["preview"].output + drift["up"].output
    state = str(drift["project"].export())
    for needle in needles:
        assert needle not in printed and needle not in state


def test_the_read_only_drift_command_reports_the_same_without_pulumi(drift):
    looked = drift["looked"]
    assert drift["looked_status"] == 3  # drift found
    assert "node e2e-worker-1: its running config differs from the stack's (2 line(s) set by hand, 0 to apply back" in looked
    assert f'-        net.core.somaxconn: "{BY_HAND}"' in looked
    assert "node e2e-worker-2: in maintenance mode" in looked
    assert f"node e2e-cp-1: runs Talos {ROLLED_BACK}, the stack says {TALOS}" in looked
    for needle in secret_texts(drift["cluster"]):
        assert needle not in looked
