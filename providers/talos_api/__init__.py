"""Import shims for providers pickled under providers.talos_api before the layout change."""
