"""Schematic ids, image URLs and registration against a stand-in Image Factory on 127.0.0.1."""

from __future__ import annotations

import json

import pytest
import yaml

from talos_proxmox.talos_config import go_yaml
from talos_proxmox.image_factory.images import (
    DEFAULT_FACTORY_URL,
    FactoryError,
    SchematicError,
    canonical_schematic,
    image_variants,
    installer_image,
    iso_file_name,
    iso_url,
    load_schematic,
    marshal_schematic,
    register_schematic,
    schematic_id,
)
from tests.stand_ins.image_factory import EMPTY_ID, SEED_ID, SEED_SCHEMATIC, StandInFactory, closed_port_url
from tests.paths import REPO

# ---------------------------------------------------------------------------------------------
# ids and canonical text


def test_seed_schematic_has_the_id_the_factory_gave():
    assert schematic_id(SEED_SCHEMATIC) == SEED_ID
    assert marshal_schematic(SEED_SCHEMATIC) == (
        "customization:\n"
        "    extraKernelArgs:\n"
        "        - net.ifnames=0\n"
        "    systemExtensions:\n"
        "        officialExtensions:\n"
        "            - siderolabs/iscsi-tools\n"
        "            - siderolabs/nfs-utils\n"
        "            - siderolabs/qemu-guest-agent\n"
        "            - siderolabs/util-linux-tools\n")


@pytest.mark.parametrize("empty", [{}, {"customization": {}}, {"customization": None},
                                   {"customization": {"extraKernelArgs": [], "systemExtensions": {}}},
                                   {"customization": {"bootloader": "auto", "secureboot": {
                                       "includeWellKnownCertificates": False}}}])
def test_empty_schematic_is_customization_braces(empty):
    assert marshal_schematic(empty) == "customization: {}\n"
    assert schematic_id(empty) == EMPTY_ID


# ids from the factory's own tests (pkg/schematic/schematic_test.go)
@pytest.mark.parametrize("schematic, expected", [
    ({"customization": {"extraKernelArgs": ["noapic", "nolapic"]}},
     "9cba8e32753f91a16c1837ab8abf356af021706ef284aef07380780177d9a06c"),
    ({"customization": {"meta": [{"key": 0x0A, "value": "foo"}]}},
     "d308a2a5ee2277bed5fbaa104fcbc8d59122abfa737df987a95b4ca763459a7f"),
    ({"customization": {"secureboot": {"includeWellKnownCertificates": True}}},
     "fa8e05f142a851d3ee568eb0a8e5841eaf6b0ebc8df9a63df16ac5ed2c04f3e6"),
    ({"customization": {"diskImage": {"sectorSize": 4096}}},
     "92833e9ddd9bb9e11b2464fa5525429f01866306d52ebd882ee08d7918f6d1ea"),
    ({"overlay": {"name": "rpi_generic", "image": "siderolabs/sbc-raspberrypi"}, "customization": {}},
     "ee21ef4a5ef808a9b7484cc0dda0f25075021691c8c09a276591eedb638ea1f9"),
])
def test_ids_match_the_factory_test_vectors(schematic, expected):
    assert schematic_id(schematic) == expected


def test_fields_come_out_in_struct_order_whatever_the_input_order():
    scrambled = {
        "customization": {
            "diskImage": {"sectorSize": 4096},
            "secureboot": {"includeWellKnownCertificates": True, "enrollKeys": "off"},
            "bootloader": "sd-boot",
            "systemExtensions": {"officialExtensions": ["siderolabs/gvisor"]},
            "meta": [{"value": "{}", "key": "0xa"}],
            "extraKernelArgs": ["console=ttyS0,115200"],
            "embeddedMachineConfiguration": "apiVersion: v1alpha1\nkind: HostnameConfig\n",
        },
        "overlay": {"options": {"b": 1, "a": "x"}, "name": "rpi_generic", "image": "siderolabs/sbc"},
    }
    assert marshal_schematic(scrambled) == (
        "overlay:\n"
        "    image: siderolabs/sbc\n"
        "    name: rpi_generic\n"
        "    options:\n"
        "        a: x\n"
        "        b: 1\n"
        "customization:\n"
        "    embeddedMachineConfiguration: |\n"
        "        apiVersion: v1alpha1\n"
        "        kind: HostnameConfig\n"
        "    extraKernelArgs:\n"
        "        - console=ttyS0,115200\n"
        "    meta:\n"
        "        - key: 10\n"
        "          value: '{}'\n"
        "    systemExtensions:\n"
        "        officialExtensions:\n"
        "            - siderolabs/gvisor\n"
        "    bootloader: sd-boot\n"
        "    secureboot:\n"
        "        enrollKeys: 'off'\n"
        "        includeWellKnownCertificates: true\n"
        "    diskImage:\n"
        "        sectorSize: 4096\n")


