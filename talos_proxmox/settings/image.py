"""The `image` section: the Image Factory, platform, architecture, secure boot and the schematic. No Pulumi here."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from talos_proxmox.settings.model import ImageSettings
from talos_proxmox.settings.values import _Reader, _bool, _one_of, _url_text


_EXTENSION = re.compile(r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$")  # siderolabs/qemu-guest-agent


def _read_image(r: _Reader, raw: Any) -> ImageSettings:
    s = r.section(raw, "image", ("factoryUrl", "platform", "arch", "secureBoot", "schematic"))
    return ImageSettings(
        factory_url=r.value(s, "factoryUrl", "image.factoryUrl", _http_base_url,
                            "is not an http(s) URL with no query or fragment (expected e.g. https://factory.talos.dev)",
                            default="https://factory.talos.dev"),
        platform=r.value(s, "platform", "image.platform", _one_of("metal", "nocloud"),
                         "is not a supported platform (expected metal or nocloud)", default="metal"),
        # The VMs the program creates are x86-64 (QEMU's default machine): an arm64 image cannot boot there.
        arch=r.value(s, "arch", "image.arch", _one_of("amd64"),
                     "is not a supported architecture (expected amd64: the program creates x86-64 Proxmox VMs)",
                     default="amd64"),
        secure_boot=r.value(s, "secureBoot", "image.secureBoot", _bool, "is not true or false", default=False),
        schematic=_read_schematic(r, s.get("schematic")),
    )


def _read_schematic(r: _Reader, raw: Any) -> dict:
    """The Image Factory's own rules, so a typo fails here rather than at the factory."""
    from talos_proxmox.image_factory.images import SchematicError, canonical_schematic

    if raw is None:
        return {"customization": {}}
    try:
        canonical = canonical_schematic(raw)
    except SchematicError as err:
        # The error names the schematic key; quoting the whole schematic would bury it.
        r.report("image.schematic", f"is not a schematic the Image Factory takes: {err}")
        return {"customization": {}}
    extensions = canonical.get("customization", {}).get("systemExtensions", {}).get("officialExtensions", [])
    for i, name in enumerate(extensions):
        if not _EXTENSION.match(name):
            r.fail(f"image.schematic.customization.systemExtensions.officialExtensions[{i}]", name,
                   "is not an extension name (expected owner/name, e.g. siderolabs/qemu-guest-agent)")
    return dict(raw)


def _http_base_url(v: Any) -> str:
    parts = urlsplit(_url_text(v))
    # A query or fragment: the image layer builds paths onto the URL and refuses one (images.iso_url).
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment \
            or v.endswith(("?", "#")):
        raise ValueError
    return v.rstrip("/")
