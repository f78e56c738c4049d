"""Day two reaches Proxmox with the provider's own settings: stack config first, then PROXMOX_VE_*;
errors name the key and never show a secret; the client it makes logs in to the PVE stand-in."""

import pytest

from talos_proxmox.proxmox_api.access import ProxmoxAccess, ProxmoxAccessError
from tests.stand_ins.proxmox_ve import TOKEN_ID, TOKEN_SECRET, serve_proxmox

TOKEN = "root@pam!pulumi=0b7c4c3e-7f0e-4c8e-9d7a-2f5d3a1b9c11"


def _access(config=None, environ=None):
    return ProxmoxAccess.from_settings((config or {}).get, environ or {})


def test_an_api_token_from_the_stack_config():
    access = _access({"proxmoxve:endpoint": "https://pve.lab.local:8006/", "proxmoxve:apiToken": TOKEN})
    assert (access.host, access.port, access.verify_tls) == ("pve.lab.local", 8006, True)
    assert (access.user, access.token_name, access.token_value) == ("root@pam", "pulumi", TOKEN.split("=")[1])
    assert TOKEN.split("=")[1] not in repr(access)


def test_the_environment_fills_in_what_the_stack_does_not_set():
    access = _access({"proxmoxve:endpoint": "https://10.0.0.5/"},
                     {"PROXMOX_VE_ENDPOINT": "https://ignored:8006/", "PROXMOX_VE_USERNAME": "ops@pve",
                      "PROXMOX_VE_PASSWORD": "hunter22", "PROXMOX_VE_INSECURE": "true"})
    assert (access.host, access.port, access.verify_tls, access.user) == ("10.0.0.5", 8006, False, "ops@pve")
    assert access.token_name is None and "hunter22" not in repr(access)


@pytest.mark.parametrize("config, expected", [
    ({}, "proxmoxve:endpoint is not set (nor PROXMOX_VE_ENDPOINT): expected the Proxmox API's URL"),
    ({"proxmoxve:endpoint": "pve.lab.local"}, "proxmoxve:endpoint: 'pve.lab.local' is not a URL"),
    ({"proxmoxve:endpoint": "https://pve/", "proxmoxve:insecure": "maybe"}, "proxmoxve:insecure: 'maybe' is not true or false"),
    ({"proxmoxve:endpoint": "https://pve/"}, "no Proxmox credentials: set proxmoxve:apiToken"),
    ({"proxmoxve:endpoint": "https://pve/", "proxmoxve:apiToken": "root@pam=0b7c4c3e-secret"},
     "proxmoxve:apiToken (or PROXMOX_VE_API_TOKEN) is not of the form USER@REALM!TOKENID=SECRET (the value is not shown)"),
])
def test_what_is_missing_or_malformed_is_named_by_its_key(config, expected):
    with pytest.raises(ProxmoxAccessError) as failed:
        _access(config)
    assert str(failed.value).startswith(expected)
    assert "0b7c4c3e-secret" not in str(failed.value)


def test_the_client_logs_in_with_the_token_and_reads_the_vm():
    with serve_proxmox() as pve:
        pve.add_vm(9101, "cp-1", node="pve1", status="running")
        access = _access(pve.provider_config())
        assert (access.user, access.token_name, access.token_value) == (
            TOKEN_ID.split("!")[0], TOKEN_ID.split("!")[1], TOKEN_SECRET)
        status = access.connect().nodes("pve1").qemu(9101).status.current.get()
        assert (status["name"], status["status"]) == ("cp-1", "running")
        _method, path, _body = pve.requests[-1]
        assert path == "/api2/json/nodes/pve1/qemu/9101/status/current"
