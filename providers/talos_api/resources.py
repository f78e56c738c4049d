"""Import shim: stacks deployed before the layout change hold these providers pickled under this path."""

from providers.talos_operations import BootstrapProvider, ConfigurationApplyProvider, KubeconfigProvider  # noqa: F401
