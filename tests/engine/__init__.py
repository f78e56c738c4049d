"""The `engine` tier: the real Pulumi CLI runs the real program against stand-ins.

Real: the Pulumi CLI and its engine (steps, replacements, protect, parallel deletes, cancellation), the
Python language host and executor, the Python dynamic-provider host with our providers, the Talos API
over mutual TLS, the Image Factory's HTTP API and the PVE JSON API (fakepve), each as its own process or
server. A stand-in: the Proxmox provider plugin (`proxmox_provider.py`), because the module proxy serves
neither pulumi-proxmoxve's provider nor bpg's Terraform provider (scripts/tool-versions.env); it makes
the PVE calls bpg's provider makes for what the program uses, with its replacement rules.
"""
