"""The pure core of the program: everything that decides, with no Pulumi in it.

| package | holds |
|---|---|
| settings | the stack file read into typed, validated settings; plain-text credential refusal |
| talos_config | the secrets bundle and PKI, machine-config rendering, patches and merge, the v1alpha1 schema, redaction, Talos's YAML, the talosconfig |
| image_factory | schematic ids, image URLs and the factory's HTTP API |
| talos_api | the Talos gRPC client: protos, generated stubs, mutual-TLS transport, operations |
| day_two | rolling upgrades, node removal, cluster health |
| cluster_plan | what each resource is made from: resource inputs, derived patches, Helm values |
| commands | the offline render command (`python -m talos_proxmox.commands.render`) |

Nothing here imports `pulumi` (tests/repository/test_layout.py checks it): the dynamic providers in providers/ and
the components in components/ call into this package, never the other way round.
"""
