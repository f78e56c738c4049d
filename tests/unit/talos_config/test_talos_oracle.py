"""Talos's own Go code as the oracle for every config we render (issue #17).

`talosctl` cannot be built here (the module proxy refuses some of its dependencies), so
scripts/talos-oracle/ is our small Go program over Talos's machinery module doing what `talosctl validate`
and `talosctl gen config` / `gen secrets` do; scripts/build-talos-oracle.sh builds it once per Talos line
(machinery v1.12.7, v1.13.9, v1.14.1) into .tools/bin/talos-oracle-v1.NN. Built by `bash scripts/tools.sh`;
missing binaries fail this module, since CI builds them first.

For every stack in stacks/ and a matrix of dev-stack variants, under each Talos line:
  1. every node's file from the render command is valid for runtime mode metal, strictly (warnings fail);
  2. the oracle's `gen config`, given the same bundle, cluster name, endpoint, versions, install disk and
     image and our node's patches as `--config-patch` files, writes the same documents as our render;
  3. a bundle from machinery's own secrets generation is adopted through cluster.secretsFile.
"""

from __future__ import annotations

import copy
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import pytest
import yaml

from talos_proxmox.cluster_plan.node_patches import DERIVED, labeled_node_patches
from talos_proxmox.cluster_plan.resource_inputs import image_facts, machine_config_inputs
from talos_proxmox.commands import render
from talos_proxmox.settings.model import DEFAULT_KUBERNETES_VERSIONS, PROJECT, Settings
from talos_proxmox.settings.stack_config import StackConfig, load_stack
from talos_proxmox.talos_config import machine_config, secrets_bundle
from tests.program.mocked_program import stack_config, with_sections
from tests.paths import REPO

BIN = REPO / ".tools" / "bin"
# Each Talos line: the machinery its oracle is built against, which is also the talosVersion we render
# for, so the installer tag and the version contract are the same on both sides.
LINES = {"v1.12": "v1.12.7", "v1.13": "v1.13.9", "v1.14": "v1.14.1"}
# A fixed bundle (upstream's stability fixtures' own), so both sides render the same keys.
FIXED_SECRETS = REPO / "tests" / "data" / "talos-stability" / "secrets.yaml"
STACKS = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in (REPO / "stacks").glob("Pulumi.*.yaml"))
BUILD_HINT = "run `bash scripts/tools.sh` (it builds them with scripts/build-talos-oracle.sh) first"
UNATTENDED_INSTALL = "UnattendedInstallConfig"


def oracle_path(line: str) -> Path:
    return BIN / f"talos-oracle-{line}"


def run_oracle(line: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(oracle_path(line)), *args], capture_output=True, text=True, timeout=300)
    if check and done.returncode != 0:
        raise AssertionError(f"talos-oracle-{line} {args[0]} failed ({done.returncode}): {done.stderr.strip()}")
    return done


@pytest.fixture(scope="module", autouse=True)
def oracles() -> None:
    """Every line's binary, built against the machinery version of LINES; else one line saying how to build."""
    missing = [oracle_path(line).name for line in LINES if not oracle_path(line).is_file()]
    if missing:
        pytest.fail(f"{', '.join(missing)} not in {BIN}: {BUILD_HINT}", pytrace=False)
    for line, version in LINES.items():
        built = json.loads(run_oracle(line, "version").stdout)["machinery"]
        if built != version:
            pytest.fail(f"{oracle_path(line)} is built against machinery {built}, expected {version}: {BUILD_HINT}",
                        pytrace=False)


# ---------------------------------------------------------------- the stacks under test


def for_line(config: dict, line: str) -> dict:
    """A stack moved to the line's release. Under v1.14 a data disk is a user volume, which Talos mounts at
    /var/mnt/<name> (the settings refuse any other mountpoint there), so a stack's /var/lib/longhorn
    becomes /var/mnt/longhorn."""
    config = with_sections(config, cluster={"talosVersion": LINES[line]})
    if line == "v1.14":
        for node in config["nodes"]:
            disk = node.get("dataDisk")
            if disk and "mountpoint" in disk and not disk["mountpoint"].startswith("/var/mnt/"):
                disk["mountpoint"] = "/var/mnt/" + disk["mountpoint"].rstrip("/").rsplit("/", 1)[-1]
    return config


