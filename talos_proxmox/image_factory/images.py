"""Talos Image Factory: schematic ids, image URLs and the HTTP call that registers a schematic.

A schematic's id is the hex SHA-256 of its canonical YAML: the fields in the factory's struct order,
empty fields left out (`customization` always written, `{}` when empty), marshalled as Go's yaml
does (see talos_proxmox/talos_config/go_yaml.py). Computing it here lets previews show the id, the ISO URL and the
installer image without calling the factory. Pure code apart from `register_schematic`; no Pulumi.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

import yaml

from talos_proxmox.talos_config.go_yaml import GoYamlError, go_sorted, marshal
from talos_proxmox.talos_config.talos_yaml import TalosLoader

DEFAULT_FACTORY_URL = "https://factory.talos.dev"
DEFAULT_TIMEOUT_SECONDS = 30.0
ARCHES = ("amd64", "arm64")
# Platforms a Proxmox VM boots: metal (no cloud-init) and nocloud (cloud-init style config).
VARIANT_PLATFORMS = ("metal", "nocloud")
BOOTLOADERS = ("dual-boot", "sd-boot", "grub")
DEFAULT_BOOTLOADERS = ("auto", "none")  # the zero value: the imager chooses; left out of the schematic
ENROLL_KEYS = ("off", "manual", "if-safe", "force")
ERROR_BODY_LIMIT = 500  # characters of the factory's error body kept in our messages

_SCHEMATIC_KEYS = ("owner", "overlay", "customization")
_OVERLAY_KEYS = ("image", "name", "options")
_CUSTOMIZATION_KEYS = ("embeddedMachineConfiguration", "extraKernelArgs", "meta", "systemExtensions",
                       "bootloader", "secureboot", "diskImage")
_META_KEYS = ("key", "value")
_SYSTEM_EXTENSIONS_KEYS = ("officialExtensions",)
_SECUREBOOT_KEYS = ("enrollKeys", "includeWellKnownCertificates")
_DISK_IMAGE_KEYS = ("sectorSize",)

_VERSION = re.compile(r"^v?\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$")
_PLATFORM = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_SCHEMATIC_ID = re.compile(r"^[0-9a-f]{64}$")


class SchematicError(ValueError):
    """The schematic (or an image parameter) is not what the Image Factory accepts."""


class FactoryError(RuntimeError):
    """The Image Factory could not be reached, refused the schematic or answered unexpectedly."""


# ---------------------------------------------------------------------------------------------
# The schematic: validation and canonical form


def _mapping(value: Any, path: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SchematicError(f"{path}: expected a mapping, got {type(value).__name__} {value!r}")
    unknown = [k for k in value if k not in allowed]
    if unknown:
        raise SchematicError(
            f"{path or 'schematic'}: unknown key {unknown[0]!r}; expected one of: {', '.join(allowed)} "
            "(the Image Factory rejects unknown fields)")
    return value


def _string(value: Any, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SchematicError(f"{path}: expected a string, got {type(value).__name__} {value!r}"
                             + (" (quote it in YAML)" if isinstance(value, (bool, int, float)) else ""))
    return value


def _strings(value: Any, path: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise SchematicError(f"{path}: expected a list of strings, got {type(value).__name__} {value!r}")
    return [_string(item, f"{path}[{i}]") for i, item in enumerate(value)]


def _unsigned(value: Any, path: str, maximum: int) -> int:
    if isinstance(value, str):
        try:
            value = int(value.replace("_", ""), 0)
        except ValueError:
            raise SchematicError(f"{path}: expected an integer 0-{maximum}, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise SchematicError(f"{path}: expected an integer 0-{maximum}, got {value!r}")
    return value


def _bool(value: Any, path: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise SchematicError(f"{path}: expected true or false, got {type(value).__name__} {value!r}")
    return value


def canonical_schematic(schematic: Mapping[str, Any]) -> dict:
    """The schematic as the factory stores it: struct field order, empty fields dropped.

    Raises SchematicError naming the key, the value and what was expected.
    """
    top = _mapping(schematic, "", _SCHEMATIC_KEYS)
    out: dict[str, Any] = {}

    owner = _string(top.get("owner"), "owner")
    if owner:
        out["owner"] = owner

    overlay = _mapping(top.get("overlay"), "overlay", _OVERLAY_KEYS)
    image = _string(overlay.get("image"), "overlay.image")
    name = _string(overlay.get("name"), "overlay.name")
    options = overlay.get("options")
    if options is not None and not isinstance(options, Mapping):
        raise SchematicError(f"overlay.options: expected a mapping, got {type(options).__name__} {options!r}")
    if image or name or options:
        out["overlay"] = {"image": image, "name": name}
        if options:
            try:
                out["overlay"]["options"] = go_sorted(options)  # a Go map: keys come out sorted
            except GoYamlError as exc:
                raise SchematicError(f"overlay.options: {exc}") from None

    cust = _mapping(top.get("customization"), "customization", _CUSTOMIZATION_KEYS)
    c: dict[str, Any] = {}
    embedded = _string(cust.get("embeddedMachineConfiguration"), "customization.embeddedMachineConfiguration")
    if embedded:
        c["embeddedMachineConfiguration"] = embedded
    args = _strings(cust.get("extraKernelArgs"), "customization.extraKernelArgs")
    if args:
        c["extraKernelArgs"] = args

    meta = cust.get("meta")
    if meta is not None and not isinstance(meta, (list, tuple)):
        raise SchematicError(f"customization.meta: expected a list of {{key, value}}, got {meta!r}")
    metas = []
    for i, entry in enumerate(meta or []):
        path = f"customization.meta[{i}]"
        entry = _mapping(entry, path, _META_KEYS)
        metas.append({"key": _unsigned(entry.get("key", 0), f"{path}.key", 255),
                      "value": _string(entry.get("value"), f"{path}.value")})
    if metas:
        c["meta"] = metas

    ext = _mapping(cust.get("systemExtensions"), "customization.systemExtensions", _SYSTEM_EXTENSIONS_KEYS)
    official = _strings(ext.get("officialExtensions"), "customization.systemExtensions.officialExtensions")
    if official:
        c["systemExtensions"] = {"officialExtensions": official}

    bootloader = _string(cust.get("bootloader"), "customization.bootloader")
    if bootloader and bootloader not in BOOTLOADERS + DEFAULT_BOOTLOADERS:
        raise SchematicError(f"customization.bootloader: {bootloader!r} is not one of "
                             f"{', '.join(DEFAULT_BOOTLOADERS + BOOTLOADERS)}")
    if bootloader in BOOTLOADERS:
        c["bootloader"] = bootloader

    sb = _mapping(cust.get("secureboot"), "customization.secureboot", _SECUREBOOT_KEYS)
    secureboot: dict[str, Any] = {}
    enroll = _string(sb.get("enrollKeys"), "customization.secureboot.enrollKeys")
    if enroll and enroll not in ENROLL_KEYS:
        raise SchematicError(f"customization.secureboot.enrollKeys: {enroll!r} is not one of "
                             f"{', '.join(ENROLL_KEYS)}")
    if enroll:
        secureboot["enrollKeys"] = enroll
    if _bool(sb.get("includeWellKnownCertificates"), "customization.secureboot.includeWellKnownCertificates"):
        secureboot["includeWellKnownCertificates"] = True
    if secureboot:
        c["secureboot"] = secureboot

    disk = _mapping(cust.get("diskImage"), "customization.diskImage", _DISK_IMAGE_KEYS)
    if disk.get("sectorSize") is not None:
        sector = _unsigned(disk["sectorSize"], "customization.diskImage.sectorSize", 2**64 - 1)
        if sector:
            c["diskImage"] = {"sectorSize": sector}

    out["customization"] = c
    return out


def marshal_schematic(schematic: Mapping[str, Any]) -> str:
    """The canonical YAML text of the schematic, the exact bytes its id is the hash of."""
    try:
        return marshal(canonical_schematic(schematic))
    except GoYamlError as exc:
        raise SchematicError(str(exc)) from None


def schematic_id(schematic: Mapping[str, Any]) -> str:
    """The id the Image Factory gives this schematic."""
    return hashlib.sha256(marshal_schematic(schematic).encode("utf-8")).hexdigest()


def load_schematic(text: str, source: str = "schematic") -> dict:
    """Parse a schematic YAML file (as sent with `curl --data-binary @schematic.yaml`) into a dict."""
    try:
        # Go yaml's scalar rules, as the factory reads it: `off`/`yes`, dates and `1:20` stay strings.
        data = yaml.load(text, Loader=TalosLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise SchematicError(f"{source}: not valid YAML: {exc}") from None
    data = {} if data is None else data
    canonical_schematic(data)  # refuse unknown keys and wrong types now, naming the file
    return data


# ---------------------------------------------------------------------------------------------
# Image URLs


def normalize_base_url(base_url: str) -> str:
    """The factory base URL without a trailing slash; http(s) with a host, no query or fragment."""
    parsed = urllib.parse.urlsplit(base_url or "")
    if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.query or parsed.fragment:
        raise SchematicError(f"factory_url: {base_url!r} is not an http(s) URL like {DEFAULT_FACTORY_URL}")
    return base_url.rstrip("/")


def normalize_version(talos_version: str) -> str:
    """Talos version with its leading `v`, as image paths and installer tags spell it."""
    if not isinstance(talos_version, str) or not _VERSION.match(talos_version):
        raise SchematicError(f"talos_version: {talos_version!r} is not a Talos version like v1.13.7")
    return talos_version if talos_version.startswith("v") else "v" + talos_version


def _check_image_params(platform: str, arch: str) -> None:
    if not isinstance(platform, str) or not _PLATFORM.match(platform):
        raise SchematicError(f"platform: {platform!r} is not a Talos platform name like metal or nocloud")
    if arch not in ARCHES:
        raise SchematicError(f"arch: {arch!r} is not one of {', '.join(ARCHES)}")


def _check_id(sid: str) -> None:
    if not isinstance(sid, str) or not _SCHEMATIC_ID.match(sid):
        raise SchematicError(f"schematic id: {sid!r} is not 64 lowercase hex characters")


def iso_file_name(platform: str = "metal", arch: str = "amd64", secure_boot: bool = False) -> str:
    """The factory's name for the boot ISO, e.g. metal-amd64.iso or metal-amd64-secureboot.iso."""
    _check_image_params(platform, arch)
    return f"{platform}-{arch}{'-secureboot' if secure_boot else ''}.iso"


