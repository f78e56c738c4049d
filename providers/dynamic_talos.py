"""Import shim: stacks deployed before the layout change hold these providers pickled under this path."""

from providers.machine_configuration import MachineConfigurationProvider  # noqa: F401
from providers.secrets import MachineSecretsProvider  # noqa: F401
from providers.talosconfig import TalosconfigProvider  # noqa: F401