def user_patches(line: str) -> dict:
    """Strategic-merge patches at each level a stack holds them: cluster-wide (before v1.14 one writes a file), per role
    (one a `$patch: delete`), per node (a merge into our own LinkConfig, a new document), in the form the line takes: from
    v1.14 the settings that left the v1alpha1 document are patched through their documents."""
    if line == "v1.14":
        cluster = [{"apiVersion": "v1alpha1", "kind": "SysctlConfig", "params": {"vm.max_map_count": "262144"}}]
        controlplane = [{"apiVersion": "v1alpha1", "kind": "KubeAPIServerConfig",
                         "extraArgs": {"audit-log-maxage": "30"}}]
        worker = [{"apiVersion": "v1alpha1", "kind": "KubeNodeConfig", "labels": {"storage": "longhorn"}},
                  {"apiVersion": "v1alpha1", "kind": "KubePrismConfig", "$patch": "delete"}]
    else:
        # A file (deprecated from v1.14), as the stack's JSON holds it: a mode in decimal (Talos writes it
        # back in octal) and a number for its string content (Talos writes the number's text, quoted).
        cluster = [{"machine": {"sysctls": {"vm.max_map_count": "262144"}}},
                   {"machine": {"files": [{"content": 1234, "permissions": 420, "path": "/var/etc/oracle.conf",
                                           "op": "create"}]}}]
        controlplane = [{"cluster": {"apiServer": {"extraArgs": {"audit-log-maxage": "30"}}}}]
        worker = [{"machine": {"nodeLabels": {"storage": "longhorn"}}},
                  {"machine": {"features": {"hostDNS": {"$patch": "delete"}}}}]
    node = [{"apiVersion": "v1alpha1", "kind": "LinkConfig", "name": "net0", "mtu": 9000},
            {"apiVersion": "v1alpha1", "kind": "TimeSyncConfig", "ntp": {"servers": ["time.cloudflare.com"]}}]
    return {"cluster": {"patches": cluster, "rolePatches": {"controlplane": controlplane, "worker": worker}},
            "nodes": {1: {"patches": node}}}


def dev_variants(line: str) -> dict[str, dict]:
    """The dev stack (one control plane with a VIP, one worker) with one setting changed at a time."""
    dev = stack_config("dev")
    no_vip = copy.deepcopy(dev)
    del no_vip["cluster"]["vip"]
    mount = "/var/mnt/longhorn" if line == "v1.14" else "/var/lib/longhorn"
    patches = user_patches(line)
    return {
        "dev-no-vip": no_vip,
        "dev-kubespan": with_sections(dev, cluster={"kubespan": {"enabled": True, "mtu": 1420,
                                                           "advertiseKubernetesNetworks": True}}),
        "dev-data-disk": with_sections(dev, nodes={1: {"dataDisk": {"size": 30, "device": "/dev/sdb", "mountpoint": mount},
                                                 "kernelModules": ["iscsi_tcp", "nbd"]}}),
        "dev-ccm": with_sections(dev, ccm={"enabled": True}),
        "dev-ccm-node-ipam": with_sections(dev, ccm={"enabled": True, "nodeIpam": {"maskSizeIpv4": 24}}),
        "dev-nocloud": with_sections(dev, image={"platform": "nocloud"}),
        "dev-secure-boot-tpm": with_sections(dev, image={"secureBoot": True}, cluster={"systemDiskEncryption": "tpm"}),
        "dev-no-cilium-no-discovery": with_sections(dev, cilium={"enabled": False}, hubble={"enabled": False},
                                              cluster={"discovery": False}),
        "dev-user-patches": with_sections(with_sections(dev, cluster=patches["cluster"]), nodes=patches["nodes"]),
    }


def cases(line: str) -> dict[str, dict]:
    return {**{stack: stack_config(stack) for stack in STACKS}, **dev_variants(line)}


CASE_NAMES = [*STACKS, *dev_variants("v1.13")]


# ---------------------------------------------------------------- rendering both ways


@dataclass
class Node:
    name: str
    role: str
    rendered: Path                      # what our render command wrote
    oracle_inputs: dict                 # cluster name, endpoint, versions, install disk/image, patches
    oracle_dir: Optional[Path] = None   # where the oracle's gen-config wrote controlplane/worker.yaml
    oracle_error: Optional[str] = None


@dataclass
class Case:
    line: str
    name: str
    settings: Settings
    nodes: list[Node] = field(default_factory=list)