def iso_url(base_url: str, sid: str, talos_version: str, platform: str = "metal",
            arch: str = "amd64", secure_boot: bool = False) -> str:
    """Where the factory serves the ISO: <base>/image/<id>/<version>/<platform>-<arch>[-secureboot].iso."""
    _check_id(sid)
    return (f"{normalize_base_url(base_url)}/image/{sid}/{normalize_version(talos_version)}/"
            f"{iso_file_name(platform, arch, secure_boot)}")


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.lstrip("v").split(".")[:2]
    return int(major), int(minor)


def installer_image(base_url: str, sid: str, talos_version: str, platform: str = "metal",
                    secure_boot: bool = False) -> str:
    """The installer image reference for `machine.install.image`.

    `<host>/installer/<id>:<version>` for metal (as the seed uses); from Talos 1.10 other platforms
    have their own installer, `<host>/<platform>-installer/<id>:<version>`. `-secureboot` appended
    to the image name for Secure Boot.
    """
    _check_id(sid)
    _check_image_params(platform, "amd64")
    version = normalize_version(talos_version)
    parsed = urllib.parse.urlsplit(normalize_base_url(base_url))
    host = parsed.netloc.rsplit("@", 1)[-1] + parsed.path.rstrip("/")
    name = "installer"
    if platform != "metal" and _version_tuple(version) >= (1, 10):
        name = f"{platform}-installer"
    if secure_boot:
        name += "-secureboot"
    return f"{host}/{name}/{sid}:{version}"