def test_extension_order_is_kept_and_changes_the_id():
    reordered = {"customization": {
        "systemExtensions": {"officialExtensions": list(reversed(
            SEED_SCHEMATIC["customization"]["systemExtensions"]["officialExtensions"]))},
        "extraKernelArgs": ["net.ifnames=0"]}}
    assert schematic_id(reordered) != SEED_ID


@pytest.mark.parametrize("vector", json.loads(
    (REPO / "tests/data/go_yaml_vectors.json").read_text())["vectors"], ids=lambda v: str(len(v["text"])))
def test_marshal_matches_go_yaml_byte_for_byte(vector):
    assert go_yaml.marshal(vector["value"]) == vector["text"]


@pytest.mark.parametrize("text, style", [
    ("net.ifnames=0", go_yaml.PLAIN), ("off", go_yaml.SINGLE), ("yes", go_yaml.SINGLE),
    ("true", go_yaml.DOUBLE), ("10", go_yaml.DOUBLE), ("1.5", go_yaml.DOUBLE), ("null", go_yaml.DOUBLE),
    ("2024-01-02", go_yaml.DOUBLE), ("2024-13-02", go_yaml.PLAIN), ("", go_yaml.DOUBLE),
    ("a: b", go_yaml.SINGLE), ("- x", go_yaml.SINGLE), ("#x", go_yaml.SINGLE), ("a #b", go_yaml.SINGLE),
    ("a#b", go_yaml.PLAIN), ("x:y", go_yaml.PLAIN), (" lead", go_yaml.SINGLE), ("tab\tin", go_yaml.DOUBLE),
    ("line\n", go_yaml.LITERAL), ("trailing \nspace", go_yaml.DOUBLE), ("1:20", go_yaml.SINGLE),
])
def test_string_styles_follow_go(text, style):
    assert go_yaml.string_style(text) == style


@pytest.mark.parametrize("value, text", [
    (1.0, "1"), (0.5, "0.5"), (1e6, "1e+06"), (123456.0, "123456"), (1e-5, "1e-05"), (0.0001, "0.0001"),
    (-0.0, "-0"), (float("inf"), ".inf"), (float("-inf"), "-.inf"), (float("nan"), ".nan"),
    (2.5e-10, "2.5e-10"), (1234567.0, "1.234567e+06"),
])
def test_floats_are_formatted_like_go(value, text):
    assert go_yaml.go_float(value) == text


def test_go_map_keys_sort_with_digit_runs_as_numbers():
    assert list(go_yaml.go_sorted({"a10": 1, "a9": 2, "b": 3, "A": 4, "a": 5})) == ["A", "a", "a9", "a10", "b"]


@pytest.mark.parametrize("schematic, message", [
    ({"customisation": {}}, "schematic: unknown key 'customisation'; expected one of: owner, overlay, customization"),
    ({"customization": {"systemExtensions": {"official": []}}},
     "customization.systemExtensions: unknown key 'official'; expected one of: officialExtensions"),
    ({"customization": {"extraKernelArgs": "net.ifnames=0"}},
     "customization.extraKernelArgs: expected a list of strings, got str 'net.ifnames=0'"),
    ({"customization": {"extraKernelArgs": [5]}},
     "customization.extraKernelArgs[0]: expected a string, got int 5 (quote it in YAML)"),
    ({"customization": {"meta": [{"key": 256, "value": "x"}]}},
     "customization.meta[0].key: expected an integer 0-255, got 256"),
    ({"customization": {"meta": [{"key": 1, "value": "x", "extra": 1}]}},
     "customization.meta[0]: unknown key 'extra'; expected one of: key, value"),
    ({"customization": {"bootloader": "lilo"}},
     "customization.bootloader: 'lilo' is not one of auto, none, dual-boot, sd-boot, grub"),
    ({"customization": {"secureboot": {"enrollKeys": "always"}}},
     "customization.secureboot.enrollKeys: 'always' is not one of off, manual, if-safe, force"),
    ({"customization": {"secureboot": {"includeWellKnownCertificates": "yes"}}},
     "customization.secureboot.includeWellKnownCertificates: expected true or false, got str 'yes'"),
    ({"customization": {"diskImage": {"sectorSize": -1}}},
     "customization.diskImage.sectorSize: expected an integer 0-18446744073709551615, got -1"),
    ({"overlay": {"image": "x", "name": "y", "options": {"k": object()}}}, "overlay.options.k: object value"),
    ("customization: {}", "expected a mapping, got str"),
])
def test_bad_schematics_are_refused_with_the_key_and_value(schematic, message):
    with pytest.raises(SchematicError) as err:
        schematic_id(schematic)
    assert message in str(err.value)


