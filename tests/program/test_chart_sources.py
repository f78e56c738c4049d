"""The Cilium chart from a private HTTPS mirror: `cilium.caFile` (a PEM bundle) is read at load and reaches the
release's repositoryOpts.caFile, which Helm uses for the index and the chart archive (the engine tier's
tests/engine/test_addons.py pulls both through it from a server only that CA vouches for)."""

from __future__ import annotations

import pytest

from talos_proxmox.settings.model import SettingsError
from tests.stand_ins.chart_sources import ChartCa
from tests.program.test_addons_component import RELEASE, run, stack


def test_a_ca_file_reaches_the_cilium_release(tmp_path):
    ca = ChartCa(tmp_path)
    settings = stack(cilium={"repository": "https://charts.example.internal/cilium/", "caFile": str(ca.ca_file)})
    assert settings.cilium.ca_file == str(ca.ca_file)
    cilium = run(settings).one(RELEASE, "cilium")
    assert cilium.inputs["repositoryOpts"] == {"repo": "https://charts.example.internal/cilium",
                                               "caFile": str(ca.ca_file)}


def test_a_bundle_of_several_certificates_loads_and_a_broken_one_is_named(tmp_path):
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(ChartCa(tmp_path / "a").cert_pem + ChartCa(tmp_path / "b").cert_pem)
    assert stack(cilium={"caFile": str(bundle)}).cilium.ca_file == str(bundle)
    broken = tmp_path / "broken.pem"
    broken.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    with pytest.raises(SettingsError, match="cilium.caFile: .* is not a readable PEM file of CA certificates"):
        stack(cilium={"caFile": str(broken)})
