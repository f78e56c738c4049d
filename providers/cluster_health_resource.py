"""Import shim: stacks deployed before the layout change hold this provider pickled under this path."""

from providers.cluster_health import ClusterHealthProvider  # noqa: F401
