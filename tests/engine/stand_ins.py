"""The far side of the engine tier: Image Factory, Proxmox VE and one Talos node per VM, as network servers.

Everything a `pulumi up` reaches runs here, in the test's process, on loopback: the factory stand-in
(HTTP), fakepve (the PVE JSON API over HTTPS, with the stack's API token) and a FakeTalosNode for each
node at its stack address, 127.0.0.x:50000. A node is powered off until the PVE stand-in starts the VM
named after it; then it boots the ISO (maintenance mode) and answers the first, insecure apply, as on a
real host. The control planes share one etcd member list and the cluster one Kubernetes API stand-in
(tests/e2e_engine.py's StandInCluster, whose wiring this reuses).
"""

from __future__ import annotations

import contextlib
import errno
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from talos_proxmox.talos_config import secrets_bundle
from tests.e2e_engine import StandInCluster, e2e_config, rendered_configs
from tests.engine.pulumi_cli import CliRun, PulumiProject, missing_tools
from tests.factory_stand_in import StandInFactory
from tests.pve_stand_in import ProxmoxStandIn, serve_proxmox
from tests.talos_api_server import RecordedCall

STACK = "engine"


@dataclass
class EngineUp:
    """One `pulumi preview` then `pulumi up` of a stack file: what each printed, the stand-ins' request
    counts after the preview, what each node had received by the end, the stack's outputs (`secret_outputs`:
    the names `pulumi stack output` masks), its state (`pulumi stack export`, secrets encrypted) and what
    the render command writes for each node. A preview that fails is where a user's `pulumi up` stops:
    then `up` is that preview and `stopped_in_preview` is set."""

    preview: CliRun
    up: CliRun
    after_preview: dict[str, int]
    calls: dict[str, list[RecordedCall]]
    modes: dict[str, str]
    outputs: dict
    secret_outputs: set[str]
    rendered: dict[str, bytes]
    config: dict
    state: dict
    pve_requests: int
    stopped_in_preview: bool = False
    ended: float = 0.0  # time.monotonic() when this up (or its failed preview) was done

    def steps(self, op: str) -> set[str]:
        return {name for name, step_op in self.up.steps().items() if step_op == op}

    @property
    def error(self) -> str:
        """What the CLI printed as errors (the engine's error diagnostics and its closing lines)."""
        return "".join(self.up.diagnostics("error")) + self.up.stderr

    def resource(self, name: str) -> dict:
        """The state of the custom resource named `name` (inputs, outputs), as `pulumi stack export` has it."""
        [found] = [r for r in self.state["deployment"]["resources"]
                   if r.get("custom") and r["urn"].endswith(f"::{name}") and "pulumi:providers:" not in r["urn"]]
        return found

    def new_calls(self, before: "EngineUp", name: str) -> list[RecordedCall]:
        """What node `name` received during this up (its preview included) and not by the end of `before`."""
        return self.calls[name][len(before.calls.get(name, [])):]


class EngineCluster(StandInCluster):
    """StandInCluster for the real engine: no in-process monitor; nodes start powered off and run in the
    VMs the Proxmox provider makes through the PVE API; trustd signs with the adopted bundle's OS CA."""

    def __init__(self, factory: StandInFactory, pve: ProxmoxStandIn, nodes, talos_version: str, bundle: dict,
                 install_seconds: float = 0.2) -> None:
        self.bundle = bundle
        super().__init__(factory, pve, nodes, talos_version, render_dir=lambda: Path("/nonexistent"),
                         install_seconds=install_seconds)
        for fake in self.nodes.values():
            fake.go_down()
        pve.guest_named = self.nodes.get

    def _trustd(self) -> tuple[bytes, bytes]:
        return secrets_bundle.ca_pair(self.bundle, "os")

    def deploy(self, project: PulumiProject, config: dict, render_dir: Path, *, fails: bool = False) -> EngineUp:
        """Write `config` into the stack file, `pulumi preview`, then `pulumi up` (which must fail if
        `fails`, else succeed)."""
        project.set_config(config)
        preview = project.preview(check=not fails)
        after_preview = self.counts()
        stopped = preview.returncode != 0
        up = preview if stopped else project.up(check=not fails)
        assert not fails or up.returncode != 0, "expected this up to fail"
        outputs = json.loads(project.cli("stack", "output", "--json", "--show-secrets", "--stack", project.stack).stdout)
        shown = json.loads(project.cli("stack", "output", "--json", "--stack", project.stack).stdout)
        render_dir.mkdir(parents=True)
        rendered = {} if stopped else rendered_configs(config, secrets_bundle.dump_secrets(self.bundle), render_dir)
        return EngineUp(preview, up, after_preview, {n: list(f.calls) for n, f in self.nodes.items()},
                        {n: f.mode for n, f in self.nodes.items()}, outputs,
                        {key for key, value in shown.items() if value == "[secret]"}, rendered, config,
                        project.export(), len(self.pve.requests), stopped_in_preview=stopped, ended=time.monotonic())


def engine_stack(cluster: EngineCluster, nodes, talos_version: str, secrets_file: Path, **options) -> dict:
    """The dev stack on loopback (tests/e2e_engine.py's e2e_config) adopting `secrets_file`, with Cilium
    and the CCM off: no Kubernetes provider plugin can be built here at the pinned version (issue #18)."""
    config = e2e_config(cluster.factory.url, nodes, talos_version, **options)
    config["cluster"]["secretsFile"] = str(secrets_file)
    config["cilium"] = {"enabled": False}
    config["ccm"] = {"enabled": False}
    return config


@contextlib.contextmanager
def engine_cluster(tmp_path: Path, nodes, talos_version: str, install_seconds: float = 0.2,
                   **options) -> Iterator[tuple[EngineCluster, PulumiProject]]:
    """Stand-ins for `nodes` [(name, role, ip)] and a stack of the program on them, initialised (stack
    file, Proxmox endpoint, the API token as a secret) but not yet deployed. `install_seconds`: how long
    each node takes from its first apply to answering configured."""
    missing = missing_tools()
    if missing:
        pytest.fail(f"the engine tier needs {', '.join(missing)} in .tools/bin: run `bash scripts/tools.sh`")
    bundle = secrets_bundle.generate_secrets(talos_version)
    secrets_file = tmp_path / "secrets.yaml"
    secrets_file.write_text(secrets_bundle.dump_secrets(bundle))
    secrets_file.chmod(0o600)
    with StandInFactory() as factory, serve_proxmox() as pve:
        try:
            cluster = EngineCluster(factory, pve, nodes, talos_version, bundle, install_seconds)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                pytest.skip(f"cannot listen on 127.0.0.x here ({exc})")
            raise
        try:
            project = PulumiProject(tmp_path / "pulumi", STACK)
            endpoint = pve.provider_config()
            config = engine_stack(cluster, nodes, talos_version, secrets_file, **options)
            for host in {config["proxmox"]["node"], *(node.get("proxmoxNode") for node in config["nodes"])} - {None}:
                pve.add_node(host)  # the Proxmox cluster's members
            project.init(config,
                         other={"proxmoxve:endpoint": endpoint["proxmoxve:endpoint"], "proxmoxve:insecure": "true"},
                         secrets={"proxmoxve:apiToken": endpoint["proxmoxve:apiToken"]})
            yield cluster, project
        finally:
            cluster.stop()


def secret_texts(cluster: EngineCluster) -> list[str]:
    """Strings that must never appear in anything the CLI prints: the bundle's secrets and the API token."""
    token = cluster.pve.provider_config()["proxmoxve:apiToken"].split("=", 1)[1]
    return [*secrets_bundle.secret_strings(cluster.bundle), token]
