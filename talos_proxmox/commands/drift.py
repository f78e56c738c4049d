"""`python -m talos_proxmox.commands.drift --stack <name> --secrets FILE`: look before you run anything.

Reads every node of the stack as `pulumi preview --refresh` does (talos_proxmox.day_two.drift) and prints
the same per-node report, secrets masked, without Pulumi: the config each node runs against the one the
stack renders, its Talos version against the stack's, maintenance mode, etcd membership, reachability.
The secrets bundle renders the configs and issues the client certificate the nodes are read with (or give
`--talosconfig`, e.g. `pulumi stack output talosconfig --show-secrets`). Read-only: it never applies.
Exit status: 0 no drift, 3 drift found, 1 a node could not be read or the stack is bad, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from talos_proxmox.cluster_plan.resource_inputs import image_facts, machine_config_inputs, talosconfig_inputs
from talos_proxmox.day_two import drift
from talos_proxmox.settings.credentials import CredentialsError
from talos_proxmox.settings.model import Settings, SettingsError
from talos_proxmox.settings.stack_config import StackConfig, load_stack
from talos_proxmox.talos_config import client_config, machine_config, secrets_bundle

REPO = Path(__file__).resolve().parents[2]
NO_DRIFT, DRIFT, UNREADABLE = 0, 3, 1


def report(settings: Settings, bundle: dict, talosconfig: str, echo: Callable[[str], None] = print) -> int:
    """Print each node's findings; the exit status they add up to."""
    installer = image_facts(settings).installer_image
    status = NO_DRIFT
    for node in settings.nodes:
        name = f"node {node.name}"
        wanted = machine_config.render(bundle, **machine_config_inputs(settings, node, installer))
        reading = drift.read_node(node.ip, talosconfig)
        if reading.state == drift.UNREACHABLE:
            echo(f"{name}: unreachable ({reading.detail})")
            status = UNREADABLE if status == NO_DRIFT else status
            continue
        if reading.state == drift.MAINTENANCE:
            echo(f"{name}: in maintenance mode; `pulumi up --refresh` applies its config again")
            status = DRIFT
            continue
        found = [] if drift.same_configuration(wanted, reading.running_config) else \
            drift.drift_report(name, wanted, reading.running_config)
        state = drift.read_node_state(node.ip, node.name, talosconfig, control_plane=node.role == "controlplane")
        version = drift.version_drift(name, state.talos_version, settings.cluster.talos_version)
        found += [version] if version else []
        found += [drift.missing_member(name)] if state.etcd_member is False else []
        for line in found or [f"{name}: as the stack says"]:
            echo(line)
        if found:
            status = DRIFT
    return status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m talos_proxmox.commands.drift", description=__doc__.split("\n\n")[1])
    parser.add_argument("--stack", required=True, help="stack name: reads stacks/Pulumi.<stack>.yaml")
    parser.add_argument("--secrets", metavar="FILE", help="the cluster's secrets bundle (else cluster.secretsFile)")
    parser.add_argument("--talosconfig", metavar="FILE", help="a talosconfig to read the nodes with (default: one "
                                                              "issued from the bundle, kept in memory)")
    parser.add_argument("--stacks-dir", default=str(REPO / "stacks"), help=argparse.SUPPRESS)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    stack_path = Path(args.stacks_dir) / f"Pulumi.{args.stack}.yaml"
    if not stack_path.is_file():
        print(f"error: --stack {args.stack!r}: {stack_path} does not exist", file=sys.stderr)
        return 2
    try:
        settings = load_stack(StackConfig.from_file(str(stack_path)), base_dir=REPO)
        secrets_file = args.secrets or settings.cluster.secrets_file
        if not secrets_file:
            print("error: --secrets FILE is needed (or cluster.secretsFile in the stack): the bundle renders what "
                  "the stack applies", file=sys.stderr)
            return 2
        bundle = secrets_bundle.load_secrets_file(secrets_file)
        talosconfig = Path(args.talosconfig).read_text() if args.talosconfig else \
            client_config.talosconfig(bundle, **talosconfig_inputs(settings))
        return report(settings, bundle, talosconfig)
    except (SettingsError, CredentialsError, secrets_bundle.SecretsBundleError, machine_config.MachineConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc.strerror} ({exc.filename})", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
