"""Where providers were pickled before the layout change, kept loadable from this one place.

The engine's dynamic-provider host unpickles each resource's provider by the module path it was pickled
under. Stacks deployed before the layout change hold four such paths that no longer exist as modules;
each is registered here as an alias of the providers' new home, when the `providers` package is first
imported (which unpickling any of them does first). A resource's provider is pickled again at its next
update, so these serve stacks until every resource of theirs has changed once.
"""

from __future__ import annotations

import importlib
import sys
import types

# old module path -> {class name: its module now}
OLD_PATHS = {
    "providers.dynamic_talos": {"MachineConfigurationProvider": "providers.machine_configuration",
                                "MachineSecretsProvider": "providers.secrets",
                                "TalosconfigProvider": "providers.talosconfig"},
    "providers.schematic_resource": {"SchematicProvider": "providers.schematic"},
    "providers.cluster_health_resource": {"ClusterHealthProvider": "providers.cluster_health"},
    "providers.talos_api.resources": {"BootstrapProvider": "providers.talos_operations",
                                      "ConfigurationApplyProvider": "providers.talos_operations",
                                      "KubeconfigProvider": "providers.talos_operations"},
}


class _OldPath(types.ModuleType):
    """A module at an old path whose names resolve, on first use, to the classes' new modules."""

    def __init__(self, name: str, names: dict[str, str]) -> None:
        super().__init__(name, f"providers pickled under {name} before the layout change")
        self._names = names

    def __getattr__(self, attribute: str):
        if attribute.startswith("__") or attribute not in self._names:
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self._names[attribute]), attribute)


def register() -> None:
    for old, names in OLD_PATHS.items():
        package, _, leaf = old.rpartition(".")
        if package != "providers" and package not in sys.modules:  # providers.talos_api: a package of its own
            sys.modules[package] = types.ModuleType(package, "an old package path (providers.pickled_paths)")
            sys.modules[package].__path__ = []
        sys.modules.setdefault(old, _OldPath(old, names))
        setattr(sys.modules[package], leaf, sys.modules[old])