def write_stack(directory: Path, config: Mapping[str, Any], stack: str = "oracle") -> Path:
    stacks = directory / "stacks"
    stacks.mkdir(parents=True, exist_ok=True)
    (stacks / f"Pulumi.{stack}.yaml").write_text(
        yaml.safe_dump({"config": {f"{PROJECT}:{k}": v for k, v in config.items()}}))
    return stacks


def render_case(line: str, name: str, config: dict, directory: Path, secrets: Optional[Path] = FIXED_SECRETS) -> Case:
    """Our render command's files for the stack (as tests/engine/cluster.py's rendered_configs calls it), and
    what the oracle needs to make the same nodes."""
    stacks = write_stack(directory, config)
    out = directory / "out"
    argv = ["--stack", "oracle", "--out", str(out), "--stacks-dir", str(stacks)]
    if secrets is not None:
        argv += ["--secrets", str(secrets)]
    assert render.main(argv) == 0, f"{line} {name}: the render command failed"
    settings = load_stack(StackConfig.from_file(str(stacks / "Pulumi.oracle.yaml")), base_dir=REPO)
    installer = image_facts(settings).installer_image
    case = Case(line, name, settings)
    for node in settings.nodes:
        inputs = machine_config_inputs(settings, node, installer)
        inputs.update(install_disk=settings.cluster.install_disk, install_image=installer)
        case.nodes.append(Node(node.name, node.role, out / f"{node.name}.yaml", inputs))
    return case


def patch_files(patches: Iterable[Any], directory: Path) -> list[str]:
    """Each patch as a file for `--config-patch @FILE`, in order."""
    directory.mkdir(parents=True, exist_ok=True)
    arguments = []
    for index, patch in enumerate(patches):
        path = directory / f"patch-{index:02d}.yaml"
        path.write_text(patch if isinstance(patch, str) else yaml.safe_dump(patch, sort_keys=False))
        arguments.append(f"@{path}")
    return arguments


def gen_config_args(line: str, inputs: Mapping[str, Any], secrets: Path, output: Path) -> list[str]:
    """`talos-oracle gen-config` for one node: every one of our patches, in our order, as --config-patch (our
    role patches are already in the node's list, so none goes through --config-patch-control-plane/-worker)."""
    args = ["gen-config", "--with-secrets", str(secrets), "--talos-version", inputs["talos_version"],
            "--kubernetes-version", inputs["kubernetes_version"], "--install-disk", inputs["install_disk"],
            "--install-image", inputs["install_image"], "--with-docs=false", "--with-examples=false",
            "--output", str(output)]
    for patch in patch_files(inputs["patches"], output / "patches"):
        args += ["--config-patch", patch]
    return [*args, inputs["cluster_name"], inputs["endpoint"]]


def oracle_gen_config(case: Case, directory: Path, secrets: Path = FIXED_SECRETS) -> None:
    """The oracle's gen-config for every node of the case, two at a time (the machine has 2 cores)."""
    def one(node: Node) -> None:
        output = directory / "oracle" / node.name
        done = run_oracle(case.line, *gen_config_args(case.line, node.oracle_inputs, secrets, output), check=False)
        node.oracle_dir = output
        if done.returncode != 0:
            node.oracle_error = done.stderr.strip()

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, case.nodes))


