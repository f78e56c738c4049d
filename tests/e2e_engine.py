"""`pulumi up` in-process: the SDK's mocks with the engine's steps for dynamic resources done for real.

For each `pulumi-python:dynamic:Resource` the program registers, `DeploymentMonitor` does what the
engine and the Python dynamic-provider host (pulumi/dynamic/__main__.py) do together:
  - the provider is unpickled from the `__provider` input as the host does (dill under the SDK's
    deserialization context) and configured with the stack config;
  - inputs reach it without secret markers (the host's Configure answers acceptSecrets=False, so
    the engine strips them), `__provider` included, null inputs left out;
  - check(old inputs, new inputs), then create for a URN the previous run did not leave, else
    diff(id, old outputs, checked inputs) and update(id, old outputs, checked inputs) when it reports
    changes; no changes keeps the old outputs;
  - outputs come back with `__provider` added, and secret where the input of the same name was
    secret or the resource lists them in additional_secret_outputs, as the engine marks them.
State (id, checked inputs, outputs) is kept by URN in `state` as the engine stores it (through protobuf:
tuples come back as lists, ints as floats); pass it as `previous` to the next run.
With `preview=True` (run_program(preview=True), as `pulumi preview` and the preview `pulumi up` starts
with): values not known yet reach check and diff as `pulumi.output.Unknown`, as the host deserializes
them; nothing is created or updated, a planned create or update answers its checked inputs (the
outputs it computes stay unknown) and `state` is left as `previous` was.
After the program, `delete_unregistered()` deletes what the previous run left and this one did not
register, as the engine does at the end of a deployment: delete(id, old outputs), dependents first
(here: latest made first), skipped in a preview, which only plans them.
Not emulated: replacements (a diff asking for one fails the run). Proxmox, Kubernetes and Helm
resources are echoed as tests/mocked_program.py does.
"""

from __future__ import annotations

import base64
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import dill
import pulumi
from pulumi.dynamic import Config, ConfigureRequest, ResourceProvider
from pulumi.runtime import rpc
from pulumi.runtime._serialization import _deserialize
from pulumi.runtime.sync_await import _sync_await

from providers.settings import PROJECT
from tests.mocked_program import PROVIDER_KEY, RecordingMocks, RecordingMonitor

DYNAMIC_TYPE = "pulumi-python:dynamic:Resource"


@dataclass(frozen=True)
class ResourceState:
    urn: str
    id: str
    inputs: dict  # as checked, plain values, with __provider
    outputs: dict  # plain values, with __provider
    secret_outputs: frozenset  # the output names the engine marks secret


@dataclass(frozen=True)
class Step:
    urn: str
    name: str
    op: str  # "create", "update", "same" or "delete"


class EngineError(Exception):
    """What `pulumi up` would report for a resource: a check failure or a provider error."""


def stored(properties: dict) -> dict:
    """`properties` as they come back from the engine's state: serialized to protobuf and back."""
    return rpc.deserialize_properties(_sync_await(rpc.serialize_properties(properties, {})))


def load_provider(serialized: str, config: Mapping[str, Any]) -> ResourceProvider:
    """The provider behind a dynamic resource, unpickled and configured as the dynamic-provider host does."""
    provider = _deserialize(lambda: dill.loads(base64.b64decode(serialized)))
    provider.configure(ConfigureRequest(config=Config(raw_config=dict(config), project_name=PROJECT)))
    return provider


class _DeploymentMocks(RecordingMocks):
    def __init__(self, monitor: "DeploymentMonitor") -> None:
        self.monitor = monitor

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        if args.typ == DYNAMIC_TYPE:
            return self.monitor.step(args)
        return super().new_resource(args)


