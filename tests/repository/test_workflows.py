"""The GitHub workflows: previews on pull requests, `pulumi up` on main, secrets only from GitHub secrets."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from talos_proxmox.settings.credentials import is_credential_name
from tests.paths import REPO

WORKFLOWS = REPO / ".github" / "workflows"
STACKS = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in (REPO / "stacks").glob("Pulumi.*.yaml"))
SECRET_REF = re.compile(r"^\$\{\{\s*secrets\.[A-Za-z_][A-Za-z0-9_]*\s*\}\}$")


def _load(name):
    return yaml.safe_load((WORKFLOWS / name).read_text())


def _triggers(workflow):
    # PyYAML reads the bare key `on` as the boolean True (YAML 1.1)
    return workflow.get("on", workflow.get(True))


def _pulumi_job(workflow):
    """The job that runs Pulumi (the other lists the stacks)."""
    (job,) = [j for name, j in workflow["jobs"].items() if name != "stacks"]
    return job


def _pulumi_version():
    text = (REPO / "scripts" / "tool-versions.env").read_text()
    return re.search(r"^PULUMI_VERSION=v?(\S+)$", text, re.MULTILINE).group(1)


def _list_stacks(workflow, cwd: Path, tmp_path: Path) -> list[str]:
    """Run the workflow's own stack-listing step in `cwd`, as the runner would, and read its output."""
    (step,) = [s for s in workflow["jobs"]["stacks"]["steps"] if s.get("id") == "list"]
    output = tmp_path / "github_output"
    output.write_text("")
    subprocess.run(["bash", "-e", "-c", step["run"]], cwd=cwd, check=True,
                   env={**os.environ, "GITHUB_OUTPUT": str(output)})
    (line,) = output.read_text().splitlines()
    name, _, value = line.partition("=")
    assert name == "stacks"
    return json.loads(value)


def _pulumi_step(job):
    steps = [s for s in job["steps"] if str(s.get("uses", "")).startswith("pulumi/actions@")]
    assert len(steps) == 1
    return steps[0]


def _env_blocks(workflow):
    yield "workflow", workflow.get("env") or {}
    for job_name, job in workflow["jobs"].items():
        yield job_name, job.get("env") or {}
        for i, step in enumerate(job.get("steps", [])):
            yield f"{job_name}.steps[{i}]", step.get("env") or {}
            yield f"{job_name}.steps[{i}].with", step.get("with") or {}


@pytest.fixture(params=["preview.yml", "up.yml"])
def workflow(request):
    return _load(request.param)


def test_stacks_exist():
    assert "test-cluster" in STACKS and len(STACKS) >= 2


def test_matrix_is_the_stack_files_read_when_the_workflow_runs(workflow, tmp_path):
    job = _pulumi_job(workflow)
    assert job["needs"] == "stacks"
    assert job["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.stacks.outputs.stacks) }}"
    assert workflow["jobs"]["stacks"]["outputs"]["stacks"] == "${{ steps.list.outputs.stacks }}"
    assert _pulumi_step(job)["with"]["stack-name"] == "${{ matrix.stack }}"
    assert _list_stacks(workflow, REPO, tmp_path) == STACKS
    # A stack file added in a pull request is in the list with no workflow edit.
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "stacks", checkout / "stacks")
    shutil.copy(REPO / "stacks" / "Pulumi.dev.yaml", checkout / "stacks" / "Pulumi.staging.yaml")
    assert _list_stacks(workflow, checkout, tmp_path) == sorted([*STACKS, "staging"])


def test_a_new_stack_is_created_and_the_cli_version_is_pinned(workflow):
    step = _pulumi_step(_pulumi_job(workflow))
    assert step["with"]["upsert"] is True
    assert step["with"]["pulumi-version"] == _pulumi_version()  # the CLI tools.sh builds for the tests