def validate(line: str, files: list[Path]) -> dict[str, dict]:
    """One oracle run validating every file strictly for metal: file -> {valid, warnings, error}."""
    done = run_oracle(line, "validate", "--mode", "metal", "--strict", "--json", *map(str, files), check=False)
    results = {r["file"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert set(results) == set(map(str, files)), done.stderr
    return results


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def doc_key(document: Mapping) -> str:
    api, kind, name = machine_config.document_id(document)
    return kind + (f"/{name}" if name else "")


@dataclass
class Rendered:
    cases: dict[tuple[str, str], Case]
    validation: dict[str, dict]  # rendered file -> the oracle's verdict


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Rendered:
    """Every case under every line, rendered by us and by the oracle, and every rendered file validated."""
    root = tmp_path_factory.mktemp("oracle")
    cases_by_key, validation = {}, {}
    for line in LINES:
        line_cases = [render_case(line, name, for_line(config, line), root / line / name)
                      for name, config in cases(line).items()]
        for case in line_cases:
            oracle_gen_config(case, root / line / case.name)
            cases_by_key[(line, case.name)] = case
        validation.update(validate(line, [n.rendered for c in line_cases for n in c.nodes]))
    return Rendered(cases_by_key, validation)


# ---------------------------------------------------------------- 1. validate


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("line", LINES)
def test_every_rendered_node_is_valid_for_metal_strictly(rendered, line, name):
    case = rendered.cases[(line, name)]
    problems = {n.name: rendered.validation[str(n.rendered)] for n in case.nodes
                if not rendered.validation[str(n.rendered)]["valid"]}
    assert not problems, "\n".join(f"{node}: {r['error']} (warnings: {r['warnings']})" for node, r in problems.items())
    assert len(case.nodes) == len(case.settings.nodes) >= 2


def test_the_validation_can_fail_a_worker_without_its_install_disk(rendered, tmp_path):
    # The validation above can fail: a rendered worker without its install disk is refused for metal,
    # the mode that installs.
    case = rendered.cases[("v1.13", "dev-no-vip")]
    worker = next(n for n in case.nodes if n.role == "worker")
    docs = documents(worker.rendered)
    docs[0]["machine"]["install"].pop("disk")
    no_disk = tmp_path / "no-disk.yaml"
    no_disk.write_text(yaml.safe_dump_all(docs))
    result = validate("v1.13", [no_disk])[str(no_disk)]
    assert not result["valid"] and "either install disk or diskSelector should be defined" in result["error"]


# ---------------------------------------------------------------- 2. gen config + patches


def differences(ours: list[dict], theirs: list[dict]) -> list[str]:
    """Document by document (keyed by kind and name), what differs between our render and the oracle's."""
    mine, oracle = {doc_key(d): d for d in ours}, {doc_key(d): d for d in theirs}
    found = [f"only in our render: {k}" for k in mine.keys() - oracle.keys()]
    found += [f"only in the oracle's: {k}" for k in oracle.keys() - mine.keys()]
    for key in sorted(mine.keys() & oracle.keys()):
        found += [f"{key}: {path}: ours {a!r}, oracle {b!r}" for path, a, b in _diff(mine[key], oracle[key], "")]
    return found


def _diff(a: Any, b: Any, path: str) -> Iterable[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            yield from _diff(a.get(key, "<absent>"), b.get(key, "<absent>"), f"{path}.{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b)):
            yield from _diff(x, y, f"{path}[{index}]")
    elif a != b:
        yield path or ".", _short(a), _short(b)


def _short(value: Any) -> Any:
    # Keys and certificates are long, and secret: a difference in one is named, never shown.
    return f"<{len(value)} characters>" if isinstance(value, str) and len(value) > 80 else value


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("line", LINES)
def test_gen_config_with_our_patches_gives_our_render(rendered, line, name):
    case = rendered.cases[(line, name)]
    for node in case.nodes:
        assert node.oracle_error is None, f"{node.name}: the oracle's gen-config failed: {node.oracle_error}"
        ours, theirs = documents(node.rendered), documents(node.oracle_dir / f"{node.role}.yaml")
        assert differences(ours, theirs) == [], node.name
        our_order, their_order = [doc_key(d) for d in ours], [doc_key(d) for d in theirs]
        if line == "v1.14":
            # A documented choice (machine_config's docstring): our defaults have no install disk, so
            # the derived install patch adds the UnattendedInstallConfig, after the defaults, where
            # `gen config --install-disk` writes it after the discovery documents. Talos reads documents
            # by kind, not position.
            after_discovery = their_order.index("DiscoveryIdentityConfig") + 1
            assert their_order.index(UNATTENDED_INSTALL) == after_discovery
            assert our_order.index(UNATTENDED_INSTALL) > after_discovery
            our_order.remove(UNATTENDED_INSTALL)
            their_order.remove(UNATTENDED_INSTALL)
        # Otherwise the same documents in the same order: a patch's new document goes last on both sides.
        assert our_order == their_order, node.name


@pytest.mark.parametrize("line", ["v1.12", "v1.13"])
def test_a_patched_file_is_written_as_talos_writes_it(rendered, line):
    # The comparison above reads both sides back, where 420 and 0o644 are one number: the text is checked
    # here. Talos writes a file mode in octal and a number given for a string field as quoted text.
    for node in rendered.cases[(line, "dev-user-patches")].nodes:
        for text in (node.rendered.read_text(), (node.oracle_dir / f"{node.role}.yaml").read_text()):
            assert "- content: \"1234\"\n          permissions: 0o644\n" in text, node.name


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("line", LINES)
def test_every_derived_patch_is_a_strategic_merge(rendered, line, name):
    # talosctl refuses RFC 6902 patches on a multi-document config (machinery's configpatcher, json6902.go),
    # and gen config's is one from v1.12: as merges, our derived patches also work with talosctl.
    settings = rendered.cases[(line, name)].settings
    installer = image_facts(settings).installer_image
    for node in settings.nodes:
        for label, patch in labeled_node_patches(settings, node, installer):
            if label == DERIVED:
                assert machine_config.parse_patch(patch, label)[0] == "strategic", f"{node.name}: {patch!r}"


# ---------------------------------------------------------------- 3. a talosctl-shaped secrets bundle


@pytest.fixture(scope="module")
def adopted(tmp_path_factory) -> dict[str, tuple[Path, Case, dict]]:
    """Per line: a bundle from the oracle's gen-secrets (machinery's generation, as `talosctl gen secrets
    --talos-version` writes it), adopted by the test-cluster stack through cluster.secretsFile and rendered
    without --secrets; then gen-config from that bundle, and every node validated."""
    result = {}
    for line, version in LINES.items():
        directory = tmp_path_factory.mktemp(f"adopted-{line}")
        bundle = directory / "secrets.yaml"
        run_oracle(line, "gen-secrets", "--talos-version", version, "--output-file", str(bundle))
        config = with_sections(for_line(stack_config("test-cluster"), line), cluster={"secretsFile": str(bundle)})
        case = render_case(line, "test-cluster-adopted", config, directory, secrets=None)
        oracle_gen_config(case, directory, secrets=bundle)
        result[line] = (bundle, case, validate(line, [n.rendered for n in case.nodes]))
    return result


@pytest.mark.parametrize("line", LINES)
def test_a_gen_secrets_bundle_is_adopted_and_its_configs_validate(adopted, line):
    bundle, case, validation = adopted[line]
    loaded = secrets_bundle.load_secrets_file(str(bundle))
    assert loaded == yaml.safe_load(bundle.read_text())  # adopted as written, nothing dropped or added
    invalid = {path: r["error"] for path, r in validation.items() if not r["valid"]}
    assert not invalid
    for node in case.nodes:
        v1alpha1 = documents(node.rendered)[0]
        # The bundle's own OS CA and tokens, not a generated bundle's.
        assert v1alpha1["machine"]["ca"]["crt"] == loaded["certs"]["os"]["crt"]
        assert v1alpha1["machine"]["token"] == loaded["trustdinfo"]["token"]
        assert v1alpha1["cluster"]["token"] == loaded["secrets"]["bootstraptoken"]
        assert node.oracle_error is None, node.oracle_error
        theirs = documents(node.oracle_dir / f"{node.role}.yaml")
        assert differences(documents(node.rendered), theirs) == [], node.name


@pytest.mark.parametrize("line", LINES)
def test_our_generated_bundle_passes_machinerys_bundle_validation(line, tmp_path):
    # gen-config validates the bundle it is given (secrets.Bundle.Validate, against the contract from v1.14).
    bundle = tmp_path / "secrets.yaml"
    bundle.write_text(secrets_bundle.dump_secrets(secrets_bundle.generate_secrets(LINES[line])))
    run_oracle(line, "gen-config", "--with-secrets", str(bundle), "--talos-version", LINES[line],
               "--install-image", f"ghcr.io/siderolabs/installer:{LINES[line]}", "--with-docs=false",
               "--with-examples=false", "--output", str(tmp_path / "out"), "ours", "https://10.0.0.1:6443")
    assert (tmp_path / "out" / "worker.yaml").is_file()


# Our default Kubernetes version per line against what the oracle's machinery picks: the same for v1.14;
# for v1.12 and v1.13 ours are those of the releases each line was first built against (v1.12.0, v1.13.7),
# kept until moved on purpose (a new default rolls Kubernetes on every cluster that does not pin it).
KEPT_DEFAULTS = {"v1.12": ("1.35.0", "1.35.4"), "v1.13": ("1.36.2", "1.36.3")}


@pytest.mark.parametrize("line", sorted(LINES))
def test_default_kubernetes_version_is_the_lines_own(line):
    picked = json.loads(run_oracle(line, "version").stdout)["defaultKubernetesVersion"]
    assert (DEFAULT_KUBERNETES_VERSIONS[line], picked) == KEPT_DEFAULTS.get(line, (picked, picked))
