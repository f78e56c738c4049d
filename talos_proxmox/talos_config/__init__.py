"""Talos machine configuration: secrets bundle, PKI, rendering with patches, merge rules, the v1alpha1 schema, secret redaction, Talos's YAML, and the talosconfig."""
