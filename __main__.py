"""A Talos Linux cluster on Proxmox VE: the stack's settings -> one TalosCluster -> its outputs.

The whole stack config is checked before anything is registered (talos_proxmox/settings/stack_config.py):
a bad stack stops here with every problem listed, one line each, and nothing touches Proxmox or a node.
"""

from pathlib import Path

import pulumi
from pulumi.runtime import config as runtime_config

from components.cluster import TalosCluster
from talos_proxmox.settings.credentials import CredentialsError
from talos_proxmox.settings.model import SettingsError
from talos_proxmox.settings.stack_config import StackConfig, load_stack

try:
    settings = load_stack(StackConfig.from_runtime(runtime_config.CONFIG.get(), runtime_config.is_config_secret),
                          base_dir=Path(__file__).resolve().parent)
except (CredentialsError, SettingsError) as err:
    # RunError: Pulumi prints the message alone; a stack trace would only bury which keys to fix.
    raise pulumi.RunError(str(err)) from None
for warning in settings.warnings:
    pulumi.log.warn(warning)

cluster = TalosCluster(settings.cluster.name, settings)

pulumi.export("endpoint", cluster.endpoint)
pulumi.export("nodeIps", cluster.node_ips)
pulumi.export("schematicId", cluster.schematic_id)
pulumi.export("installerImage", cluster.installer_image)
pulumi.export("talosconfig", cluster.talosconfig)
pulumi.export("kubeconfig", cluster.kubeconfig)
pulumi.export("hubbleUiAddress", cluster.addons.hubble_ui_address)  # null when the Hubble UI is off
