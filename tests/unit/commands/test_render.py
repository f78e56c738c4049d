"""`python -m talos_proxmox.commands.render`: the stack's files written offline, as `pulumi up` would send them."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys

import pytest
import yaml

from talos_proxmox.commands import render
from talos_proxmox.cluster_plan import resource_inputs
from talos_proxmox.talos_config import machine_config, pki, secrets_bundle
from talos_proxmox.settings.model import RENDER_OUTPUT_FILES
from talos_proxmox.settings.stack import load_settings, stack_file_values
from tests.paths import REPO
from tests.program.mocked_program import stack_config

SEED_SCHEMATIC_ID = "e142ceb080fb243141b5b6891cfcf0c60bc9430d69be0adf803999d2b62dc885"
SEED_SCHEMATIC_YAML = (
    "customization:\n  extraKernelArgs:\n    - net.ifnames=0\n  systemExtensions:\n    officialExtensions:\n"
    "      - siderolabs/iscsi-tools\n      - siderolabs/nfs-utils\n      - siderolabs/qemu-guest-agent\n"
    "      - siderolabs/util-linux-tools\n")
NODES = [n["name"] for n in stack_config("test-cluster")["nodes"]]


def v1alpha1(path) -> dict:
    return next(d for d in machine_config.parse_config(path.read_text()) if d.get("version") == "v1alpha1")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("render") / "out"
    assert render.main(["--stack", "test-cluster", "--out", str(out)]) == 0
    return out


def test_writes_every_node_config_talosconfig_schematic_and_helm_values(rendered):
    names = {p.name for p in rendered.iterdir()}
    assert {f"{n}.yaml" for n in NODES} <= names
    # Every fixed name the settings reserve, but the LB pool's and the CSI plugin's (the stack has neither).
    assert names - {f"{n}.yaml" for n in NODES} == {*RENDER_OUTPUT_FILES, render.STACK_MARKER} - {
        render.CILIUM_LOAD_BALANCER_FILE, render.CSI_VALUES_FILE, render.PROXMOX_CCM_VALUES_FILE}
    for path in rendered.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name


def test_schematic_and_its_id_are_the_seeds(rendered):
    """The file is the canonical form the id hashes, so `curl --data-binary @schematic.yaml` gets that id."""
    text = (rendered / "schematic.yaml").read_text()
    assert yaml.safe_load(text) == yaml.safe_load(SEED_SCHEMATIC_YAML)
    assert hashlib.sha256(text.encode()).hexdigest() == SEED_SCHEMATIC_ID
    assert (rendered / "schematic-id").read_text().strip() == SEED_SCHEMATIC_ID


def test_node_configs_carry_role_installer_mac_and_data_disk(rendered):
    master = v1alpha1(rendered / "master-1.yaml")
    assert master["machine"]["type"] == "controlplane"
    assert master["machine"]["install"] == {
        "disk": "/dev/sda", "image": f"factory.talos.dev/installer/{SEED_SCHEMATIC_ID}:v1.13.7",
        **{k: v for k, v in master["machine"]["install"].items() if k not in ("disk", "image")}}
    documents = {d.get("kind"): d for d in machine_config.parse_config((rendered / "master-1.yaml").read_text())}
    assert documents["LinkAliasConfig"]["selector"] == {"match": 'mac(link.permanent_addr) == "bc:24:11:80:a1:9b"'}
    assert documents["LinkConfig"]["addresses"] == [{"address": "10.255.200.201/24"}]
    assert "network" not in master["machine"]
    assert master["cluster"]["controlPlane"]["endpoint"] == "https://10.255.200.201:6443"

    worker = v1alpha1(rendered / "worker-1.yaml")
    assert worker["machine"]["type"] == "worker"
    assert worker["machine"]["disks"] == [{"device": "/dev/sdb", "partitions": [{"mountpoint": "/var/lib/longhorn"}]}]
    assert "disks" not in v1alpha1(rendered / "worker-4.yaml")["machine"]


def test_configs_are_signed_by_the_written_bundle_and_talosconfig_targets_the_cluster(rendered):
    bundle = secrets_bundle.load_secrets_file(str(rendered / "secrets.yaml"))
    master = v1alpha1(rendered / "master-1.yaml")
    assert master["machine"]["ca"]["crt"] == bundle["certs"]["os"]["crt"]
    config = yaml.safe_load((rendered / "talosconfig").read_text())
    context = config["contexts"][config["context"]]
    assert config["context"] == "test-cluster"
    assert context["endpoints"] == ["10.255.200.201", "10.255.200.202", "10.255.200.203"]
    assert context["nodes"] == ["10.255.200.201"]
    pki.verify_issued_by(pki.pem_from_b64(context["crt"]), pki.pem_from_b64(bundle["certs"]["os"]["crt"]))


def test_second_run_reuses_the_bundle_and_gives_the_same_configs(rendered):
    before = {p.name: p.read_bytes() for p in rendered.iterdir() if p.name != "talosconfig"}
    assert render.main(["--stack", "test-cluster", "--out", str(rendered)]) == 0
    after = {p.name: p.read_bytes() for p in rendered.iterdir() if p.name != "talosconfig"}
    assert after == before


def test_given_bundle_is_used_and_not_copied(rendered, tmp_path):
    out = tmp_path / "other"
    assert render.main(["--stack", "test-cluster", "--out", str(out),
                        "--secrets", str(rendered / "secrets.yaml")]) == 0
    assert not (out / "secrets.yaml").exists()
    assert (out / "worker-2.yaml").read_bytes() == (rendered / "worker-2.yaml").read_bytes()


def test_each_config_is_what_the_program_renders_from_the_same_inputs(rendered):
    """The command and the MachineConfiguration resources share `machine_config_inputs`."""
    settings = load_settings(stack_config("test-cluster"))
    bundle = secrets_bundle.load_secrets_file(str(rendered / "secrets.yaml"))
    installer = resource_inputs.image_facts(settings).installer_image
    for node in settings.nodes:
        expected = machine_config.render(bundle, **resource_inputs.machine_config_inputs(settings, node, installer))
        assert (rendered / f"{node.name}.yaml").read_text() == expected


def test_bad_stack_writes_nothing_and_names_the_key(tmp_path, capsys):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    text = (REPO / "stacks" / "Pulumi.test-cluster.yaml").read_text().replace("ip: 10.255.200.202", "ip: 10.255.200.201")
    (stacks / "Pulumi.broken.yaml").write_text(text)
    out = tmp_path / "out"
    code = render.main(["--stack", "broken", "--out", str(out), "--stacks-dir", str(stacks)])
    assert code == 1
    assert "talos-proxmox:nodes[1].ip: '10.255.200.201' duplicates nodes[0].ip" in capsys.readouterr().err
    assert not out.exists()


def test_unknown_stack_is_refused(tmp_path, capsys):
    assert render.main(["--stack", "nope", "--out", str(tmp_path / "o")]) == 2
    assert "Pulumi.nope.yaml does not exist" in capsys.readouterr().err


def test_help_explains_the_secrets_bundle():
    result = subprocess.run([sys.executable, "-m", "talos_proxmox.commands.render", "--help"], cwd=REPO,
                            capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0
    assert "--secrets FILE" in result.stdout
    assert "secrets.yaml is reused if it exists and generated there once" in " ".join(result.stdout.split())


@pytest.mark.parametrize("text, message", [
    ("config:\n  talos-proxmox:cluster: {name: a\n", "Pulumi.bad.yaml:3:1: not valid YAML: expected ',' or '}', but got '<stream end>'"),
    ("config:\n\ttalos-proxmox:cluster: {}\n", "Pulumi.bad.yaml:2:1: not valid YAML: found character '\\t' that cannot start any token"),
    ("- a\n- b\n", "Pulumi.bad.yaml: a list (expected a mapping with a 'config:' key)"),
    ("config:\n  - talos-proxmox:cluster\n", "Pulumi.bad.yaml: config: a list (expected a mapping of '<namespace>:<key>')"),
    ('config:\n  talos-proxmox:cluster: {name: "dev\x07"}\n',
     "Pulumi.bad.yaml:2:37: not valid YAML: unacceptable character #x0007: special characters are not allowed"),
    # Line and column counted from the file's start, with newlines before and after the character.
    ('\nconfig:\n  talos-proxmox:cluster: {name: "a\x07"}\n  x: y\n',
     "Pulumi.bad.yaml:3:35: not valid YAML: unacceptable character #x0007: special characters are not allowed"),
    ("config:\n  talos-proxmox:cluster: {name: Z\u00fcrich}\n".encode("latin-1"),
     "Pulumi.bad.yaml: not UTF-8 text (byte 0xfc at offset 41)"),
], ids=["unclosed-flow", "tab", "list", "config-list", "control-character", "control-character-line-3", "latin-1"])
def test_a_malformed_stack_file_is_one_line_naming_file_and_line(tmp_path, capsys, text, message):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.bad.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "out"
    assert render.main(["--stack", "bad", "--out", str(out), "--stacks-dir", str(stacks)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("error: invalid stack config:\n  - ") and err.rstrip().endswith(message), err
    assert str(stacks) in err
    assert not out.exists()  # nothing written


def test_unknown_stack_lists_the_stacks_there_are(tmp_path, capsys):
    assert render.main(["--stack", "prod", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --stack 'prod': {REPO / 'stacks' / 'Pulumi.prod.yaml'} does not exist (stacks: dev, test-cluster)\n"
    assert not (tmp_path / "o").exists()


def test_prints_each_file_as_written_then_what_to_do_next(tmp_path, capsys):
    out = tmp_path / "dev"
    assert render.main(["--stack", "dev", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    written = [line.split(":", 1)[0].removeprefix("wrote ") for line in lines if line.startswith("wrote ")]
    assert written == [str(out / name) for name in (
        "secrets.yaml", "schematic.yaml", "schematic-id", "dev-cp-1.yaml", "dev-worker-1.yaml", "talosconfig",
        "cilium-values.yaml")]
    assert lines[3] == f"wrote {out / 'dev-cp-1.yaml'}: controlplane 10.10.0.51"
    assert lines[-1] == (
        f"next: review the files; to deploy with Pulumi run `pulumi preview --diff --stack dev`, or by hand: "
        f"`talosctl apply-config --insecure -n <ip> --file {out}/<node>.yaml` for each node, then "
        f"`talosctl --talosconfig {out / 'talosconfig'} bootstrap -n 10.10.0.51`")
    assert (out / render.STACK_MARKER).read_text() == "dev\n"


def test_an_out_dir_of_another_stack_is_refused_untouched(tmp_path, capsys):
    """Two clusters rendered into one directory would share one secrets bundle: one identity for both."""
    out = tmp_path / "out"
    assert render.main(["--stack", "dev", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert render.main(["--stack", "test-cluster", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --out {out}: holds the files and secrets bundle of stack 'dev' (expected an empty directory or "
        "one rendered for 'test-cluster', e.g. --out out/test-cluster)")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_bundle_of_unknown_origin_in_out_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "secrets.yaml").write_text("x")
    assert render.main(["--stack", "dev", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: --out {out}: holds a secrets.yaml not rendered for stack 'dev' (to use that bundle, pass "
        f"--secrets {out / 'secrets.yaml'} with another --out)\n")
    assert [p.name for p in out.iterdir()] == ["secrets.yaml"]


@pytest.mark.parametrize("where", ["file", "inside-file"])
def test_an_out_that_is_a_file_is_one_line(tmp_path, capsys, where):
    target = tmp_path / "f"
    target.write_text("keep")
    out = target if where == "file" else target / "sub"
    assert render.main(["--stack", "dev", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out {out}: {'' if where == 'file' else f'{target} '}is a file (expected a directory)\n"
    assert target.read_text() == "keep"


def test_an_out_the_system_refuses_is_one_line(capsys):
    out = "/proc/talos-proxmox-render-test"
    assert render.main(["--stack", "dev", "--out", out]) in (1, 2)
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {out}: ") and err.count("\n") == 1 and "Traceback" not in err


def test_a_load_balancer_pool_is_written_with_the_ui_service(tmp_path, capsys):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    config = yaml.safe_load((REPO / "stacks" / "Pulumi.dev.yaml").read_text())
    config["config"]["talos-proxmox:cilium"] = {"loadBalancerAddresses": ["10.10.0.60/30"]}
    config["config"]["talos-proxmox:hubble"] = {"uiServiceType": "LoadBalancer"}
    (stacks / "Pulumi.lb.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert render.main(["--stack", "lb", "--out", str(out), "--stacks-dir", str(stacks)]) == 0
    documents = list(yaml.safe_load_all((out / "cilium-load-balancer.yaml").read_text()))
    assert [d["kind"] for d in documents] == ["CiliumLoadBalancerIPPool", "CiliumL2AnnouncementPolicy", "Service"]
    assert documents[0]["spec"] == {"blocks": [{"cidr": "10.10.0.60/30"}]}


def test_the_csi_plugin_s_values_are_written_with_the_ccm_s_transformations_and_no_token(tmp_path, capsys):
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    config = yaml.safe_load((REPO / "stacks" / "Pulumi.dev.yaml").read_text())
    config["config"]["talos-proxmox:ccm"] = {"enabled": True}
    config["config"]["talos-proxmox:csi"] = {"enabled": True, "region": "lab",
                                             "storageClasses": [{"name": "data", "datastore": "local-lvm"}]}
    (stacks / "Pulumi.csi.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert render.main(["--stack", "csi", "--out", str(out), "--stacks-dir", str(stacks)]) == 0
    csi = yaml.safe_load((out / "proxmox-csi-values.yaml").read_text())
    assert csi["existingConfigSecret"] == "proxmox-csi-plugin-config" and "config" not in csi
    assert csi["storageClass"] == [{"name": "data", "storage": "local-lvm", "reclaimPolicy": "Delete",
                                    "fstype": "ext4"}]
    ccm = yaml.safe_load((out / "talos-ccm-values.yaml").read_text())
    assert ccm["transformations"][0]["platformMetadata"] == {"Region": "lab", "Zone": "pve"}
    assert not (out / "proxmox-ccm-values.yaml").exists()


@pytest.mark.parametrize("text", ["", "# a stack to fill in\n", "config:\n", "config: {}\n"],
                         ids=["empty", "comment-only", "config-null", "config-empty"])
def test_a_stack_file_without_config_has_no_keys(tmp_path, text):
    path = tmp_path / "Pulumi.new.yaml"
    path.write_text(text)
    assert stack_file_values(str(path)) == {}


def test_a_stack_file_is_read_as_utf_8_whatever_the_locale(tmp_path):
    """A stack file with non-ASCII comments reads the same in a real interpreter whose locale encoding is ASCII."""
    path = tmp_path / "Pulumi.zurich.yaml"
    text = (REPO / "stacks" / "Pulumi.dev.yaml").read_text(encoding="utf-8")
    path.write_text("# Zürich lab — rack 2\n" + text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG"))}
    env.update(LC_ALL="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0")
    if env.get("MUTANT_UNDER_TEST") == "stats":  # mutmut's coverage pass records in-process only: run the original
        env["MUTANT_UNDER_TEST"] = ""
    script = ("import json, sys; from talos_proxmox.settings.stack import stack_file_values; "
              "print(json.dumps(stack_file_values(sys.argv[1])))")
    result = subprocess.run([sys.executable, "-c", script, str(path)], cwd=REPO, capture_output=True, text=True,
                            env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == stack_file_values(str(path)) == stack_file_values(
        str(REPO / "stacks" / "Pulumi.dev.yaml"))


def test_a_secret_project_key_cannot_be_rendered_offline_and_is_one_line(tmp_path, capsys):
    """Only the Pulumi CLI can decrypt a `{secure: ...}` value; every other key is still read."""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    config = yaml.safe_load((REPO / "stacks" / "Pulumi.dev.yaml").read_text())
    config["config"]["talos-proxmox:image"] = {"secure": "v1:Zm9vYmFy:ciphertext"}  # before nodes and ccm
    (stacks / "Pulumi.sealed.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    out = tmp_path / "out"
    assert render.main(["--stack", "sealed", "--out", str(out), "--stacks-dir", str(stacks)]) == 1
    assert capsys.readouterr().err == (
        "error: invalid stack config:\n  - talos-proxmox:image: is a secret, which only `pulumi preview`/`pulumi up` "
        "can decrypt (expected a plain value for the offline render command)\n")
    assert not out.exists()
