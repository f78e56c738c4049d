"""A Talos Linux cluster on Proxmox VE: the stack's settings -> one TalosCluster -> its outputs.

Credentials and settings are checked before anything is registered: a bad stack file stops here
with every problem listed, and nothing touches Proxmox or a node.
"""

import pulumi
from pulumi.runtime import config as runtime_config

from components.cluster import TalosCluster
from talos_proxmox.settings.credentials import CredentialsError, ensure_no_plaintext_credentials, stack_config_from_runtime
from talos_proxmox.settings.stack import TOP_LEVEL_KEYS, SettingsError, load_settings

try:
    # A Proxmox token or password in plain stack config is a leaked credential: refuse before anything runs.
    ensure_no_plaintext_credentials(
        stack_config_from_runtime(runtime_config.CONFIG.get(), runtime_config.is_config_secret))
    config = pulumi.Config()
    settings = load_settings({key: config.get_object(key) for key in TOP_LEVEL_KEYS})
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
