"""Credentials only from secret config or the environment: the check over stack config."""

import copy

import pytest
import yaml

from talos_proxmox.settings.credentials import (
    PROXMOX_CREDENTIALS,
    CredentialsError,
    ensure_no_plaintext_credentials,
    plain_leaves,
    plaintext_credentials,
)
from talos_proxmox.settings.model import SettingsError
from talos_proxmox.settings.stack import stack_file_values
from talos_proxmox.settings.stack_config import StackConfig, load_stack, mask_secrets
from tests.paths import REPO, STACKS

STACK_FILES = sorted(STACKS.glob("Pulumi.*.yaml"))
TOKEN = "root@pam!pulumi=5f0c1d9e-aaaa-bbbb-cccc-0123456789ab"
SECURE = {"secure": "v1:Zm9vYmFy:ciphertext"}


def test_there_are_stack_files():
    assert len(STACK_FILES) >= 2


@pytest.mark.parametrize("stack", STACK_FILES, ids=lambda p: p.name)
def test_no_stack_file_holds_a_plaintext_credential(stack):
    config = yaml.safe_load(stack.read_text())["config"]
    assert plaintext_credentials(config) == []


def test_plain_api_token_is_flagged_with_key_and_both_remedies_but_not_the_value():
    problems = plaintext_credentials({"proxmoxve:endpoint": "https://pve:8006/", "proxmoxve:apiToken": TOKEN})
    assert len(problems) == 1
    assert problems[0].startswith("proxmoxve:apiToken: ")
    assert "pulumi config set --secret proxmoxve:apiToken" in problems[0]
    assert "PROXMOX_VE_API_TOKEN" in problems[0]
    assert TOKEN not in problems[0] and "5f0c1d9e" not in problems[0]


def test_secure_values_and_plain_non_credentials_pass():
    assert plaintext_credentials({
        "proxmoxve:endpoint": "https://pve:8006/",
        "proxmoxve:insecure": True,
        "proxmoxve:username": "root@pam",  # an identity, not a secret
        "proxmoxve:apiToken": SECURE,
        "proxmoxve:password": SECURE,
        "proxmoxve:ssh": {"username": "root", "privateKey": SECURE, "agent": True},
        "talos-proxmox:cluster": {"name": "c", "secretsFile": "secrets.yaml"},
    }) == []


def test_username_with_plain_password_flags_the_password():
    problems = plaintext_credentials({"proxmoxve:username": "root@pam", "proxmoxve:password": "hunter2"})
    assert [p.split(": a credential")[0] for p in problems] == ["proxmoxve:password"]
    assert "PROXMOX_VE_PASSWORD" in problems[0] and "hunter2" not in problems[0]


def test_every_provider_credential_key_is_flagged_when_plain():
    config = {}
    for path in PROXMOX_CREDENTIALS:
        key, _, nested = path.partition(".")
        if nested:
            config.setdefault(key, {})[nested] = "plain-value"
        else:
            config[key] = "plain-value"
    flagged = {p.split(": a credential")[0] for p in plaintext_credentials(config)}
    assert flagged == set(PROXMOX_CREDENTIALS)


def test_nested_credentials_anywhere_are_flagged_with_a_path_remedy():
    problems = plaintext_credentials({
        "proxmoxve:ssh": {"username": "root", "password": "ssh-pass"},
        "talos-proxmox:cluster": {"patches": [
            {"machine": {"registries": {"config": {"registry.lab": {"auth": {"password": "reg-pass"}}}}}}]},
        "kubernetes:kubeconfig": "apiVersion: v1\nkind: Config\n",
    })
    paths = [p.split(": a credential")[0] for p in problems]
    assert paths == [
        "kubernetes:kubeconfig",
        "proxmoxve:ssh.password",
        "talos-proxmox:cluster.patches[0].machine.registries.config.registry.lab.auth.password",
    ]
    assert "--path 'proxmoxve:ssh.password'" in problems[1] and "PROXMOX_VE_SSH_PASSWORD" in problems[1]
    assert all("ssh-pass" not in p and "reg-pass" not in p for p in problems)


def test_a_list_under_a_credential_key_is_flagged_item_by_item():
    problems = plaintext_credentials({
        "talos-proxmox:cluster": {"patches": [{"machine": {"env": {"HTTP_PROXY": "http://proxy"}}}],
                                  "registryCredentials": ["user-a:pass-a", "user-b:pass-b"],
                                  "secret": [["nested-1"]]},
        "talos-proxmox:nodes": [{"name": "n1", "tags": ["token-looking-value"]}],
    })
    assert [p.split(": a credential")[0] for p in problems] == [
        "talos-proxmox:cluster.registryCredentials[0]", "talos-proxmox:cluster.registryCredentials[1]",
        "talos-proxmox:cluster.secret[0][0]",
    ]
    assert all(s not in "".join(problems) for s in ("pass-a", "pass-b", "nested-1"))


