"""Render a stack's files offline: what `pulumi up` would send, without Pulumi, Proxmox or a node.

    python -m talos_proxmox.commands.render --stack test-cluster --out out/

What each file is rendered from comes from talos_proxmox/cluster_plan/resource_inputs.py, which the Pulumi components
use too, so the files written here are the ones the program applies (given the same secrets bundle).
No Pulumi import.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

import yaml

from talos_proxmox.cluster_plan import addon_values

from talos_proxmox.image_factory import images

from talos_proxmox.talos_config import machine_config, client_config, secrets_bundle
from talos_proxmox.cluster_plan.resource_inputs import image_facts, machine_config_inputs, talosconfig_inputs
from talos_proxmox.settings.stack import Settings, SettingsError, load_settings, stack_file_config

REPO = Path(__file__).resolve().parents[2]
SECRETS_FILE_NAME = "secrets.yaml"


# ---------------------------------------------------------------- the command


def _write(path: Path, text: str) -> None:
    """Write `text` readable by the owner only: machine configs and the talosconfig carry keys."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o600)  # also when the file existed with wider permissions


def stack_bundle(settings: Settings, out: Path, secrets_file: Optional[str]) -> tuple[dict, str]:
    """The bundle to render with, and a sentence saying where it came from.

    `--secrets FILE` (or the stack's cluster.secretsFile) is read and never written; otherwise
    out/secrets.yaml is reused when present and generated once when not.
    """
    source = secrets_file or settings.cluster.secrets_file
    if source:
        path = Path(source)
        if not path.is_absolute() and not path.exists():
            path = REPO / path
        return secrets_bundle.load_secrets_file(str(path)), f"secrets bundle read from {path}"
    path = out / SECRETS_FILE_NAME
    if path.exists():
        return secrets_bundle.load_secrets_file(str(path)), f"secrets bundle reused from {path}"
    bundle = secrets_bundle.generate_secrets(settings.cluster.talos_version)
    _write(path, secrets_bundle.dump_secrets(bundle))
    return bundle, f"secrets bundle generated into {path} (keep it: it is the cluster's identity)"


def helm_values(settings: Settings) -> dict[str, dict]:
    """File name -> Helm values for each enabled add-on, from the functions the add-on component uses."""
    values: dict[str, dict] = {}
    if settings.cilium.enabled:
        values["cilium-values.yaml"] = addon_values.cilium_values(settings)
    if settings.ccm.enabled:
        values["talos-ccm-values.yaml"] = addon_values.ccm_values(settings)
    return values


def render_stack(settings: Settings, out: Path, secrets_file: Optional[str] = None) -> list[str]:
    """Write every file for the stack into `out`; return what was written, one line each."""
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    bundle, secrets_note = stack_bundle(settings, out, secrets_file)
    written = [secrets_note]
    image = image_facts(settings)
    _write(out / "schematic.yaml", image.schematic_yaml)
    _write(out / "schematic-id", image.schematic_id + "\n")
    written.append(f"{out / 'schematic.yaml'}: schematic {image.schematic_id}")
    written.append(f"  ISO {image.iso_url}")
    written.append(f"  installer {image.installer_image}")
    for node in settings.nodes:
        text = machine_config.render(bundle, **machine_config_inputs(settings, node, image.installer_image))
        _write(out / f"{node.name}.yaml", text)
        written.append(f"{out / (node.name + '.yaml')}: {node.role} {node.ip}")
    _write(out / "talosconfig", client_config.talosconfig(bundle, **talosconfig_inputs(settings)))
    written.append(f"{out / 'talosconfig'}")
    for name, values in helm_values(settings).items():
        _write(out / name, yaml.safe_dump(values, sort_keys=False))
        written.append(f"{out / name}")
    return written


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m talos_proxmox.commands.render",
        description=(
            "Write what `pulumi up` would send for a stack, without Pulumi, Proxmox or a Talos node: "
            "every node's machine config (<out>/<node>.yaml), the talosconfig, the Image Factory "
            "schematic (schematic.yaml, schematic-id) and the Helm values of Cilium and the Talos CCM. "
            "Review them, or apply them by hand with `talosctl apply-config --insecure -n <ip> "
            "--file <out>/<node>.yaml`. Files are written readable by the owner only (0600)."),
        epilog=(
            "Secrets bundle: with --secrets FILE (or cluster.secretsFile in the stack) that bundle is used "
            "and never written. Without it, <out>/secrets.yaml is reused if it exists and generated there "
            "once if it does not, so re-running gives the same configs. Configs rendered from a different "
            "bundle than the stack's are a different cluster."),
    )
    parser.add_argument("--stack", required=True, help="stack name: reads stacks/Pulumi.<stack>.yaml")
    parser.add_argument("--out", required=True, help="directory to write into (created if missing)")
    parser.add_argument("--secrets", metavar="FILE", help="an existing secrets bundle (talosctl gen secrets format)")
    parser.add_argument("--stacks-dir", default=str(REPO / "stacks"), help=argparse.SUPPRESS)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    stack_path = Path(args.stacks_dir) / f"Pulumi.{args.stack}.yaml"
    if not stack_path.exists():
        print(f"error: --stack {args.stack!r}: {stack_path} does not exist", file=sys.stderr)
        return 2
    try:
        settings = load_settings(stack_file_config(str(stack_path)))
        for warning in settings.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        for line in render_stack(settings, Path(args.out), args.secrets):
            print(line)
    except (SettingsError, secrets_bundle.SecretsBundleError, machine_config.MachineConfigError,
            images.SchematicError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
