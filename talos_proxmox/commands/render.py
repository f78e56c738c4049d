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
from typing import Callable, Optional, Sequence

import yaml

from talos_proxmox.cluster_plan import addon_values, storage_values
from talos_proxmox.image_factory import images
from talos_proxmox.talos_config import machine_config, client_config, secrets_bundle
from talos_proxmox.cluster_plan.resource_inputs import image_facts, machine_config_inputs, talosconfig_inputs
from talos_proxmox.settings.credentials import CredentialsError
from talos_proxmox.settings.model import Settings, SettingsError
from talos_proxmox.settings.stack_config import StackConfig, load_stack

REPO = Path(__file__).resolve().parents[2]
SECRETS_FILE = "secrets.yaml"
TALOSCONFIG_FILE = "talosconfig"
SCHEMATIC_FILE = "schematic.yaml"
SCHEMATIC_ID_FILE = "schematic-id"
CILIUM_VALUES_FILE = "cilium-values.yaml"
CILIUM_LOAD_BALANCER_FILE = "cilium-load-balancer.yaml"
CCM_VALUES_FILE = "talos-ccm-values.yaml"
CSI_VALUES_FILE = "proxmox-csi-values.yaml"
PROXMOX_CCM_VALUES_FILE = "proxmox-ccm-values.yaml"
# (settings.stack.RENDER_OUTPUT_FILES lists these, so no node is named like one of them.)
# Which stack an output directory was rendered for: its secrets.yaml is that cluster's identity.
STACK_MARKER = ".talos-proxmox-stack"


class RenderRefused(Exception):
    """A one-line reason the command writes nothing."""


# ---------------------------------------------------------------- the command


