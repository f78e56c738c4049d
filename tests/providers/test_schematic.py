"""The Schematic dynamic provider, called directly, against a stand-in factory on 127.0.0.1."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
from pulumi.dynamic.dynamic import serialize_provider

from talos_proxmox.image_factory.images import FactoryError, SchematicError
from providers.schematic import SchematicProvider, schematic_outputs
from tests.stand_ins.image_factory import SEED_ID, SEED_SCHEMATIC, StandInFactory, closed_port_url
from tests.paths import REPO


def props(factory_url: str, **overrides):
    base = {"schematic": copy.deepcopy(SEED_SCHEMATIC), "talos_version": "v1.13.7", "factory_url": factory_url,
            "platform": "metal", "arch": "amd64", "secure_boot": False, "timeout": 5}
    base.update(overrides)
    return base


def test_create_registers_and_returns_the_images():
    with StandInFactory() as factory:
        result = SchematicProvider().create(props(factory.url))
    assert len(factory.requests) == 1
    assert result.id == SEED_ID
    outs = result.outs
    assert outs["schematic_id"] == SEED_ID
    assert outs["iso_url"] == f"{factory.url}/image/{SEED_ID}/v1.13.7/metal-amd64.iso"
    host = factory.url.removeprefix("http://")
    assert outs["installer_image"] == f"{host}/installer/{SEED_ID}:v1.13.7"
    assert outs["iso_file_name"] == "metal-amd64.iso"
    assert outs["image_urls"]["nocloud-arm64"] == f"{factory.url}/image/{SEED_ID}/v1.13.7/nocloud-arm64.iso"
    assert outs["image_urls"]["metal-amd64-secureboot"].endswith("/metal-amd64-secureboot.iso")
    assert outs["schematic_yaml"].startswith("customization:\n    extraKernelArgs:\n")
    assert outs["schematic"] == SEED_SCHEMATIC


def test_create_with_secure_boot_on_nocloud_arm64():
    with StandInFactory() as factory:
        outs = SchematicProvider().create(props(factory.url, platform="nocloud", arch="arm64",
                                                secure_boot=True)).outs
    host = factory.url.removeprefix("http://")
    assert outs["iso_url"].endswith(f"/image/{SEED_ID}/v1.13.7/nocloud-arm64-secureboot.iso")
    assert outs["installer_image"] == f"{host}/nocloud-installer-secureboot/{SEED_ID}:v1.13.7"


@pytest.mark.parametrize("mode, message", [
    ("400", "refused the schematic: HTTP 400"),
    ("500", "refused the schematic: HTTP 500"),
    ("mismatch", "returned schematic id 0000"),
    ("html", "without the expected JSON"),
])
def test_create_fails_cleanly_and_makes_nothing(mode, message):
    """The engine records a resource only when create returns; here it raises instead."""
    with StandInFactory(mode) as factory:
        with pytest.raises(FactoryError, match=message) as err:
            SchematicProvider().create(props(factory.url))
    assert factory.url + "/schematics" in str(err.value)


def test_create_against_an_unreachable_factory_fails_cleanly():
    url = closed_port_url()
    with pytest.raises(FactoryError, match=f"cannot reach the Image Factory at {url}/schematics"):
        SchematicProvider().create(props(url))


def test_create_refuses_a_bad_schematic_without_a_request():
    with StandInFactory() as factory:
        with pytest.raises(SchematicError, match="customization: unknown key 'extensions'"):
            SchematicProvider().create(props(factory.url, schematic={"customization": {"extensions": []}}))
    assert factory.requests == []


def _state(url):
    return schematic_outputs(props(url))


def test_diff_of_an_unchanged_schematic_is_empty_and_offline():
    with StandInFactory() as factory:
        equivalent = {"customization": {"extraKernelArgs": ["net.ifnames=0"], "meta": [],
                                        "systemExtensions": SEED_SCHEMATIC["customization"]["systemExtensions"]}}
        diff = SchematicProvider().diff(SEED_ID, _state(factory.url), props(factory.url + "/", schematic=equivalent))
    assert diff.changes is False
    assert diff.replaces == []
    assert factory.requests == []


def test_diff_of_a_changed_schematic_replaces_offline():
    with StandInFactory() as factory:
        changed = copy.deepcopy(SEED_SCHEMATIC)
        changed["customization"]["systemExtensions"]["officialExtensions"].append("siderolabs/gvisor")
        diff = SchematicProvider().diff(SEED_ID, _state(factory.url), props(factory.url, schematic=changed))
    assert diff.changes is True
    assert diff.replaces == ["schematic"]
    assert factory.requests == []


def test_diff_of_another_factory_replaces_and_of_a_version_updates():
    with StandInFactory() as factory:
        provider = SchematicProvider()
        moved = provider.diff(SEED_ID, _state(factory.url), props("https://factory.internal.example"))
        upgraded = provider.diff(SEED_ID, _state(factory.url), props(factory.url, talos_version="1.13.8"))
        same_version = provider.diff(SEED_ID, _state(factory.url), props(factory.url, talos_version="1.13.7"))
    assert (moved.changes, moved.replaces) == (True, ["factory_url"])
    assert (upgraded.changes, upgraded.replaces) == (True, [])
    assert same_version.changes is False
    assert factory.requests == []


def test_update_and_read_recompute_offline():
    with StandInFactory() as factory:
        provider = SchematicProvider()
        updated = provider.update(SEED_ID, _state(factory.url), props(factory.url, talos_version="v1.13.8"))
        read = provider.read(SEED_ID, _state(factory.url))
    assert updated.outs["installer_image"].endswith(f"/installer/{SEED_ID}:v1.13.8")
    assert updated.outs["iso_url"].endswith(f"/{SEED_ID}/v1.13.8/metal-amd64.iso")
    assert read.id == SEED_ID and read.outs["iso_url"].endswith("/v1.13.7/metal-amd64.iso")
    assert factory.requests == []


@pytest.mark.parametrize("overrides, prop, reason", [
    ({"schematic": {"customization": {"extraKernelArgs": "x"}}}, "schematic",
     "customization.extraKernelArgs: expected a list of strings"),
    ({"talos_version": "latest"}, "talos_version", "talos_version: 'latest' is not a Talos version"),
    ({"arch": "riscv64"}, "arch", "arch: 'riscv64' is not one of amd64, arm64"),
    ({"factory_url": "ftp://x"}, "factory_url", "factory_url: 'ftp://x' is not an http(s) URL"),
])
def test_check_names_the_failing_input(overrides, prop, reason):
    url = overrides.pop("factory_url", "https://factory.talos.dev")
    result = SchematicProvider().check({}, props(url, **overrides))
    [failure] = result.failures
    assert failure.property == prop
    assert reason in failure.reason


def test_check_accepts_good_inputs():
    assert SchematicProvider().check({}, props("https://factory.talos.dev")).failures == []


def test_serialized_provider_works_in_a_fresh_process():
    """The engine runs the provider from its pickled form in another Python process (cwd: the project)."""
    script = (
        "import base64, json, sys, dill\n"
        "provider = dill.loads(base64.b64decode(sys.stdin.read()))\n"
        "from providers.schematic import schematic_outputs\n"
        f"old = {props('https://factory.talos.dev')!r}\n"
        "new = json.loads(json.dumps(old)); new['schematic']['customization']['extraKernelArgs'] = []\n"
        "d = provider.diff('x', schematic_outputs(old), new)\n"
        "print(json.dumps([d.changes, d.replaces]))\n")
    done = subprocess.run([sys.executable, "-c", script], input=serialize_provider(SchematicProvider()),
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '[true, ["schematic"]]'
