"""The `image` section: the Image Factory, platform, architecture, secure boot and the schematic. No Pulumi here."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from talos_proxmox.settings.model import DEFAULT_TALOS_VERSION, ImageSettings
from talos_proxmox.settings.values import _Reader, _bool, _one_of, _url_text


_EXTENSION = re.compile(r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$")  # siderolabs/qemu-guest-agent


def _read_image(r: _Reader, raw: Any) -> ImageSettings:
    s = r.section(raw, "image", ("factoryUrl", "platform", "arch", "secureBoot", "schematic"))
    factory_url = r.value(s, "factoryUrl", "image.factoryUrl", _http_base_url,
                          "is not an http(s) URL with no query or fragment (expected e.g. https://factory.talos.dev)",
                          default="https://factory.talos.dev")
    if factory_url is not None and not _names_an_image(factory_url):
        r.fail("image.factoryUrl", s.get("factoryUrl"), "does not name a container registry the installer image can "
                                                        "be pulled from (expected a host with a '.' or a port, and a "
                                                        "lowercase path, e.g. https://factory.talos.dev)")
    return ImageSettings(
        factory_url=factory_url,
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
    # A port that is no number, or out of range, raises ValueError here; urllib raises http.client.InvalidURL
    # when the Schematic resource registers the schematic (a traceback mid-up), and 0 reaches no server.
    if parts.port == 0:
        raise ValueError
    return v.rstrip("/")


# An image reference as containerd parses it (distribution/reference): the host as a domain (DNS labels, or an
# IPv6 address in brackets) with an optional port, then lowercase path components, then the tag.
_DOMAIN_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REFERENCE = re.compile(rf"^(?:{_DOMAIN_LABEL}(?:\.{_DOMAIN_LABEL})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
                              rf"(?:/{_PATH_COMPONENT})+:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}$")


def _names_an_image(factory_url: str) -> bool:
    """Whether the installer image the image layer makes of the factory URL (`<host>[:port][/path]/installer/
    <id>:<version>`) is a reference Talos can pull: one containerd would read with that host as its registry
    (a first component with no '.' or ':' is read as a Docker Hub path) and a name of at most 255 characters."""
    from talos_proxmox.image_factory.images import installer_image

    reference = installer_image(factory_url, "0" * 64, DEFAULT_TALOS_VERSION)
    registry = reference.split("/", 1)[0]
    return _IMAGE_REFERENCE.match(reference) is not None and len(reference.rsplit(":", 1)[0]) <= 255 and \
        (any(c in registry for c in ".:") or registry == "localhost" or registry != registry.lower())
