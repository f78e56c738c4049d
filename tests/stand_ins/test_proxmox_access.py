"""The stand-in keeps PVE's access objects as PVE does, for the bodies bpg's provider sends (form-encoded,
privileges comma-joined, booleans as 0/1); a token made through it logs in with the privileges its ACL
entries give, and loses them when they go."""

import pytest
import requests

from tests.stand_ins.proxmox_ve import serve_proxmox
from tests.stand_ins.test_proxmox_ve import call, data

USER = "lab-csi@pve"
TOKEN = f"{USER}!kubernetes"


@pytest.fixture
def pve():
    with serve_proxmox() as pve:
        yield pve


def with_token(pve, token_id, secret, path):
    return requests.get(f"{pve.url}/api2/json/{path}", verify=pve.cafile,
                        headers={"Authorization": f"PVEAPIToken={token_id}={secret}"})


def make_identity(pve):
    data(call(pve, "POST", "access/roles", roleid="lab-csi", privs="VM.Audit,Datastore.Audit"))
    data(call(pve, "POST", "access/users", userid=USER, comment="", email="", enable=1, expire=0,
              firstname="", keys="", lastname=""))
    made = data(call(pve, "POST", "access/users/lab-csi@pve/token/kubernetes", privsep=0))
    data(call(pve, "PUT", "access/acl", path="/", roles="lab-csi", users=USER, propagate=1))
    return made


def test_role_user_token_and_acl_are_kept_and_read_back_as_pve_answers(pve):
    made = make_identity(pve)
    assert made["full-tokenid"] == TOKEN and made["info"] == {"privsep": 0, "expire": 0} and made["value"]
    assert data(call(pve, "GET", "access/roles/lab-csi")) == {"Datastore.Audit": 1, "VM.Audit": 1}
    user = data(call(pve, "GET", f"access/users/{USER}"))
    assert (user["enable"], user["expire"], user["groups"]) == (1, 0, [])
    assert "comment" not in user and [t["tokenid"] for t in user["tokens"]] == ["kubernetes"]
    assert data(call(pve, "GET", f"access/users/{USER}/token/kubernetes")) == {"privsep": 0, "expire": 0}
    assert data(call(pve, "GET", "access/acl")) == [
        {"path": "/", "roleid": "lab-csi", "type": "user", "ugid": USER, "propagate": 1}]


def test_the_new_token_holds_exactly_the_role_s_privileges_and_loses_them_with_the_acl_entry(pve):
    secret = make_identity(pve)["value"]
    held = data(with_token(pve, TOKEN, secret, "access/permissions?path=/"))
    assert held == {"/": {"Datastore.Audit": 1, "VM.Audit": 1}}
    data(call(pve, "PUT", "access/roles/lab-csi", privs="VM.Audit,VM.Config.Disk"))
    assert data(with_token(pve, TOKEN, secret, "access/permissions?path=/")) == {
        "/": {"VM.Audit": 1, "VM.Config.Disk": 1}}
    data(call(pve, "PUT", "access/acl", path="/", roles="lab-csi", users=USER, delete=1))
    assert data(call(pve, "GET", "access/acl")) == []
    assert data(with_token(pve, TOKEN, secret, "access/permissions?path=/")) == {}


def test_missing_objects_are_pve_s_errors_and_deleting_the_user_takes_its_token_and_entries(pve):
    secret = make_identity(pve)["value"]
    data(call(pve, "DELETE", f"access/users/{USER}"))
    for path, message in (("access/roles/nope", "role 'nope' does not exist"),
                          (f"access/users/{USER}", f"no such user ('{USER}')"),
                          (f"access/users/{USER}/token/kubernetes", f"no such user ('{USER}')")):
        reply = call(pve, "GET", path)
        assert reply.status_code == 500 and message in reply.json()["message"], path
    assert data(call(pve, "GET", "access/acl")) == []
    assert with_token(pve, TOKEN, secret, "access/permissions").status_code == 401


def test_pve_refuses_a_reserved_role_id_a_duplicate_and_an_unknown_privilege(pve):
    assert call(pve, "POST", "access/roles", roleid="PVECSI", privs="VM.Audit").status_code == 400
    data(call(pve, "POST", "access/roles", roleid="csi", privs="VM.Audit"))
    assert "already exists" in call(pve, "POST", "access/roles", roleid="csi", privs="VM.Audit").json()["message"]
    reply = call(pve, "POST", "access/roles", roleid="other", privs="VM.Audit,VM.Teleport")
    assert reply.status_code == 400 and "VM.Teleport" in reply.text
