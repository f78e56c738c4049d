"""`Schematic`: an Image Factory schematic as a Pulumi dynamic resource.

Create registers the schematic with the factory (and fails, leaving no resource, when the factory is
unreachable or disagrees about the id). Everything else is local: the id is a hash, so diff compares
ids without calling the factory, and the image URLs are recomputed from the inputs. The factory
keeps schematics forever (they are content-addressed), so delete has nothing to do.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import pulumi
import pulumi.dynamic as dynamic

from talos_proxmox.image_factory.images import (
    DEFAULT_FACTORY_URL,
    DEFAULT_TIMEOUT_SECONDS,
    SchematicError,
    image_variants,
    installer_image,
    iso_file_name,
    iso_url,
    marshal_schematic,
    normalize_base_url,
    normalize_version,
    register_schematic,
    schematic_id,
)

INPUTS = ("schematic", "talos_version", "factory_url", "platform", "arch", "secure_boot", "timeout")
# Inputs that only change which URLs we print: an update, no call to the factory.
URL_INPUTS = ("talos_version", "platform", "arch", "secure_boot")


def schematic_outputs(props: Mapping[str, Any]) -> dict[str, Any]:
    """The resource's full state for these inputs, computed without the network."""
    schematic = props["schematic"]
    base, version = props["factory_url"], props["talos_version"]
    platform, arch, secure_boot = props["platform"], props["arch"], bool(props["secure_boot"])
    sid = schematic_id(schematic)
    return {
        **{k: props[k] for k in INPUTS if k in props},
        "schematic_id": sid,
        "schematic_yaml": marshal_schematic(schematic),
        "installer_image": installer_image(base, sid, version, platform, secure_boot),
        "iso_url": iso_url(base, sid, version, platform, arch, secure_boot),
        "iso_file_name": iso_file_name(platform, arch, secure_boot),
        "image_urls": image_variants(base, sid, version),
    }


def _failing_input(message: str) -> str:
    name = message.split(":", 1)[0]
    return name if name in INPUTS else "schematic"


def _url_input(name: str, value: Any) -> Any:
    if name == "talos_version":
        return normalize_version(value)
    if name == "secure_boot":
        return bool(value)
    return value


class SchematicProvider(dynamic.ResourceProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        try:
            schematic_outputs(news)
        except SchematicError as exc:
            return dynamic.CheckResult(news, [dynamic.CheckFailure(_failing_input(str(exc)), str(exc))])
        return dynamic.CheckResult(news, [])

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = schematic_outputs(props)  # validates before anything is sent
        registered = register_schematic(props["factory_url"], props["schematic"],
                                        float(props.get("timeout") or DEFAULT_TIMEOUT_SECONDS))
        return dynamic.CreateResult(id_=registered, outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        replaces = []
        if schematic_id(olds["schematic"]) != schematic_id(news["schematic"]):
            replaces.append("schematic")
        if normalize_base_url(olds["factory_url"]) != normalize_base_url(news["factory_url"]):
            replaces.append("factory_url")  # another factory must learn the schematic
        changed = [k for k in URL_INPUTS if _url_input(k, olds.get(k)) != _url_input(k, news.get(k))]
        return dynamic.DiffResult(changes=bool(replaces or changed), replaces=replaces,
                                  stables=[] if replaces else ["schematic_id", "schematic_yaml"],
                                  delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=schematic_outputs(news))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        # The factory never forgets a schematic; the state is a pure function of the inputs.
        return dynamic.ReadResult(id_=id_, outs=schematic_outputs(props))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


class Schematic(dynamic.Resource):
    """A schematic registered with an Image Factory, and the images it names for one Talos version."""

    schematic_id: pulumi.Output[str]
    schematic_yaml: pulumi.Output[str]
    installer_image: pulumi.Output[str]
    iso_url: pulumi.Output[str]
    iso_file_name: pulumi.Output[str]
    image_urls: pulumi.Output[dict]

    def __init__(self, name: str, schematic: Mapping[str, Any], talos_version: str,
                 factory_url: str = DEFAULT_FACTORY_URL, platform: str = "metal", arch: str = "amd64",
                 secure_boot: bool = False, timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 opts: Optional[pulumi.ResourceOptions] = None):
        props = {"schematic": dict(schematic), "talos_version": talos_version, "factory_url": factory_url,
                 "platform": platform, "arch": arch, "secure_boot": secure_boot, "timeout": timeout}
        # Bad settings fail here, in the program, before anything is registered.
        outputs = schematic_outputs(props)
        super().__init__(SchematicProvider(), name, {**{k: None for k in outputs}, **props}, opts)