def _write(path: Path, text: str) -> None:
    """Write `text` readable by the owner only: machine configs and the talosconfig carry keys."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o600)  # also when the file existed with wider permissions


def check_out_dir(out: Path, stack: str) -> None:
    """Refuse an --out that is not a directory we may write, or that holds another stack's secrets bundle."""
    if out.exists() and not out.is_dir():
        raise RenderRefused(f"--out {out}: is a file (expected a directory)")
    existing = out if out.exists() else next((p for p in out.parents if p.exists()), Path("/"))
    if not existing.is_dir():
        raise RenderRefused(f"--out {out}: {existing} is a file (expected a directory)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RenderRefused(f"--out {out}: {existing} is not writable")
    marker = out / STACK_MARKER
    owner = marker.read_text(encoding="utf-8").strip() if marker.is_file() else None
    if owner is not None and owner != stack:
        raise RenderRefused(f"--out {out}: holds the files and secrets bundle of stack {owner!r} (expected an "
                            f"empty directory or one rendered for {stack!r}, e.g. --out out/{stack})")
    if owner is None and (out / SECRETS_FILE).exists():
        raise RenderRefused(f"--out {out}: holds a {SECRETS_FILE} not rendered for stack {stack!r} (to use that "
                            f"bundle, pass --secrets {out / SECRETS_FILE} with another --out)")


def stack_bundle(settings: Settings, out: Path, secrets_file: Optional[str]) -> tuple[dict, Optional[str], str]:
    """The bundle to render with, its text when it must be written to out/secrets.yaml, and where it came from.

    `--secrets FILE` (or the stack's cluster.secretsFile, already validated and resolved) is read and never
    written; otherwise out/secrets.yaml is reused when present and generated once when not.
    """
    source = secrets_file or settings.cluster.secrets_file
    if source:
        return secrets_bundle.load_secrets_file(source), None, f"secrets bundle read from {source}"
    path = out / SECRETS_FILE
    if path.exists():
        return secrets_bundle.load_secrets_file(str(path)), None, f"secrets bundle reused from {path}"
    bundle = secrets_bundle.generate_secrets(settings.cluster.talos_version)
    return bundle, secrets_bundle.dump_secrets(bundle), "generated (keep it: it is the cluster's identity)"


def helm_values(settings: Settings) -> dict[str, dict]:
    """File name -> Helm values for each enabled add-on, from the functions the add-on component uses."""
    values: dict[str, dict] = {}
    if settings.cilium.enabled:
        values[CILIUM_VALUES_FILE] = addon_values.cilium_values(settings)
    if settings.ccm.enabled:
        values[CCM_VALUES_FILE] = addon_values.ccm_values(settings)
    if settings.csi.enabled:  # no token in them: the plugins read theirs from a Secret of the program's
        values[CSI_VALUES_FILE] = storage_values.csi_values(settings)
        if settings.csi.topology_labels == "proxmox-ccm":
            values[PROXMOX_CCM_VALUES_FILE] = storage_values.proxmox_ccm_values(settings)
    return values


def rendered_files(settings: Settings, bundle: dict) -> list[tuple[str, str, str]]:
    """(file name, text, what it is) for every file but the bundle, all rendered before one is written."""
    image = image_facts(settings)
    files = [
        (SCHEMATIC_FILE, image.schematic_yaml, f"schematic {image.schematic_id}, ISO {image.iso_url}"),
        (SCHEMATIC_ID_FILE, image.schematic_id + "\n", f"installer {image.installer_image}"),
    ]
    for node in settings.nodes:
        text = machine_config.render(bundle, **machine_config_inputs(settings, node, image.installer_image))
        files.append((f"{node.name}.yaml", text, f"{node.role} {node.ip}"))
    files.append((TALOSCONFIG_FILE, client_config.talosconfig(bundle, **talosconfig_inputs(settings)),
                  f"talosctl context {settings.cluster.name}"))
    for name, values in helm_values(settings).items():
        files.append((name, yaml.safe_dump(values, sort_keys=False), "Helm values"))
    manifests = addon_values.cilium_load_balancer_manifests(settings) if settings.cilium.enabled else []
    service = addon_values.hubble_ui_load_balancer_service(settings)
    if manifests:
        text = yaml.safe_dump_all([*manifests, *([service] if service else [])], sort_keys=False)
        files.append((CILIUM_LOAD_BALANCER_FILE, text, "LB-IPAM pool and L2 policy (apply after Cilium)"))
    return files


def render_stack(settings: Settings, out: Path, stack: str, secrets_file: Optional[str] = None,
                 echo: Callable[[str], None] = print) -> None:
    """Write every file for the stack into `out`, echoing each as it is written."""
    check_out_dir(out, stack)
    bundle, bundle_text, secrets_note = stack_bundle(settings, out, secrets_file)
    files = rendered_files(settings, bundle)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    _write(out / STACK_MARKER, stack + "\n")
    if bundle_text is not None:
        _write(out / SECRETS_FILE, bundle_text)
        echo(f"wrote {out / SECRETS_FILE}: {secrets_note}")
    else:
        echo(secrets_note)
    for name, text, what in files:
        _write(out / name, text)
        echo(f"wrote {out / name}: {what}")
    first = settings.bootstrap_node
    echo("next: review the files; to deploy with Pulumi run `pulumi preview --diff --stack "
         f"{stack}`, or by hand: `talosctl apply-config --insecure -n <ip> --file {out}/<node>.yaml` for each "
         f"node, then `talosctl --talosconfig {out / TALOSCONFIG_FILE} bootstrap -n {first.ip}`")


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
    stacks_dir = Path(args.stacks_dir)
    stack_path = stacks_dir / f"Pulumi.{args.stack}.yaml"
    if not stack_path.is_file():
        known = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in stacks_dir.glob("Pulumi.*.yaml"))
        print(f"error: --stack {args.stack!r}: {stack_path} does not exist (stacks: {', '.join(known) or 'none'})",
              file=sys.stderr)
        return 2
    try:
        settings = load_stack(StackConfig.from_file(str(stack_path)), base_dir=REPO)
        for warning in settings.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        render_stack(settings, Path(args.out), args.stack, args.secrets)
    except (SettingsError, CredentialsError, secrets_bundle.SecretsBundleError, machine_config.MachineConfigError,
            images.SchematicError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except RenderRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: --out {args.out}: {exc.strerror} ({exc.filename})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
