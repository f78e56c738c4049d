"""What went wrong talking to a Talos node, as exceptions a user can act on.

Messages name the RPC and the endpoint and say what to check. They are built only from gRPC
status details, OpenSSL reason codes and socket errors, never from certificates, keys or the
machine configuration.
"""

from __future__ import annotations

import os
import ssl

import grpc

from .retry import is_retryable

_MAX_DETAILS = 400

# OpenSSL alert reasons with which a TLS server refuses the client certificate we presented.
_CLIENT_CERT_REFUSED = {
    "TLSV1_ALERT_UNKNOWN_CA",
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "TLSV1_ALERT_DECRYPT_ERROR",
    "TLSV1_ALERT_ACCESS_DENIED",
}


class TalosApiError(Exception):
    """A Talos API call failed. `code` is the gRPC status code when the node answered."""

    retryable = False

    def __init__(self, endpoint: str, rpc: str, explanation: str, code: grpc.StatusCode | None = None):
        self.endpoint = endpoint
        self.rpc = rpc
        self.code = code
        self.explanation = explanation
        super().__init__(f"Talos API {rpc} at {endpoint}: {explanation}")


class TalosUnavailable(TalosApiError):
    """Nothing answered (refused, reset, down): the node may be booting or rebooting."""

    retryable = True


class TalosDeadlineExceeded(TalosApiError):
    """The call did not finish within its deadline."""

    retryable = True


class TalosTlsError(TalosApiError):
    """The TLS handshake failed; `reason` is one of REASONS."""

    REASONS = ("server-not-trusted", "client-cert-required", "client-cert-refused", "handshake")

    def __init__(self, endpoint: str, rpc: str, explanation: str, reason: str):
        self.reason = reason
        super().__init__(endpoint, rpc, explanation)


class TalosPermissionDenied(TalosApiError):
    """The node authenticated us but our certificate's role may not call this RPC."""


def transient_while_rebooting(error: BaseException) -> bool:
    """Retry predicate while a node reboots: it is unreachable or slow, or (right after a
    maintenance-mode apply) it still presents its maintenance certificate to an mTLS client."""
    if is_retryable(error):
        return True
    return isinstance(error, TalosTlsError) and error.reason == "server-not-trusted"


def _details(text: str | None) -> str:
    text = (text or "").strip()
    return text if len(text) <= _MAX_DETAILS else text[:_MAX_DETAILS] + "..."


def from_transport_error(endpoint: str, rpc: str, error: BaseException) -> TalosApiError:
    """Classify what the TLS bridge saw when connecting to or reading from the node."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return TalosTlsError(
            endpoint, rpc,
            "the node's certificate was not accepted "
            f"({error.verify_message}); expected a certificate signed by the talosconfig CA "
            "that names this address. A node still in maintenance mode presents a temporary "
            "certificate and needs an insecure connection instead.",
            "server-not-trusted",
        )
    if isinstance(error, ssl.SSLError):
        reason = getattr(error, "reason", None) or type(error).__name__
        if "CERTIFICATE_REQUIRED" in reason:
            return TalosTlsError(
                endpoint, rpc,
                "the node requires a client certificate, so it is already configured (not in "
                "maintenance mode); connect with the talosconfig credentials instead.",
                "client-cert-required",
            )
        if reason in _CLIENT_CERT_REFUSED:
            return TalosTlsError(
                endpoint, rpc,
                f"the node refused our client certificate ({reason}); expected a certificate "
                "issued by this cluster's OS CA (is the talosconfig from another cluster's "
                "secrets, i.e. the wrong client CA?).",
                "client-cert-refused",
            )
        return TalosTlsError(endpoint, rpc, f"TLS handshake failed ({reason}).", "handshake")
    if isinstance(error, (TimeoutError, ConnectionError, OSError)):
        errno = getattr(error, "errno", None)
        what = os.strerror(errno).lower() if errno else type(error).__name__
        return TalosUnavailable(
            endpoint, rpc, f"node unreachable ({what}); it may be booting or rebooting.",
            grpc.StatusCode.UNAVAILABLE,
        )
    return TalosUnavailable(endpoint, rpc, f"connection failed ({type(error).__name__}).", grpc.StatusCode.UNAVAILABLE)


def from_rpc_error(
    endpoint: str, rpc: str, error: grpc.RpcError, transport_error: BaseException | None = None
) -> TalosApiError:
    """Map a failed call to one of our errors; transport_error is what the TLS bridge saw, if anything."""
    code = error.code() if hasattr(error, "code") else None
    details = _details(error.details() if hasattr(error, "details") else str(error))
    if code == grpc.StatusCode.UNAVAILABLE:
        if transport_error is not None:
            return from_transport_error(endpoint, rpc, transport_error)
        return TalosUnavailable(endpoint, rpc, f"node unavailable ({details}); it may be booting or rebooting.", code)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return TalosDeadlineExceeded(endpoint, rpc, "no answer before the deadline; the node is slow or unreachable.", code)
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return TalosPermissionDenied(
            endpoint, rpc,
            f"not authorized ({details}); the talosconfig certificate needs the os:admin role for this call.",
            code,
        )
    name = code.name if code is not None else "UNKNOWN"
    return TalosApiError(endpoint, rpc, f"{name}: {details}", code)


_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


def node_errors(endpoint: str, rpc: str, messages) -> TalosApiError | None:
    """An error for reply messages whose common.Metadata says the proxied node failed.

    apid puts the node's gRPC status in metadata.status; its code is kept (of the first failed node)
    so that retry decisions see, say, FAILED_PRECONDITION rather than an unknown failure."""
    failed = [m.metadata for m in messages if m.HasField("metadata") and m.metadata.error]
    if not failed:
        return None
    codes = [_STATUS_CODES.get(meta.status.code) for meta in failed if meta.HasField("status")]
    explanation = "node(s) failed: " + "; ".join(f"{meta.hostname or '?'}: {_details(meta.error)}" for meta in failed)
    return TalosApiError(endpoint, rpc, explanation, code=codes[0] if codes else None)
