"""Import shim: stacks deployed before the layout change hold this provider pickled under this path."""

from providers.schematic import SchematicProvider  # noqa: F401
