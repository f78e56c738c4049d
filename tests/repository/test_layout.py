"""The tree says the architecture: providers/ holds dynamic providers only, the core never imports Pulumi,
and providers pickled under the module paths of before the layout change still load and work."""

from __future__ import annotations

import ast
import base64
import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import dill
import pulumi.dynamic as dynamic
import pytest

import providers
import talos_proxmox
from tests.paths import REPO

PICKLES = json.loads((REPO / "tests" / "data" / "providers_pickled_before_layout.json").read_text())["providers"]


def _modules(package) -> list[str]:
    return [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_module_of_the_core_imports_pulumi():
    files = sorted((REPO / "talos_proxmox").rglob("*.py"))
    assert len(files) > 25
    offenders = [str(f.relative_to(REPO)) for f in files
                 if {"pulumi", "pulumi_kubernetes", "pulumi_proxmoxve", "providers", "components"} & _imported_roots(f)]
    assert offenders == []


def test_every_module_under_providers_defines_a_dynamic_provider():
    without = []
    for name in _modules(providers):
        module = importlib.import_module(name)
        classes = [obj for obj in vars(module).values()
                   if inspect.isclass(obj) and issubclass(obj, dynamic.ResourceProvider)
                   and obj is not dynamic.ResourceProvider]
        # the old paths' aliases, and the provider host's own watchdog
        if not classes and name not in ("providers.pickled_paths", "providers.engine_watch"):
            without.append(name)
    assert without == []


@pytest.mark.parametrize("path", sorted(PICKLES))
def test_a_provider_pickled_under_its_old_module_path_still_loads(path):
    provider = dill.loads(base64.b64decode(PICKLES[path]))
    assert type(provider).__name__ == path.rsplit(".", 1)[1]
    assert isinstance(provider, dynamic.ResourceProvider)
    assert type(provider).__module__.startswith("providers.")


def test_an_old_pickle_still_deletes_and_refreshes():
    """What an old stack's `pulumi destroy` and `pulumi refresh` call: delete and read on the unpickled provider."""
    secrets = dill.loads(base64.b64decode(PICKLES["providers.dynamic_talos.MachineSecretsProvider"]))
    made = secrets.create({"talos_version": "v1.13.7", "adopt_yaml": None})
    assert secrets.read(made.id, made.outs).outs == made.outs
    assert secrets.delete(made.id, made.outs) is None
    config = dill.loads(base64.b64decode(PICKLES["providers.dynamic_talos.MachineConfigurationProvider"]))
    assert config.read("id", {"config_sha256": "x"}).outs == {"config_sha256": "x"}
    assert config.delete("id", {}) is None


def test_old_pickles_load_in_a_fresh_process_as_the_dynamic_provider_host_unpickles_them():
    """Nothing of ours imported first: unpickling an old path must import `providers`, which registers it."""
    script = ("import base64, json, sys, dill\n"
              f"pickles = json.loads(open({str(REPO / 'tests' / 'data' / 'providers_pickled_before_layout.json')!r})"
              ".read())['providers']\n"
              "print(sorted(type(dill.loads(base64.b64decode(b))).__module__ for b in pickles.values()))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "providers.dynamic_talos" not in done.stdout and "providers.talos_operations" in done.stdout


# --- the tree's own rules --------------------------------------------------------------------------

TEST_ONLY_PACKAGES = ("pytest", "mutmut", "jsonschema", "grpcio-tools", "fakepve")
SERVER_MARKERS = ("HTTPServer(", "grpc.server(", "FakePve", "web.Application(")


def _requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(line.split("==", 1)[0].split(">=", 1)[0].strip().lower())
    return names


def test_the_programs_requirements_hold_no_test_package():
    program = _requirement_names(REPO / "requirements.txt")
    assert program and not program & set(TEST_ONLY_PACKAGES)
    assert "-r requirements.txt" in (REPO / "requirements-test.txt").read_text()
    assert set(TEST_ONLY_PACKAGES) <= _requirement_names(REPO / "requirements-test.txt")


def test_every_core_package_has_its_test_folder():
    packages = sorted(p.parent.name for p in (REPO / "talos_proxmox").glob("*/__init__.py"))
    assert len(packages) >= 8
    missing = [name for name in packages if not list((REPO / "tests" / "unit" / name).glob("test_*.py"))]
    assert missing == []


def test_every_network_stand_in_lives_in_the_stand_ins_package():
    """A test module that serves a protocol (HTTP, gRPC, the PVE API) is a stand-in: in tests/stand_ins/."""
    outside = [str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("*.py")
               if "stand_ins" not in path.parts and any(marker in path.read_text() for marker in SERVER_MARKERS)
               and path.name != "test_layout.py"]
    assert outside == []