def test_a_self_managed_backend_works_as_pulumi_cloud_does(workflow):
    step = _pulumi_step(_pulumi_job(workflow))
    assert step["with"]["cloud-url"] == "${{ vars.PULUMI_BACKEND_URL }}"
    assert step["env"]["PULUMI_CONFIG_PASSPHRASE"] == "${{ secrets.PULUMI_CONFIG_PASSPHRASE }}"


def test_preview_and_up_of_one_stack_never_run_at_once():
    groups = {name: _pulumi_job(_load(name))["concurrency"] for name in ("preview.yml", "up.yml")}
    assert groups["preview.yml"] == groups["up.yml"] == {"group": "pulumi-${{ matrix.stack }}",
                                                          "cancel-in-progress": False}


def test_each_stack_runs_in_its_environment_preview_in_a_read_only_one():
    assert _pulumi_job(_load("preview.yml"))["environment"]["name"] == "${{ matrix.stack }}-preview"
    assert _pulumi_job(_load("up.yml"))["environment"]["name"] == "${{ matrix.stack }}"


def test_setup_runs_before_pulumi(workflow):
    job = _pulumi_job(workflow)
    runs = [i for i, s in enumerate(job["steps"]) if s.get("run") == "bash scripts/setup.sh"]
    python = [i for i, s in enumerate(job["steps"]) if str(s.get("uses", "")).startswith("actions/setup-python@")]
    pulumi = job["steps"].index(_pulumi_step(job))
    assert python and runs and python[0] < runs[0] < pulumi
    assert job["steps"][python[0]]["with"]["python-version"] == "3.11"


def test_credentials_come_only_from_github_secrets(workflow):
    credentials_seen = set()
    for where, block in _env_blocks(workflow):
        for name, value in block.items():
            text = str(value)
            if "secrets." in text or is_credential_name(name):
                assert SECRET_REF.match(text), f"{where}.{name} must be exactly a ${{{{ secrets.* }}}} reference"
                credentials_seen.add(name)
    job = _pulumi_job(workflow)
    env = _pulumi_step(job)["env"]
    assert env["PULUMI_ACCESS_TOKEN"] == "${{ secrets.PULUMI_ACCESS_TOKEN }}"
    assert env["PROXMOX_VE_API_TOKEN"] == "${{ secrets.PROXMOX_VE_API_TOKEN }}"
    assert {"PULUMI_ACCESS_TOKEN", "PROXMOX_VE_API_TOKEN"} <= credentials_seen
    # nothing that looks like a token literal anywhere in the file
    assert not re.search(r"pul-[0-9a-f]{20,}|![A-Za-z0-9_-]+=[0-9a-f-]{16,}", yaml.safe_dump(workflow))


def test_preview_runs_on_pull_requests_and_comments_the_diff():
    workflow = _load("preview.yml")
    assert set(_triggers(workflow)) == {"pull_request"}
    assert workflow["permissions"]["pull-requests"] == "write"
    job = _pulumi_job(workflow)
    step = _pulumi_step(job)
    assert step["with"]["command"] == "preview"
    assert step["with"]["comment-on-pr"] is True
    assert step["with"]["diff"] is True
    assert job["strategy"]["fail-fast"] is False  # one stack's failure still shows the others' previews


def test_up_runs_only_on_main_one_stack_at_a_time_behind_environment_protection():
    workflow = _load("up.yml")
    triggers = _triggers(workflow)
    assert set(triggers) == {"push"}
    assert triggers["push"] == {"branches": ["main"]}
    job = _pulumi_job(workflow)
    assert job["if"] == "github.ref == 'refs/heads/main'"
    assert job["strategy"]["max-parallel"] == 1
    assert job["strategy"]["fail-fast"] is True
    assert workflow["concurrency"]["cancel-in-progress"] is False
    step = _pulumi_step(job)
    assert step["with"]["command"] == "up"
    assert "pull-requests" not in workflow.get("permissions", {})
