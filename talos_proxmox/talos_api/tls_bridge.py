"""TLS for the Talos gRPC client through OpenSSL, via a relay only this process can open.

Why not grpcio's own TLS: grpcio is built on BoringSSL, whose client does not offer Ed25519 in
its signature_algorithms (grpc/grpc#24252) and has no "skip server verification" switch. Every
Talos API certificate is Ed25519 by default (the OS CA, the apid server certificate issued from
it, and the maintenance-mode CA), so a grpcio TLS channel cannot even finish the handshake with a
real node. Python's ssl module (OpenSSL) handles Ed25519 and CERT_NONE fine.

So the gRPC channel speaks plaintext HTTP/2 to a Unix socket, and every connection accepted there is
relayed over a TLS connection made with an ssl.SSLContext (ALPN h2, optional client certificate).
The relay speaks with our os:admin identity to whoever connects, so it must not be reachable by any
other local process or user: the socket lives in a fresh 0700 directory of ours (not on a TCP port,
which any local process could dial), is itself 0600, and both are removed on close. TLS failures are invisible to gRPC (it
only sees the socket close), so each bridge keeps the last failure for the client to report.

All bridges share one asyncio loop on a daemon thread.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import ssl
import tempfile
import threading
from typing import Awaitable, Callable

_CHUNK = 64 * 1024
_FIRST_READ_WAIT = 2.0  # seconds; see TlsBridge._handle
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """The shared relay loop, started on first use."""
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            # Failed handshakes are reported through TlsBridge.last_error, not the loop's logger.
            loop.set_exception_handler(lambda _loop, _context: None)
            threading.Thread(target=loop.run_forever, name="talos-tls-bridge", daemon=True).start()
            _loop = loop
        return _loop


def run(coro: Awaitable, timeout: float | None = None):
    """Run a coroutine on the relay loop from any other thread and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, event_loop()).result(timeout)


def load_cert_chain(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """SSLContext.load_cert_chain from memory.

    ssl only loads certificates from paths; on Linux an anonymous memfd keeps the key off disk,
    elsewhere a 0600 temporary file is used and removed at once.
    """
    data = cert_pem.rstrip(b"\n") + b"\n" + key_pem
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("talos-client-identity", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    fd, path = tempfile.mkstemp(prefix="talos-identity-")
    try:
        os.write(fd, data)
        os.close(fd)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)


def client_context(
    ca_pem: bytes | None = None, cert_pem: bytes | None = None, key_pem: bytes | None = None
) -> ssl.SSLContext:
    """TLS settings of a Talos client.

    Without ca_pem the server is not verified at all, like `talosctl --insecure` (used only for
    nodes in maintenance mode, which present a certificate from a CA generated at boot). With
    ca_pem the server certificate must chain to it and carry the dialled host as a SAN, which
    Talos's apid certificates do for the node's addresses.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])  # grpc-go servers refuse TLS connections without ALPN h2
    if ca_pem is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.load_verify_locations(cadata=ca_pem.decode("ascii"))
    if cert_pem is not None and key_pem is not None:
        load_cert_chain(context, cert_pem, key_pem)
    return context


async def relay(
    reader_a: asyncio.StreamReader,
    writer_a: asyncio.StreamWriter,
    reader_b: asyncio.StreamReader,
    writer_b: asyncio.StreamWriter,
    on_error: Callable[[BaseException], None] | None = None,
) -> None:
    """Copy bytes both ways until either side closes.

    on_error sees a read/write failure before the other side is closed, so whoever watches
    that side (gRPC) can find the cause once it notices the close.
    """

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(_CHUNK):
                writer.write(data)
                await writer.drain()
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
            if on_error is not None:
                on_error(exc)
        finally:
            writer.close()

    await asyncio.gather(pump(reader_a, writer_b), pump(reader_b, writer_a))


class TlsBridge:
    """A private Unix-socket listener whose connections are relayed over TLS to host:port.

    `address` is the gRPC target (`unix:<path>`)."""

    def __init__(
        self,
        host: str,
        port: int,
        context: ssl.SSLContext,
        *,
        connect_timeout: float = 10.0,
    ):
        self.host = host
        self.port = port
        self._context = context
        self._connect_timeout = connect_timeout
        self.last_error: BaseException | None = None
        self._directory = tempfile.mkdtemp(prefix="talos-relay-")  # 0700, ours alone
        path = os.path.join(self._directory, "grpc.sock")
        self._server: asyncio.AbstractServer = run(asyncio.start_unix_server(self._handle, path))
        os.chmod(path, 0o600)  # the directory already keeps others out; the socket says so too
        self.address = f"unix:{path}"

    async def _handle(self, local_reader: asyncio.StreamReader, local_writer: asyncio.StreamWriter) -> None:
        try:
            remote_reader, remote_writer = await asyncio.wait_for(
                asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self._context,
                    server_hostname=self.host,
                    ssl_handshake_timeout=self._connect_timeout,
                ),
                self._connect_timeout,
            )
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as exc:
            self.last_error = exc  # recorded before gRPC sees the close
            local_writer.close()
            return
        # TLS 1.3 servers judge our client certificate only after the client side of the handshake
        # is done, then send an alert and close. Wait for the server's first bytes (an HTTP/2
        # server sends SETTINGS at once) before forwarding anything: writing first would meet a
        # closed socket, and the reset that follows discards the alert that says why.
        try:
            first = await asyncio.wait_for(remote_reader.read(_CHUNK), _FIRST_READ_WAIT)
        except asyncio.TimeoutError:
            first = b""
        except (OSError, ssl.SSLError) as exc:
            self.last_error = exc
            local_writer.close()
            remote_writer.close()
            return
        self.last_error = None
        if first:
            local_writer.write(first)
        await relay(local_reader, local_writer, remote_reader, remote_writer, self._on_relay_error)

    def _on_relay_error(self, error: BaseException) -> None:
        # TLS 1.3 servers reject a client certificate after the client's handshake completed, so
        # such refusals arrive as alerts on the first read rather than from open_connection.
        if isinstance(error, ssl.SSLError):
            self.last_error = error

    def close(self) -> None:
        server = self._server

        async def stop() -> None:
            server.close()

        run(stop())
        shutil.rmtree(self._directory, ignore_errors=True)
