"""Run `__main__.py` in-process under `pulumi.runtime.set_mocks`, as the Pulumi language host would.

`run_program(config)` gives back every resource registration the program made (type, name, parent,
inputs, options) and the stack's exports, so tests and bench/ can assert on the real program.
Config is set the way the engine passes it: `<project>:<key>` -> the string, or JSON text for other values.
"""

from __future__ import annotations

import copy
import json
import runpy
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import pulumi
from pulumi.runtime import settings as runtime_settings
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.stack import run_in_stack
from pulumi.runtime.sync_await import _sync_await

from providers.schematic import INPUTS as SCHEMATIC_INPUTS
from providers.schematic import schematic_outputs
from talos_proxmox.settings.model import PROJECT
from talos_proxmox.settings.stack import stack_file_config
from tests.paths import REPO

MAIN = REPO / "__main__.py"
PROVIDER_KEY = "__provider"


def stack_config(stack: str) -> dict[str, Any]:
    """The project's keys of stacks/Pulumi.<stack>.yaml, prefix stripped (a fresh copy each call)."""
    return copy.deepcopy(stack_file_config(str(REPO / "stacks" / f"Pulumi.{stack}.yaml")))


def with_sections(config: dict[str, Any], **sections: Any) -> dict[str, Any]:
    """A copy of `config` with each section's keys replaced (nodes: {index: that node's changes})."""
    config = copy.deepcopy(config)
    for key, value in sections.items():
        if key == "nodes":
            for index, changes in value.items():
                config["nodes"][index].update(changes)
        else:
            config[key] = {**(config.get(key) or {}), **value}
    return config


@dataclass
class Registration:
    """One resource the program registered, as the engine saw it."""

    urn: str
    type: str
    name: str
    parent: str
    dependencies: list[str]
    protect: bool
    additional_secret_outputs: list[str]
    custom: bool
    ignore_changes: list[str]
    replace_on_changes: list[str]
    delete_before_replace: bool
    inputs: dict  # as registered, with the pickled provider of dynamic resources removed


MOCK_TOKEN_SECRET = "0d1c4e5f-mock-token-secret"


class RecordingMocks(pulumi.runtime.Mocks):
    """Echoes inputs back as outputs with an id, as a create that changes nothing would."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        outputs = dict(args.inputs)
        outputs.pop(PROVIDER_KEY, None)
        if args.typ == "proxmoxve:download/file:File":
            file_id = f"{args.inputs.get('datastoreId')}:iso/{args.inputs.get('fileName')}"
            return file_id, outputs
        if args.typ == "proxmoxve:user/token:Token":
            # PVE answers a token's secret once, at its creation; the provider's `value` is the full token.
            token_id = f"{args.inputs['userId']}!{args.inputs['tokenName']}"
            return token_id, {**outputs, "value": f"{token_id}={MOCK_TOKEN_SECRET}"}
        if args.typ.startswith("pulumi-python:dynamic") and set(SCHEMATIC_INPUTS) <= set(outputs):
            # The Schematic provider's create computes its outputs locally; do the same here.
            outputs.update(schematic_outputs(outputs))
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


class RecordingMonitor(MockMonitor):
    """The SDK's mock monitor, also keeping what the mocks are not shown: parent, dependencies, options."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.registrations: list[Registration] = []
        self._lock = threading.Lock()

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            registration = Registration(
                urn=response.urn, type=request.type, name=request.name, parent=request.parent,
                dependencies=list(request.dependencies), protect=bool(request.protect),
                additional_secret_outputs=list(request.additionalSecretOutputs), custom=bool(request.custom),
                ignore_changes=list(request.ignoreChanges), replace_on_changes=list(request.replaceOnChanges),
                delete_before_replace=bool(request.deleteBeforeReplace), inputs=self.resources[response.urn].state)
            with self._lock:
                self.registrations.append(registration)
        return response


@dataclass
class ProgramRun:
    registrations: list[Registration]
    exports: dict[str, Any] = field(default_factory=dict)
    secret_exports: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)

    def of_type(self, type_: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == type_]

    def named(self, prefix: str, type_: Optional[str] = None) -> list[Registration]:
        return [r for r in self.registrations
                if r.name.startswith(prefix) and (type_ is None or r.type == type_)]

    def one(self, type_: str, name: str) -> Registration:
        found = [r for r in self.registrations if r.type == type_ and r.name == name]
        assert len(found) == 1, f"expected one {type_} named {name}, found {len(found)}"
        return found[0]


class _WarningCollector:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def warning(self, message: str) -> None:
        self.messages.append(message)

    def debug(self, message: str) -> None: ...
    def info(self, message: str) -> None: ...
    def error(self, message: str) -> None: ...


def run_program(config: Mapping[str, Any], stack: str = "test-cluster", preview: bool = False,
                program: Optional[Callable[[], None]] = None, other_config: Optional[Mapping[str, str]] = None,
                secret_keys: Sequence[str] = (), monitor: Optional[RecordingMonitor] = None) -> ProgramRun:
    """Run `__main__.py` (or `program`) once with `config` (top-level keys, no prefix) as the stack's config.

    `other_config` holds keys of other namespaces as given (e.g. `proxmoxve:apiToken`), and
    `secret_keys` the full keys that `pulumi config set --secret` would have marked. `monitor` replaces
    the echoing one.

    Raises whatever the program raises (e.g. pulumi.RunError for a bad stack); the registrations made until then are in
    the exception's `program_run` attribute.
    """
    if monitor is None:
        monitor = RecordingMonitor(RecordingMocks())
    logger = _WarningCollector()
    runtime_settings.ROOT.set(None)
    pulumi.runtime.set_mocks(monitor.mocks, project=PROJECT, stack=stack, preview=preview,
                             logger=logger, monitor=monitor)  # type: ignore[arg-type]
    runtime_settings.ROOT.set(None)  # run_in_stack makes the root Stack, as the language host does
    pulumi.runtime.set_all_config(
        {**{f"{PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in config.items() if v is not None}, **(other_config or {})},
        list(secret_keys))
    run = ProgramRun(registrations=monitor.registrations, warnings=logger.messages)
    stacks: list[Any] = []

    def run_main() -> None:
        runpy.run_path(str(MAIN), run_name="__main__")

    def in_stack() -> None:
        stacks.append(runtime_settings.get_root_resource())  # the Stack lives in the program's context
        (program or run_main)()

    try:
        _sync_await(run_in_stack(in_stack))
    except BaseException as exc:
        exc.program_run = run  # type: ignore[attr-defined]
        raise
    for name, value in stacks[0].outputs.items():
        output = pulumi.Output.from_input(value)
        run.exports[name] = _sync_await(output.future())
        if _sync_await(output.is_secret()):
            run.secret_exports.add(name)
    return run