# ---------------------------------------------------------------------------------------------
# the schematic file and stack config


def test_schematic_file_round_trips_through_stack_config():
    text = (REPO / "schematics/schematic.yaml").read_text()
    from_file = load_schematic(text, "schematics/schematic.yaml")
    assert schematic_id(from_file) == SEED_ID
    # The stack file holds it under talos:image; Pulumi hands it to the program as JSON.
    stack_yaml = yaml.safe_dump({"config": {"talos:image": {"schematic": from_file,
                                                             "factory_url": DEFAULT_FACTORY_URL}}})
    held = json.loads(json.dumps(yaml.safe_load(stack_yaml)["config"]["talos:image"]))
    assert held["schematic"] == from_file
    assert schematic_id(held["schematic"]) == SEED_ID


def test_schematic_file_reads_scalars_as_the_factory_does():
    text = ("customization:\n  secureboot:\n    enrollKeys: off\n    includeWellKnownCertificates: true\n"
            "  meta:\n    - key: 0xa\n      value: '{}'\n")
    loaded = load_schematic(text)
    assert loaded["customization"]["secureboot"] == {"enrollKeys": "off", "includeWellKnownCertificates": True}
    assert canonical_schematic(loaded)["customization"]["meta"] == [{"key": 10, "value": "{}"}]


def test_schematic_file_with_an_unknown_key_names_the_file():
    with pytest.raises(SchematicError, match="customization: unknown key 'systemExtension'"):
        load_schematic("customization:\n  systemExtension: {}\n", "schematics/bad.yaml")
    with pytest.raises(SchematicError, match="schematics/broken.yaml: not valid YAML"):
        load_schematic("customization: [\n", "schematics/broken.yaml")


# ---------------------------------------------------------------------------------------------
# URLs


def test_urls_follow_the_seed_and_the_base_url():
    assert iso_url(DEFAULT_FACTORY_URL, SEED_ID, "v1.13.7") == (
        f"https://factory.talos.dev/image/{SEED_ID}/v1.13.7/metal-amd64.iso")
    assert installer_image(DEFAULT_FACTORY_URL, SEED_ID, "v1.13.7") == (
        f"factory.talos.dev/installer/{SEED_ID}:v1.13.7")
    private = "https://factory.internal.example:8443/"
    assert iso_url(private, SEED_ID, "1.13.7", "nocloud", "arm64") == (
        f"https://factory.internal.example:8443/image/{SEED_ID}/v1.13.7/nocloud-arm64.iso")
    assert installer_image(private, SEED_ID, "v1.13.7", secure_boot=True) == (
        f"factory.internal.example:8443/installer-secureboot/{SEED_ID}:v1.13.7")
    assert installer_image(private, SEED_ID, "v1.13.7", platform="nocloud") == (
        f"factory.internal.example:8443/nocloud-installer/{SEED_ID}:v1.13.7")
    assert installer_image(private, SEED_ID, "v1.9.5", platform="nocloud") == (
        f"factory.internal.example:8443/installer/{SEED_ID}:v1.9.5")
    assert iso_file_name("metal", "amd64", True) == "metal-amd64-secureboot.iso"


def test_variants_cover_platforms_arches_and_secure_boot():
    variants = image_variants("http://127.0.0.1:9", SEED_ID, "v1.13.7")
    assert sorted(variants) == ["metal-amd64", "metal-amd64-secureboot", "metal-arm64",
                                "metal-arm64-secureboot", "nocloud-amd64", "nocloud-arm64"]
    assert variants["metal-arm64-secureboot"] == (
        f"http://127.0.0.1:9/image/{SEED_ID}/v1.13.7/metal-arm64-secureboot.iso")


