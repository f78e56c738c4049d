"""The Talos API client against a stand-in node over real TLS (Ed25519 certificates from a
generated secrets bundle), plus its pure helpers."""

import functools
import socket
import threading
import time

import grpc
import pytest

from talos_proxmox.talos_config import pki, client_config, secrets_bundle
from talos_proxmox.talos_api import errors
from talos_proxmox.talos_api.client import ClientCredentials, TalosClient, read_talosconfig, split_endpoint
from talos_proxmox.talos_api.kubeconfig import extract_kubeconfig
from talos_proxmox.talos_api.retry import Backoff, GaveUp, call_with_retry
from tests.stand_ins.talos_api import (  # noqa: F401 - fixtures
    FakeTalosNode, client_credentials, configured_node, maintenance_node, shared_bundle, talos_style_tgz)

KUBECONFIG = "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n"


def _bundle(name: str = "cluster"):
    return shared_bundle(name)


@functools.lru_cache(maxsize=None)
def _admin_of(name: str) -> ClientCredentials:
    return client_credentials(_bundle(name))


def _admin(name: str = "cluster") -> ClientCredentials:
    return _admin_of(name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _secret_texts(credentials: ClientCredentials) -> list[str]:
    key = pki.standard_key_pem(credentials.key_pem).decode()
    body = "".join(line for line in key.splitlines() if "-----" not in line)
    return ["PRIVATE KEY", body[:40], pki.b64_pem(credentials.key_pem)[:40]]


# --- insecure and mTLS --------------------------------------------------------------------------


def test_insecure_first_apply_to_a_maintenance_node(maintenance_node):
    with TalosClient([maintenance_node.endpoint]) as talos:
        assert talos.insecure
        reply = talos.apply_configuration(b"version: v1alpha1\n", mode="auto")
    message = reply.messages[0]
    assert message.mode == 2  # AUTO resolved to NO_REBOOT, as Talos reports it
    assert message.mode_details == "Applied configuration without a reboot"
    call = maintenance_node.calls_for("ApplyConfiguration")[0]
    assert (call.mode, call.roles, call.request.data) == ("maintenance", (), b"version: v1alpha1\n")
    assert "node" not in call.metadata


def test_mtls_reapply_after_the_node_rebooted_configured(maintenance_node):
    with TalosClient([maintenance_node.endpoint]) as insecure:
        insecure.apply_configuration(b"first\n")
    with TalosClient([maintenance_node.endpoint], credentials=_admin(), node="127.0.0.1") as talos:
        # the node reboots into configured mode: unavailable for a moment, then mTLS works
        call_with_retry(lambda remaining: talos.version(timeout=remaining), timeout=10, what="wait",
                        backoff=Backoff(initial=0.1, maximum=0.5), retry_if=errors.transient_while_rebooting)
        reply = talos.apply_configuration(b"second\n", mode="no-reboot")
    assert reply.messages[0].metadata.hostname == ""  # a single-node call: apid does not proxy or mark it
    assert maintenance_node.config == b"second\n"
    last = maintenance_node.calls_for("ApplyConfiguration")[-1]
    assert (last.mode, last.roles, last.metadata["node"]) == ("configured", ("os:admin",), ["127.0.0.1"])


def test_dry_run_returns_the_nodes_diff_and_changes_nothing(configured_node):
    configured_node.config = b"a: 1\n"
    with TalosClient([configured_node.endpoint], credentials=_admin()) as talos:
        reply = talos.apply_configuration(b"a: 2\n", dry_run=True)
    assert reply.messages[0].mode_details.startswith("Dry run summary:")
    assert "-a: 1" in reply.messages[0].mode_details and "+a: 2" in reply.messages[0].mode_details
    assert configured_node.config == b"a: 1\n"


def test_insecure_to_a_configured_node_says_it_is_configured(configured_node):
    with TalosClient([configured_node.endpoint]) as talos:
        with pytest.raises(errors.TalosTlsError) as caught:
            talos.apply_configuration(b"x")
    assert caught.value.reason == "client-cert-required"
    assert configured_node.endpoint in str(caught.value)
    assert configured_node.calls == []


def test_wrong_client_ca_is_refused(configured_node):
    stranger = client_credentials(_bundle("other cluster"))
    # trusts the right server CA, but presents a certificate from another cluster's OS CA
    credentials = ClientCredentials(ca_pem=_admin().ca_pem, cert_pem=stranger.cert_pem, key_pem=stranger.key_pem)
    with TalosClient([configured_node.endpoint], credentials=credentials) as talos:
        with pytest.raises(errors.TalosTlsError) as caught:
            talos.version()
    assert caught.value.reason == "client-cert-refused"
    assert "wrong client CA" in str(caught.value) and configured_node.endpoint in str(caught.value)
    assert not any(text in str(caught.value) for text in _secret_texts(stranger))
    assert configured_node.calls == []


def test_server_from_another_ca_is_not_trusted(maintenance_node):
    with TalosClient([maintenance_node.endpoint], credentials=_admin()) as talos:
        with pytest.raises(errors.TalosTlsError) as caught:
            talos.version()
    assert caught.value.reason == "server-not-trusted"
    assert maintenance_node.calls == []


def test_reader_role_may_not_apply(configured_node):
    reader = client_credentials(_bundle(), role="os:reader")
    with TalosClient([configured_node.endpoint], credentials=reader) as talos:
        assert talos.version().messages[0].version.tag == "v1.11.5"
        with pytest.raises(errors.TalosPermissionDenied, match="os:admin"):
            talos.apply_configuration(b"x")


# --- availability, timeouts, failover -----------------------------------------------------------


def test_rebooting_node_unavailable_then_success(configured_node):
    configured_node.go_down()
    with TalosClient([configured_node.endpoint], credentials=_admin()) as talos:
        with pytest.raises(errors.TalosUnavailable, match="rebooting"):
            talos.version()
        threading.Timer(0.6, configured_node.come_up).start()
        attempts = []

        def version(remaining):
            attempts.append(remaining)
            return talos.version(timeout=min(remaining, 5))

        reply = call_with_retry(version, timeout=10, what="wait for node", backoff=Backoff(initial=0.2, maximum=0.2))
    assert reply.messages[0].version.tag == "v1.11.5"
    assert len(attempts) >= 2


def test_slow_node_hits_the_deadline(configured_node):
    configured_node.delays["ApplyConfiguration"] = 1.5
    with TalosClient([configured_node.endpoint], credentials=_admin()) as talos:
        started = time.monotonic()
        with pytest.raises(errors.TalosDeadlineExceeded, match=configured_node.endpoint):
            talos.apply_configuration(b"x", timeout=0.3)
        assert time.monotonic() - started < 1.4


def test_overall_timeout_while_node_stays_down(configured_node):
    configured_node.go_down()
    with TalosClient([configured_node.endpoint], credentials=_admin()) as talos:
        with pytest.raises(GaveUp) as caught:
            call_with_retry(lambda remaining: talos.version(timeout=remaining), timeout=0.8, what="node",
                            backoff=Backoff(initial=0.1, maximum=0.1))
    assert isinstance(caught.value.last_error, errors.TalosUnavailable)
    assert caught.value.attempts >= 3
    assert configured_node.endpoint in str(caught.value)


def test_failover_to_the_next_endpoint(configured_node):
    dead = f"127.0.0.1:{_free_port()}"
    with TalosClient([dead, configured_node.endpoint], credentials=_admin()) as talos:
        assert talos.version().messages[0].version.tag == "v1.11.5"
        talos.version()
    assert len(configured_node.calls_for("Version")) == 2


def test_all_endpoints_down_names_them():
    dead = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
    with TalosClient(dead, credentials=_admin()) as talos:
        with pytest.raises(errors.TalosUnavailable) as caught:
            talos.version()
    assert all(endpoint in str(caught.value) for endpoint in dead)


def test_injected_failure_is_mapped_with_code_and_endpoint(configured_node):
    configured_node.fail_next("EtcdMemberList", grpc.StatusCode.FAILED_PRECONDITION, "etcd is not running")
    with TalosClient([configured_node.endpoint], credentials=_admin()) as talos:
        with pytest.raises(errors.TalosApiError) as caught:
            talos.etcd_member_list()
        assert talos.etcd_member_list().messages[0].members[0].id == 0x1234ABCD
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert str(caught.value) == (f"Talos API EtcdMemberList at {configured_node.endpoint}: "
                                 "FAILED_PRECONDITION: etcd is not running")


# --- bootstrap and kubeconfig -------------------------------------------------------------------


def test_bootstrap_twice_reports_already_exists(configured_node):
    with TalosClient([configured_node.endpoint], credentials=_admin()) as talos:
        talos.bootstrap()
        with pytest.raises(errors.TalosApiError) as caught:
            talos.bootstrap()
    assert caught.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert "etcd data directory is not empty" in str(caught.value)
    assert configured_node.bootstrapped


@pytest.mark.parametrize("fmt, chunk", [("tgz", 0), ("tgz", 16), ("plain", 5)])
def test_kubeconfig_stream(configured_node, fmt, chunk):
    configured_node.kubeconfig_yaml, configured_node.kubeconfig_format = KUBECONFIG, fmt
    configured_node.kubeconfig_chunk = chunk
    with TalosClient([configured_node.endpoint], credentials=_admin()) as talos:
        data = talos.kubeconfig()
    assert data.startswith(b"\x1f\x8b") == (fmt == "tgz")
    assert extract_kubeconfig(data) == KUBECONFIG


# --- talosconfig and pure helpers ---------------------------------------------------------------


def test_client_from_talosconfig(configured_node):
    talosconfig = client_config.talosconfig(_bundle(), "stand-in", [configured_node.endpoint], ["10.5.0.2"])
    context = read_talosconfig(talosconfig)
    assert context.endpoints == (configured_node.endpoint,) and context.nodes == ("10.5.0.2",)
    assert context.credentials.ca_pem == secrets_bundle.ca_pair(_bundle(), "os")[0]
    assert b"ED25519 PRIVATE KEY" in context.credentials.key_pem  # as talosctl labels it; the client copes
    assert "PRIVATE" not in repr(context) and "redacted" in repr(context.credentials)
    with TalosClient.from_talosconfig(talosconfig, node="10.5.0.2") as talos:
        talos.service_list()
    assert configured_node.calls_for("ServiceList")[0].roles == ("os:admin",)


def test_talosconfig_errors_name_the_key():
    with pytest.raises(ValueError, match="context 'missing' not found"):
        read_talosconfig({"context": "missing", "contexts": {"a": {}}})
    with pytest.raises(ValueError, match=r"contexts\.a\.ca"):
        read_talosconfig({"context": "a", "contexts": {"a": {"ca": "not base64!"}}})


@pytest.mark.parametrize("endpoint, expected", [
    ("10.0.0.5", ("10.0.0.5", 50000)),
    ("10.0.0.5:50001", ("10.0.0.5", 50001)),
    ("fd00::5", ("fd00::5", 50000)),
    ("[fd00::5]:50001", ("fd00::5", 50001)),
    ("node-1.lan", ("node-1.lan", 50000)),
])
def test_split_endpoint(endpoint, expected):
    assert split_endpoint(endpoint) == expected


def test_split_endpoint_rejects_bad_ports():
    with pytest.raises(ValueError, match="'x'"):
        split_endpoint("10.0.0.5:x")


def test_unknown_mode_is_rejected_before_any_call():
    with TalosClient(["127.0.0.1:1"]) as talos:
        with pytest.raises(ValueError, match="mode 'fast' is not supported; expected one of auto"):
            talos.apply_configuration(b"x", mode="fast")


def test_extract_kubeconfig_formats():
    assert extract_kubeconfig(talos_style_tgz("kubeconfig", KUBECONFIG.encode())) == KUBECONFIG
    assert extract_kubeconfig(KUBECONFIG.encode()) == KUBECONFIG
    with pytest.raises(ValueError, match="no 'kubeconfig' file .*members: other"):
        extract_kubeconfig(talos_style_tgz("other", b"x"))
    with pytest.raises(ValueError, match="no data"):
        extract_kubeconfig(b"")


class _Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def time(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_retry_backs_off_exponentially_until_success():
    clock, outcomes = _Clock(), [errors.TalosUnavailable("e", "Version", "down")] * 4 + ["ok"]

    def call(remaining):
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome, remaining

    result = call_with_retry(call, timeout=100, what="x", backoff=Backoff(initial=1, factor=2, maximum=5),
                             clock=clock.time, sleep=clock.sleep)
    assert clock.sleeps == [1, 2, 4, 5]
    assert result == ("ok", 88)


def test_retry_gives_up_at_the_deadline_and_passes_non_retryable_errors():
    clock = _Clock()

    def down(_remaining):
        raise errors.TalosUnavailable("10.0.0.5:50000", "Version", "node unreachable")

    with pytest.raises(GaveUp, match=r"node: gave up after 10s and 5 attempts; last error: .*10\.0\.0\.5:50000"):
        call_with_retry(down, timeout=10, what="node", backoff=Backoff(initial=2, factor=1),
                        clock=clock.time, sleep=clock.sleep)
    assert clock.now <= 10

    def refused(_remaining):
        raise errors.TalosTlsError("e", "Version", "refused", "client-cert-refused")

    with pytest.raises(errors.TalosTlsError):
        call_with_retry(refused, timeout=10, what="x", clock=clock.time, sleep=clock.sleep)


def test_a_proxied_node_failure_keeps_its_grpc_code():
    """apid reports a proxied node's failure in metadata (error text and google.rpc.Status)."""
    from google.rpc import status_pb2

    from talos_proxmox.talos_api.errors import node_errors
    from talos_proxmox.talos_api.generated.common import common_pb2
    from talos_proxmox.talos_api.generated.machine import machine_pb2

    ok = machine_pb2.Version(metadata=common_pb2.Metadata(hostname="10.0.0.2"))
    failed = machine_pb2.Version(metadata=common_pb2.Metadata(
        hostname="10.0.0.3", error="upgrade already in progress",
        status=status_pb2.Status(code=grpc.StatusCode.FAILED_PRECONDITION.value[0], message="in progress")))
    error = node_errors("10.0.0.1:50000", "Upgrade", [ok, failed])
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "10.0.0.3: upgrade already in progress" in str(error) and "10.0.0.2" not in str(error)
    assert node_errors("10.0.0.1:50000", "Upgrade", [ok]) is None
    no_status = machine_pb2.Version(metadata=common_pb2.Metadata(hostname="10.0.0.3", error="boom"))
    assert node_errors("10.0.0.1:50000", "Upgrade", [no_status]).code is None
