"""The real Pulumi CLI (.tools/bin, built by scripts/tools.sh) on a copy of this project's layout.

A `PulumiProject` is a temporary project directory whose Pulumi.yaml, program and packages are links to
this checkout's, with a stack file of its own under stacks/, a local file backend, a passphrase secrets
provider and a PULUMI_HOME of its own: nothing is read from or written to the user's Pulumi setup, and
the CLI never reaches the network (no update check, no plugin downloads). Each CLI call's output is
kept; with `--json`, `up` and `destroy` print the engine's events (one JSON object a line) and `preview`
its plan (one JSON document), which is what the tests read.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import yaml

from talos_proxmox.settings.model import PROJECT
from tests.paths import REPO

TOOLS = REPO / ".tools" / "bin"
PROGRAM = ("Pulumi.yaml", "__main__.py", "components", "providers", "talos_proxmox", ".venv")
REQUIRED_TOOLS = ("pulumi", "pulumi-language-python", "pulumi-language-python-exec", "pulumi-resource-pulumi-python",
                  "pulumi-resource-proxmoxve")
PASSPHRASE = "engine-tier-passphrase"  # the test stacks' secrets provider; guards nothing real


def missing_tools() -> list[str]:
    return [name for name in REQUIRED_TOOLS if not os.access(TOOLS / name, os.X_OK)]


@dataclass
class CliRun:
    """One CLI command: its arguments, exit code, what it printed and the engine events it logged."""

    args: Sequence[str]
    returncode: int
    stdout: str
    stderr: str
    events: list[dict] = field(default_factory=list)  # `up`/`destroy --json`: the engine's events
    plan: dict = field(default_factory=dict)  # `preview --json`: steps, diagnostics, changeSummary

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def steps(self, *ops: str) -> dict[str, str]:
        """{resource name: op} of the custom resources' steps (the stack, components and providers left
        out): those the engine finished (an up's resource-outputs events) or planned (a preview's steps,
        which leave out what stays the same); `ops` keeps only those ops."""
        if self.plan:
            metadata = self.plan.get("steps") or []
        else:
            metadata = [event["resOutputsEvent"]["metadata"] for event in self.events if "resOutputsEvent" in event]
        by_name: dict[str, list[str]] = {}
        for step in metadata:
            if _custom(step):
                by_name.setdefault(_name(step), []).append(step["op"])
        found = {}
        for name, name_ops in by_name.items():
            # A replacement's parts (the new one made, the old one deleted) are one "replace", as planned;
            # an old one's delete alone is what a failed up's replacement left to finish.
            if {"replace", "create-replacement"} & set(name_ops):
                found[name] = "replace"
            else:
                found[name] = name_ops[-1]
        return {name: op for name, op in found.items() if not ops or op in ops}

    def changes(self) -> dict[str, str]:
        """steps() without those that stay the same: what a preview lists."""
        return {name: op for name, op in self.steps().items() if op != "same"}

    def started(self) -> list[tuple[str, str]]:
        """(op, resource name) of each custom resource's step, in the order the engine began them."""
        return [(step["op"], _name(step)) for step in
                (event["resourcePreEvent"]["metadata"] for event in self.events if "resourcePreEvent" in event)
                if _custom(step)]

    def diagnostics(self, severity: str) -> list[str]:
        """The engine's diagnostics of `severity` (error, warning, info, info#err), as printed."""
        if self.plan:
            return [d["message"] for d in self.plan.get("diagnostics") or [] if d.get("severity") == severity]
        return [event["diagnosticEvent"]["message"] for event in self.events
                if event.get("diagnosticEvent", {}).get("severity") == severity]

    def summary(self) -> dict[str, int]:
        """Counts of steps by op, as the CLI's closing "Resources:" lines give them."""
        if self.plan:
            return self.plan.get("changeSummary") or {}
        for event in reversed(self.events):
            if "summaryEvent" in event:
                return event["summaryEvent"].get("resourceChanges") or {}
        return {}


def _in_flight(stdout: str | bytes) -> str:
    """What a `--json` run that had to be stopped was doing: the steps begun and not finished, and its
    last progress lines."""
    text = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout
    begun, finished, lines = {}, set(), []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if "resourcePreEvent" in event:
            metadata = event["resourcePreEvent"]["metadata"]
            begun[_name(metadata)] = metadata["op"]
        elif "resOutputsEvent" in event:
            finished.add(_name(event["resOutputsEvent"]["metadata"]))
        elif "diagnosticEvent" in event:
            lines.append(event["diagnosticEvent"]["message"].rstrip())
    running = {name: op for name, op in begun.items() if name not in finished}
    return f"steps still running: {running}; last lines:\n" + "\n".join(lines[-15:])