class DeploymentMonitor(RecordingMonitor):
    """A resource monitor for run_program(monitor=...) that deploys dynamic resources (see module doc)."""

    def __init__(self, config: Optional[Mapping[str, Any]] = None,
                 previous: Optional[Mapping[str, ResourceState]] = None, preview: bool = False):
        super().__init__(_DeploymentMocks(self))
        self.config = dict(config or {})  # full keys (`<namespace>:<key>`) as the engine sends them
        self.previous = dict(previous or {})
        self.preview = preview
        self.state: dict[str, ResourceState] = dict(self.previous) if preview else {}
        self.steps: list[Step] = []
        self._providers: dict[str, ResourceProvider] = {}
        self._request = threading.local()  # the RegisterResource request being served on this thread
        self._state_lock = threading.Lock()

    def RegisterResource(self, request):
        self._request.current = request
        try:
            return super().RegisterResource(request)
        finally:
            self._request.current = None

    def _provider(self, serialized: str) -> ResourceProvider:
        with self._state_lock:  # one instance per pickled provider, as the host caches them
            if serialized not in self._providers:
                self._providers[serialized] = load_provider(serialized, self.config)
            return self._providers[serialized]

    def state_named(self, name: str) -> ResourceState:
        [found] = [s for s in self.state.values() if s.urn.endswith(f"::{name}")]
        return found

    def step(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        request = self._request.current
        urn = self.make_urn(request.parent, request.type, request.name)
        secret = {key for key, value in args.inputs.items() if rpc.is_rpc_secret(value)}
        secret |= set(request.additionalSecretOutputs)
        news = {key: rpc.unwrap_rpc_secret(value) for key, value in args.inputs.items()}
        provider = self._provider(news[PROVIDER_KEY])
        old = self.previous.get(urn)
        try:
            checked = provider.check(dict(old.inputs) if old else {}, dict(news))
            if checked.failures:
                raise EngineError(f"{urn}: check failed: "
                                  + "; ".join(f"{f.property}: {f.reason}" for f in checked.failures))
            inputs = {**checked.inputs, PROVIDER_KEY: news[PROVIDER_KEY]}
            if old is None and self.preview:
                op, id_, outputs = "create", "", dict(inputs)
            elif old is None:
                op, created = "create", provider.create(dict(inputs))
                id_, outputs = created.id, created.outs or {}
            else:
                diff = provider.diff(old.id, dict(old.outputs), dict(inputs))
                if diff.replaces:
                    raise EngineError(f"{urn}: diff asks to replace {diff.replaces}; this stand-in does not replace")
                changed = diff.changes if diff.changes is not None else old.inputs != inputs
                if changed and self.preview:
                    op, id_, outputs = "update", old.id, dict(inputs)
                elif changed:
                    op, id_ = "update", old.id
                    outputs = provider.update(old.id, dict(old.outputs), dict(inputs)).outs or {}
                else:
                    op, id_, outputs = "same", old.id, dict(old.outputs)
        except EngineError:
            raise
        except Exception as exc:  # the engine reports a provider error against the resource
            raise EngineError(f"{urn}: {type(exc).__name__}: {exc}") from exc
        outputs = {**outputs, PROVIDER_KEY: inputs[PROVIDER_KEY]}
        with self._state_lock:
            if not self.preview:
                self.state[urn] = ResourceState(urn, id_, stored(inputs), stored(outputs),
                                                frozenset(secret & set(outputs)))
            self.steps.append(Step(urn, request.name, op))
        return id_, {key: rpc.wrap_rpc_secret(value) if key in secret else value for key, value in outputs.items()}

    def delete_unregistered(self) -> None:
        """The end of a deployment: delete each resource of `previous` that this run did not register."""
        registered = {r.urn for r in self.registrations}
        for urn in reversed(list(self.previous)):
            if urn in registered:
                continue
            old = self.previous[urn]
            if not self.preview:
                try:
                    load_provider(old.outputs[PROVIDER_KEY], self.config).delete(old.id, dict(old.outputs))
                except Exception as exc:
                    raise EngineError(f"{urn}: delete failed: {type(exc).__name__}: {exc}") from exc
            self.steps.append(Step(urn, urn.rsplit("::", 1)[1], "delete"))
