"""The API token's privileges (README, "The API token's privileges") through the real CLI and the real
Proxmox provider: a token with exactly that role deploys a cluster; one without the network privilege
the ISO's download needs is stopped in the preview, naming the path and the privilege.

The PVE stand-in checks privileges per path as fakepve models PVE's ACLs (a token holds what is granted
to it; root@pam's token, the other engine tests' one, holds everything).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.engine.cluster import engine_cluster, engine_stack
from tests.paths import REPO

pytestmark = pytest.mark.engine

README = REPO / "README.md"
NODES = [("e2e-cp-1", "controlplane", "127.0.0.62")]
TALOS = "v1.13.7"
TOKEN_ID, TOKEN_SECRET = "pulumi@pve!deploy", "4c1e2a7b-9d3f-4b6a-8e2c-5f7a9b1d3e60"  # a stand-in's token
# The role the README documents, granted on / (the paths below / inherit it).
ROLE = ("Sys.AccessNetwork", "Datastore.AllocateTemplate", "Datastore.AllocateSpace", "Datastore.Audit",
        "VM.Allocate", "VM.Audit", "VM.PowerMgmt", "VM.Config.Disk", "VM.Config.CDROM", "VM.Config.CPU",
        "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options", "VM.Config.HWType", "SDN.Use")


def test_the_readme_documents_every_privilege_of_the_role():
    table = README.read_text().split("## The API token's privileges", 1)[1].split("\n## ", 1)[0]
    assert set(ROLE) <= set(re.findall(r"`([A-Z][A-Za-z]+\.[A-Za-z.]+)`", table))


def deploy_with_token(tmp_path: Path, privileges, fails: bool):
    with engine_cluster(tmp_path, NODES, TALOS) as (cluster, project):
        cluster.pve.apitokens[TOKEN_ID] = TOKEN_SECRET
        cluster.pve.grant(TOKEN_ID, "/", *privileges)
        project.cli("config", "set", "--secret", "proxmoxve:apiToken", "--stack", project.stack,
                    stdin=f"{TOKEN_ID}={TOKEN_SECRET}")
        config = engine_stack(cluster, NODES, TALOS, tmp_path / "secrets.yaml")
        return cluster.deploy(project, config, tmp_path / "render", fails=fails), cluster


def test_a_token_with_the_documented_role_deploys_the_cluster(tmp_path):
    up, cluster = deploy_with_token(tmp_path, ROLE, fails=False)
    assert up.modes == {"e2e-cp-1": "configured"}
    assert [vm.name for vm in cluster.pve.vms] == ["e2e-cp-1"]


def test_a_token_without_the_network_privilege_is_stopped_in_the_preview_naming_it(tmp_path):
    """PVE itself answers that call with a bare "Permission check failed" (its check has alternatives), which
    the provider would print half-way through the first up; the preview names what is missing instead."""
    up, cluster = deploy_with_token(tmp_path, [p for p in ROLE if p != "Sys.AccessNetwork"], fails=True)
    assert up.stopped_in_preview
    assert ("the Proxmox API token may not download the Talos ISO onto pve (query-url-metadata, download-url): "
            "it lacks Sys.AccessNetwork on /nodes/pve or Sys.Audit on /, Sys.Modify on /") in up.error
    assert cluster.pve.requests == [] and cluster.pve.vms == []  # nothing asked of PVE but the privileges
    assert "/nodes/pve" in cluster.pve.privilege_reads
    assert TOKEN_SECRET not in up.up.output