def _name(step: dict) -> str:
    return step["urn"].rsplit("::", 1)[1]


def _custom(step: dict) -> bool:
    """A step of a custom resource other than a provider (components have no provider, nor the stack)."""
    state = step.get("newState") or step.get("new") or step.get("oldState") or step.get("old") or {}
    return bool(state.get("custom") or state.get("provider")) and not step["urn"].split("::")[2].startswith(
        "pulumi:providers:")


class PulumiProject:
    """The program in `workdir`/project, stack `stack` on a file backend in `workdir`/state."""

    def __init__(self, workdir: Path, stack: str = "engine") -> None:
        self.workdir, self.stack = workdir, stack
        self.project = workdir / "project"
        self.project.mkdir(parents=True)
        for name in PROGRAM:
            (self.project / name).symlink_to(REPO / name)
        (self.project / "stacks").mkdir()
        self.backend = workdir / "state"
        self.backend.mkdir()
        (workdir / "home").mkdir()
        self.runs: list[CliRun] = []

    def elsewhere(self, name: str) -> "PulumiProject":
        """The same program and stack (its stack file too) on another, empty backend `name` (as a second
        machine, or CI, with a backend of its own); `pulumi stack init` it before use."""
        other = copy.copy(self)
        other.backend, other.runs = self.workdir / name, []
        other.backend.mkdir()
        return other

    @property
    def stack_file(self) -> Path:
        return self.project / "stacks" / f"Pulumi.{self.stack}.yaml"

    def env(self) -> dict[str, str]:
        # The engine finds the plugins scripts/tools.sh built on PATH (no plugin is ever downloaded).
        path = os.pathsep.join([str(TOOLS), str(REPO / ".venv" / "bin"), os.environ["PATH"]])
        keep = {key: value for key, value in os.environ.items()
                if not key.startswith(("PULUMI_", "PROXMOX_VE_")) and key not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return {
            **keep,
            "PATH": path,
            "PULUMI_HOME": str(self.workdir / "home"),
            "PULUMI_BACKEND_URL": self.backend.as_uri(),
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            # The dynamic-provider launcher runs the program's venv (Pulumi.yaml names it relative to the
            # project, which here is a directory of links).
            "PULUMI_RUNTIME_VIRTUALENV": str(REPO / ".venv"),
        }

    def cli(self, *args: str, check: bool = True, timeout: float = 600, stdin: Optional[str] = None) -> CliRun:
        command = [str(TOOLS / "pulumi"), *args, "--non-interactive", "--cwd", str(self.project)]
        try:
            done = subprocess.run(command, env=self.env(), capture_output=True, text=True, timeout=timeout,
                                  input=stdin)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"pulumi {' '.join(args)} still ran after {timeout:g}s; "
                                 f"{_in_flight(exc.stdout or '')}") from None
        run = CliRun(args, done.returncode, done.stdout, done.stderr)
        if "--json" in args and done.stdout.lstrip().startswith("{"):
            try:
                run.plan = json.loads(done.stdout)
            except json.JSONDecodeError:  # not one document: a stream of events, one a line
                run.events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        self.runs.append(run)
        if check and run.returncode != 0:
            # The engine's errors first: the tail of a failed up is its closing events and tracebacks.
            errors = "".join(run.diagnostics("error") + [line for line in run.diagnostics("info#err")
                                                         if "talos-proxmox:" in line or "Error" in line][-20:])
            raise AssertionError(f"pulumi {' '.join(args)} exited {run.returncode}:\n{errors}\n"
                                 f"{run.output[-3000:]}")
        return run

    def init(self, config: Mapping[str, Any], other: Mapping[str, str] = {}, secrets: Mapping[str, str] = {}) -> None:
        """`pulumi stack init` with the passphrase provider, then the stack's config: `config` as
        `talos-proxmox:<key>` values and `other` (full keys) in the stack file, `secrets` (full keys) set
        with --secret."""
        self.cli("stack", "init", self.stack, "--secrets-provider", "passphrase")
        self.set_config(config, other)
        for key, value in secrets.items():
            self.cli("config", "set", "--secret", key, "--stack", self.stack, stdin=value)

    def set_config(self, config: Mapping[str, Any], other: Mapping[str, str] = {}) -> None:
        """Replace the stack's `talos-proxmox:` settings (as a user edits the stack file); other keys stay."""
        document = yaml.safe_load(self.stack_file.read_text()) or {}
        kept = {key: value for key, value in (document.get("config") or {}).items()
                if not key.startswith(f"{PROJECT}:")}
        document["config"] = {**kept, **other, **{f"{PROJECT}:{key}": value for key, value in config.items()}}
        self.stack_file.write_text(yaml.safe_dump(document, sort_keys=False))

    def up(self, *extra: str, check: bool = True) -> CliRun:
        return self.cli("up", "--yes", "--skip-preview", "--json", "--stack", self.stack, *extra, check=check)

    def up_until(self, when: Callable[[dict], bool], act: Callable[[subprocess.Popen], None], *extra: str,
                 timeout: float = 600, verb: str = "up") -> CliRun:
        """`pulumi up` (or `verb`: destroy), and `act(process)` once, as soon as it prints an engine event `when`
        accepts; the run as far as it got. It runs in a session of its own (as a terminal's job does), killed at
        `timeout`."""
        command = [str(TOOLS / "pulumi"), verb, "--yes", "--skip-preview", "--json", "--stack", self.stack,
                   *extra, "--non-interactive", "--cwd", str(self.project)]
        process = subprocess.Popen(command, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        stderr: list[str] = []
        reader = threading.Thread(target=lambda: stderr.extend(process.stderr), daemon=True)
        reader.start()
        timer = threading.Timer(timeout, os.killpg, args=(process.pid, signal.SIGKILL))
        timer.start()
        lines, events, acted = [], [], False
        try:
            for line in process.stdout:
                lines.append(line)
                if line.startswith("{"):
                    try:
                        events.append(json.loads(line))
                    except ValueError:  # the last line of a killed run, cut short
                        continue
                    if not acted and when(events[-1]):
                        acted = True
                        act(process)
        finally:
            timer.cancel()
            process.wait()
            reader.join(10)
        run = CliRun((verb, "--json"), process.returncode, "".join(lines), "".join(stderr), events)
        self.runs.append(run)
        assert acted, f"pulumi {verb} ended ({process.returncode}) before the event to act at:\n{run.output[-3000:]}"
        return run

    def up_killed(self, when: Callable[[dict], bool], *extra: str, timeout: float = 600, verb: str = "up") -> CliRun:
        """`pulumi up` (or `verb`) killed with SIGKILL, its whole process group (as a closed laptop lid or a cancelled CI
        job kills it), as soon as it prints an engine event `when` accepts; the run as far as it got
        (returncode -9). Plugins the CLI started in process groups of their own live on, as they do then."""
        return self.up_until(when, lambda process: os.killpg(process.pid, signal.SIGKILL), *extra, timeout=timeout,
                             verb=verb)

    def preview(self, *extra: str, check: bool = True) -> CliRun:
        return self.cli("preview", "--json", "--stack", self.stack, *extra, check=check)

    def destroy(self, *extra: str, check: bool = True) -> CliRun:
        return self.cli("destroy", "--yes", "--skip-preview", "--json", "--stack", self.stack, *extra, check=check)

    def restore_latest_backup(self) -> None:
        """What a user does when a killed run cut the state file mid-write ("failed to load checkpoint"):
        `pulumi stack import` of the newest copy the file backend kept under .pulumi/backups/."""
        backups = sorted((self.backend / ".pulumi" / "backups").rglob(f"{self.stack}.*.json"),
                         key=lambda path: path.stat().st_mtime)
        assert backups, "no state backup to restore"
        checkpoint = json.loads(backups[-1].read_text())  # {"version", "checkpoint": {"stack", "latest"}}
        deployment = self.workdir / "restored-deployment.json"
        deployment.write_text(json.dumps({"version": 3, "deployment": checkpoint["checkpoint"]["latest"]}))
        self.cli("stack", "import", "--force", "--file", str(deployment), "--stack", self.stack)

    def export(self) -> dict:
        """The stack's state as `pulumi stack export` prints it (secrets encrypted)."""
        return json.loads(self.cli("stack", "export", "--stack", self.stack).stdout)