@pytest.mark.parametrize("call, message", [
    (lambda: iso_url("factory.talos.dev", SEED_ID, "v1.13.7"), "factory_url: 'factory.talos.dev' is not an http(s) URL"),
    (lambda: iso_url(DEFAULT_FACTORY_URL, SEED_ID, "latest"), "talos_version: 'latest' is not a Talos version"),
    (lambda: iso_url(DEFAULT_FACTORY_URL, SEED_ID, "v1.13.7", arch="x86_64"), "arch: 'x86_64' is not one of amd64, arm64"),
    (lambda: iso_url(DEFAULT_FACTORY_URL, SEED_ID, "v1.13.7", platform="Metal"), "platform: 'Metal'"),
    (lambda: iso_url(DEFAULT_FACTORY_URL, "abc", "v1.13.7"), "schematic id: 'abc'"),
])
def test_bad_image_parameters_are_refused(call, message):
    with pytest.raises(SchematicError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


# ---------------------------------------------------------------------------------------------
# registration against a stand-in factory


def test_register_posts_the_canonical_yaml_and_returns_the_id():
    with StandInFactory() as factory:
        assert register_schematic(factory.url + "/", SEED_SCHEMATIC, timeout=5) == SEED_ID
    [(method, path, headers, body)] = factory.requests
    assert (method, path) == ("POST", "/schematics")
    assert headers["Content-Type"] == "application/yaml"
    assert body.decode() == marshal_schematic(SEED_SCHEMATIC)


@pytest.mark.parametrize("mode, expected", [
    ("400", r"Image Factory at http://127\.0\.0\.1:\d+/schematics refused the schematic: HTTP 400: "
            r"yaml: unmarshal errors: line 2: field systemExtension not found in type schematic\.Customization$"),
    ("500", r"Image Factory at http://127\.0\.0\.1:\d+/schematics refused the schematic: HTTP 500: "
            r"internal server error: x{400,500}\.\.\.$"),
    ("mismatch", r"Image Factory at http://127\.0\.0\.1:\d+/schematics returned schematic id 0{64}, but the id "
                 rf"computed locally is {SEED_ID}; the factory's canonical schematic is 'owner: alice"),
    ("html", r"Image Factory at http://127\.0\.0\.1:\d+/schematics answered HTTP 200 without the expected JSON "
             r"\{\"id\": \.\.\.\}: '<html><body>proxy login</body></html>'"),
    ("no-id", r"answered HTTP 201 without the expected JSON"),
])
def test_factory_failures_are_clear(mode, expected):
    with StandInFactory(mode) as factory:
        with pytest.raises(FactoryError, match=expected):
            register_schematic(factory.url, SEED_SCHEMATIC, timeout=5)
    assert len(factory.requests) == 1


def test_unreachable_factory_names_the_url():
    url = closed_port_url()
    with pytest.raises(FactoryError, match=rf"cannot reach the Image Factory at {url}/schematics: .*refused"):
        register_schematic(url, SEED_SCHEMATIC, timeout=5)


def test_silent_factory_times_out_with_a_clear_message():
    with StandInFactory(delay=1.0) as factory:
        with pytest.raises(FactoryError, match=r"cannot reach the Image Factory at .*: no answer within 0\.2s"):
            register_schematic(factory.url, SEED_SCHEMATIC, timeout=0.2)


def test_invalid_schematic_is_refused_before_any_request():
    with StandInFactory() as factory:
        with pytest.raises(SchematicError, match="unknown key"):
            register_schematic(factory.url, {"customization": {"kernelArgs": []}}, timeout=5)
    assert factory.requests == []


def test_schematic_file_scalars_in_overlay_options_follow_go():
    """Go's yaml (YAML 1.2) reads `1:20` and `yes` as strings and `010`/`0x1f` as ints; PyYAML's 1.1 defaults do not."""
    loaded = load_schematic("overlay:\n  image: x\n  name: y\n  options:\n"
                            "    a: 1:20\n    b: 010\n    c: 0x1f\n    d: 1e3\n    f: off\n    k: yes\n    l: True\n")
    # what Go's yaml.v4 gives for this very file decoded into the factory's Schematic struct
    assert marshal_schematic(loaded) == (
        "overlay:\n    image: x\n    name: 'y'\n    options:\n        a: '1:20'\n        b: 8\n        c: 31\n"
        "        d: 1000\n        f: 'off'\n        k: 'yes'\n        l: true\ncustomization: {}\n")