def image_variants(base_url: str, sid: str, talos_version: str) -> dict[str, str]:
    """ISO URLs for the variants users pick between: metal/nocloud x amd64/arm64, and Secure Boot metal."""
    variants = {}
    for platform in VARIANT_PLATFORMS:
        for arch in ARCHES:
            variants[f"{platform}-{arch}"] = iso_url(base_url, sid, talos_version, platform, arch)
    for arch in ARCHES:
        variants[f"metal-{arch}-secureboot"] = iso_url(base_url, sid, talos_version, "metal", arch, True)
    return variants


# ---------------------------------------------------------------------------------------------
# Registration


def _trim(text: str, collapse: bool = True) -> str:
    if collapse:
        text = " ".join(text.split())
    return text if len(text) <= ERROR_BODY_LIMIT else text[:ERROR_BODY_LIMIT] + "..."


def register_schematic(base_url: str, schematic: Mapping[str, Any],
                       timeout: float = DEFAULT_TIMEOUT_SECONDS) -> str:
    """POST the schematic to <base_url>/schematics and return its id.

    The body is the canonical YAML, so the factory's answer must be the id computed here; any other
    answer raises FactoryError naming the URL, as do an unreachable factory, an HTTP error status
    (with the factory's message) and a reply that is not the expected JSON.
    """
    body = marshal_schematic(schematic)
    local_id = hashlib.sha256(body.encode("utf-8")).hexdigest()
    url = normalize_base_url(base_url) + "/schematics"
    request = urllib.request.Request(
        url, data=body.encode("utf-8"), method="POST",
        headers={"Content-Type": "application/yaml", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - http(s) checked
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        detail = _trim(exc.read().decode("utf-8", "replace")) or exc.reason
        raise FactoryError(f"Image Factory at {url} refused the schematic: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, (socket.timeout, TimeoutError)):
            reason = f"no answer within {timeout:g}s"
        raise FactoryError(f"cannot reach the Image Factory at {url}: {reason}") from None

    text = raw.decode("utf-8", "replace")
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("id"), str):
        raise FactoryError(f"Image Factory at {url} answered HTTP {status} without the expected JSON "
                           f"{{\"id\": ...}}: {_trim(text)!r}")
    if answer["id"] != local_id:
        theirs = answer.get("schematic")
        raise FactoryError(
            f"Image Factory at {url} returned schematic id {answer['id']}, but the id computed locally "
            f"is {local_id}; the factory's canonical schematic is {_trim(str(theirs), False)!r}, ours is "
            f"{_trim(body, False)!r}. A factory that adds fields (e.g. an owner) gives its own ids.")
    return local_id
