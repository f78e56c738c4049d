"""The `engine` tier: the real Pulumi CLI runs the real program against stand-ins.

Real: the Pulumi CLI and its engine (steps, replacements, protect, parallel deletes, cancellation), the
Python language host and executor, the Python dynamic-provider host with our providers, the Proxmox
provider plugin (pulumi-resource-proxmoxve, bridging bpg's Terraform provider), all built by
scripts/tools.sh at the versions the pinned SDKs ask for. Stand-ins, each its own server on loopback and
speaking the real protocol: the PVE JSON API (tests/stand_ins/proxmox_ve.py), the Talos API over mutual TLS, the
Image Factory's HTTP API.
"""