def test_runtime_config_secret_keys_pass_plain_ones_raise():
    runtime = {"proxmoxve:apiToken": TOKEN, "proxmoxve:endpoint": "https://pve:8006/",
               "proxmoxve:ssh": '{"username": "root", "password": "ssh-pass"}'}
    secret_keys = {"proxmoxve:apiToken"}
    shaped = StackConfig.from_runtime(runtime, secret_keys.__contains__).shaped()
    assert TOKEN not in str(shaped)
    with pytest.raises(CredentialsError) as err:
        ensure_no_plaintext_credentials(shaped)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith("proxmoxve:ssh.password: ")
    assert "ssh-pass" not in str(err.value)
    ensure_no_plaintext_credentials(StackConfig.from_runtime(runtime, {"proxmoxve:apiToken", "proxmoxve:ssh"}.__contains__).shaped())


def test_the_programs_check_reads_the_runtime_config_the_language_host_sets():
    """What __main__.py runs before any resource, against config set as the Pulumi language host sets it."""
    from pulumi.runtime import config as runtime_config

    def program_check():
        ensure_no_plaintext_credentials(
            StackConfig.from_runtime(runtime_config.CONFIG.get(), runtime_config.is_config_secret).shaped())

    try:
        runtime_config.set_all_config({"proxmoxve:apiToken": TOKEN, "proxmoxve:endpoint": "https://pve:8006/"},
                                      ["proxmoxve:apiToken"])
        program_check()
        runtime_config.set_all_config({"proxmoxve:apiToken": TOKEN}, [])
        with pytest.raises(CredentialsError, match="proxmoxve:apiToken") as err:
            program_check()
        assert TOKEN not in str(err.value)
    finally:
        runtime_config.set_all_config({}, [])


@pytest.mark.parametrize("name", ["private_key", "api_key", "access_key", "db_password", "ssh_private_key"])
def test_snake_case_credential_names_are_flagged(name):
    problems = plaintext_credentials({"talos-proxmox:cilium": {"values": {"backup": {name: "plain-value"}}}})
    assert [p.split(": a credential")[0] for p in problems] == [f"talos-proxmox:cilium.values.backup.{name}"]


@pytest.mark.parametrize("value", [None, "", True, False])
def test_an_unset_or_on_off_value_under_a_credential_name_holds_no_credential(value):
    config = {"proxmoxve:password": value, "talos-proxmox:cilium": {"values": {"useToken": value}}}
    assert plaintext_credentials(config) == []


def test_plain_leaves_skip_encrypted_values_at_any_depth():
    assert list(plain_leaves({"user": "root", "password": SECURE, "keys": [SECURE, "k2"]}, "proxmoxve:ssh")) == [
        ("proxmoxve:ssh.user", "root"), ("proxmoxve:ssh.keys[1]", "k2")]
    assert list(plain_leaves(SECURE, "proxmoxve:apiToken")) == []


def test_the_error_lists_every_credential_under_one_heading():
    with pytest.raises(CredentialsError) as err:
        ensure_no_plaintext_credentials({"proxmoxve:apiToken": TOKEN, "proxmoxve:password": "hunter22"})
    assert str(err.value) == (
        "credentials in plain text in the stack config:\n"
        "  - proxmoxve:apiToken: a credential in plain text; expected a secret (`pulumi config set --secret "
        "proxmoxve:apiToken ...` or the PROXMOX_VE_API_TOKEN environment variable)\n"
        "  - proxmoxve:password: a credential in plain text; expected a secret (`pulumi config set --secret "
        "proxmoxve:password ...` or the PROXMOX_VE_PASSWORD environment variable)")


# ---------------------------------------------------------------- secret values in the lines of a bad stack

DEV = stack_file_values(str(REPO / "stacks" / "Pulumi.dev.yaml"))


def test_a_secret_value_quoted_under_another_key_is_masked():
    """A token pasted into cluster.name by mistake: the line names the key but shows no token."""
    values = {**copy.deepcopy(DEV), "proxmoxve:apiToken": TOKEN}
    values["talos-proxmox:cluster"]["name"] = TOKEN
    with pytest.raises(SettingsError) as err:
        load_stack(StackConfig(values, frozenset({"proxmoxve:apiToken"})), base_dir=REPO)
    assert err.value.problems == [
        "talos-proxmox:cluster.name: '[secret]' is not a cluster name (expected lowercase letters, digits and '-', "
        "at most 63)"]


def test_warnings_about_a_secret_key_show_neither_its_value_nor_its_strings():
    values = copy.deepcopy(DEV)
    values["talos-proxmox:nodes"][0]["cpu"] = 1
    settings = load_stack(StackConfig(values, frozenset({"talos-proxmox:nodes"})), base_dir=REPO)
    assert settings.warnings == (
        "talos-proxmox:nodes[0].cpu: [secret] vCPU for control plane [secret] is below Talos's minimum of 2 for a "
        "control plane",)


@pytest.mark.parametrize("lines, secrets, masked", [
    # The longer secret first, though it sorts before the shorter one: no tail of it stays visible.
    (["token a-pass-word-2 here", "and pass-word"], {"pass-word", "a-pass-word-2"},
     ["token [secret] here", "and [secret]"]),
    # Four characters are masked; shorter strings ("on", "1") would mask unrelated words.
    (["pin 1234, mode abc"], {"1234", "abc"}, ["pin [secret], mode abc"]),
])
def test_mask_secrets_replaces_every_secret_string(lines, secrets, masked):
    assert mask_secrets(lines, secrets) == masked
