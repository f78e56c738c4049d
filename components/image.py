"""`TalosImage`: the schematic registered with the Image Factory and its ISO downloaded into Proxmox."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi_proxmoxve as proxmoxve

from talos_proxmox.image_factory.images import (
    DEFAULT_FACTORY_URL,
    DEFAULT_TIMEOUT_SECONDS,
    iso_file_name,
    iso_url as factory_iso_url,
    normalize_version,
    schematic_id,
)
from providers.schematic import Schematic

# The factory builds an ISO on its first request, which can take minutes; Proxmox waits this long.
ISO_DOWNLOAD_TIMEOUT_SECONDS = 1800


def proxmox_iso_name(cluster: str, sid: str, talos_version: str, platform: str, arch: str, secure_boot: bool) -> str:
    """A datastore file name unique per cluster, schematic and version: a new image never overwrites one in
    use, and no other cluster's stack ever holds a file of that name."""
    return f"talos-{cluster}-{sid[:12]}-{normalize_version(talos_version)}-{iso_file_name(platform, arch, secure_boot)}"


class TalosImage(pulumi.ComponentResource):
    """Registers the schematic and has Proxmox fetch the factory ISO into `iso_datastore` on each of
    `proxmox_nodes` (the first is the stack's own Proxmox node; with a shared datastore it is the only one).

    `after`: what the downloads wait for (the cluster's node-change and privilege check).
    `iso_file_ids[host]` (e.g. `local:iso/talos-dev-e142ceb080fb-v1.13.7-metal-amd64.iso`) is what a VM on that
    host takes for its CD-ROM; `iso_file_id` is the first host's; `installer_image` goes into
    `machine.install.image`.
    """

    iso_file_id: pulumi.Output[str]
    iso_file_ids: dict[str, pulumi.Output[str]]
    installer_image: pulumi.Output[str]
    schematic_id: pulumi.Output[str]
    iso_url: pulumi.Output[str]

    def __init__(self, name: str, schematic: Mapping[str, Any], talos_version: str, *, cluster: str,
                 factory_url: str = DEFAULT_FACTORY_URL, platform: str = "metal", arch: str = "amd64",
                 secure_boot: bool = False, proxmox_nodes: Sequence[str], iso_datastore: str = "local",
                 factory_timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 download_timeout: int = ISO_DOWNLOAD_TIMEOUT_SECONDS, after: Sequence[pulumi.Resource] = (),
                 opts: Optional[pulumi.ResourceOptions] = None):
        # Validate every setting before registering anything, so a bad stack leaves no half-made tree.
        sid = schematic_id(schematic)
        factory_iso_url(factory_url, sid, talos_version, platform, arch, secure_boot)
        file_name = proxmox_iso_name(cluster, sid, talos_version, platform, arch, secure_boot)

        super().__init__("talos-proxmox:index:TalosImage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        self.schematic = Schematic(
            f"{name}-schematic", schematic, talos_version, factory_url=factory_url, platform=platform,
            arch=arch, secure_boot=secure_boot, timeout=factory_timeout, opts=child)

        # The name pins cluster, schematic and version. The provider deletes and downloads again a file of
        # that name it does not manage (overwrite_unmanaged): with the cluster in the name that can only be
        # this cluster's own copy (one a lost state left behind), never another stack's ISO its VMs boot.
        # Kept when this stack lets go of it (retain_on_delete): a VM not yet moved to the new one may boot it.
        self.isos = {
            host: proxmoxve.download.File(
                f"{name}-iso" if index == 0 else f"{name}-iso-{host}",
                content_type="iso",
                datastore_id=iso_datastore,
                node_name=host,
                url=self.schematic.iso_url,
                file_name=file_name,
                overwrite=False,
                overwrite_unmanaged=True,
                upload_timeout=download_timeout,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.schematic, *after], retain_on_delete=True))
            for index, host in enumerate(dict.fromkeys(proxmox_nodes))}
        self.iso = next(iter(self.isos.values()))
        self.iso_file_ids = {host: iso.id for host, iso in self.isos.items()}
        self.iso_file_id = self.iso.id
        self.iso_url = self.schematic.iso_url
        self.installer_image = self.schematic.installer_image
        self.schematic_id = self.schematic.schematic_id
        self.register_outputs({
            "iso_file_id": self.iso_file_id,
            "iso_url": self.iso_url,
            "installer_image": self.installer_image,
            "schematic_id": self.schematic_id,
        })
