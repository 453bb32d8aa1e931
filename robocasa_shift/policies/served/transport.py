"""Connections to a policy server, each step under a total deadline that a slow or dripping server cannot stretch.

- ``open_websocket``: a websocket client connection (openpi, vla-eval); ``open_timeout`` bounds the TCP
  connect and the whole handshake together, and an error names the endpoint without its credentials.
- ``http_ready``: polls ``GET PATH`` (``/health``, ``/healthz``) until it answers 200 or the deadline passes.
  A per-read timeout is not enough: a server that drips one header byte every few seconds never trips it,
  so every connect, send and read here gets what is left of one deadline.
"""

from __future__ import annotations

import inspect
import socket
import ssl
import time
from typing import Any, Dict, Optional
from urllib.parse import urlsplit

from robocasa_shift.errors import PolicyServerError, PolicyServerTimeout

# The status line of a health answer is short; a server that sends more before its end is not one.
MAX_STATUS_LINE = 1024


def open_websocket(uri: str, shown_uri: str, what: str, hint: str, open_timeout_s: float, max_message_bytes: int,
                   headers: Optional[Dict[str, str]] = None, **options: Any):
    """A websockets sync client connection to ``uri`` (``shown_uri``: the redacted form errors show).

    Raises:
        PolicyServerError: refused, unreachable, DNS, the handshake past ``open_timeout_s``, an HTTP error
            status; the message names ``what`` at ``shown_uri`` and ends with ``hint``.
    """
    from websockets.sync.client import connect

    # websockets >= 17 wants ``legacy=True`` for a connection used outside a ``with`` block
    legacy = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
    try:
        return connect(uri, compression=None, max_size=max_message_bytes, additional_headers=headers,
                       open_timeout=open_timeout_s, **options, **legacy)
    except Exception as exc:  # refused, unreachable, DNS, handshake timeout, HTTP error status
        # the exception's text may quote the URI it was given: show the redacted one only
        text = str(exc).replace(uri, shown_uri)
        raise PolicyServerError(f"cannot connect to {what} at {shown_uri} ({type(exc).__name__}: {text}); {hint}",
                                "connect") from None


def health_url(uri: str, path: str) -> str:
    """The HTTP(S) URL of ``path`` on the host and port of a ``ws://`` or ``wss://`` ``uri``."""
    parts = urlsplit(uri)
    scheme = "https" if parts.scheme in ("wss", "https") else "http"
    return f"{scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}{path}"


def _status(url: str, deadline: float) -> int:
    """The HTTP status of ``GET url``, every step within what is left until ``deadline``.

    Raises:
        OSError: refused, reset, or no status line in time (``socket.timeout``).
    """
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("the deadline passed")
        return remaining

    sock = socket.create_connection((parts.hostname, port), timeout=left())
    try:
        if parts.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=parts.hostname)
        sock.settimeout(left())
        sock.sendall(f"GET {parts.path or '/'} HTTP/1.0\r\nHost: {parts.hostname}\r\n\r\n".encode("ascii"))
        line = b""
        while b"\r\n" not in line:
            sock.settimeout(left())
            piece = sock.recv(MAX_STATUS_LINE)
            if not piece:
                break
            line += piece
            if len(line) > MAX_STATUS_LINE and b"\r\n" not in line[:MAX_STATUS_LINE]:
                raise OSError("no HTTP status line")
        fields = line.split(b"\r\n", 1)[0].split()
        if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
            raise OSError(f"not an HTTP answer: {line[:60]!r}")
        return int(fields[1])
    finally:
        sock.close()


def http_ready(url: str, shown: str, timeout_s: float, what: str, hint: str, poll_s: float = 0.2) -> None:
    """Return once ``GET url`` answers 200; at most ``timeout_s`` in all, however the server answers.

    Raises:
        PolicyServerTimeout: no 200 within ``timeout_s`` (the last answer or error named).
    """
    deadline, last = time.monotonic() + float(timeout_s), "no answer"
    while time.monotonic() < deadline:
        try:
            status = _status(url, deadline)
            if status == 200:
                return
            last = f"HTTP {status}"
        except (OSError, ssl.SSLError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))
    raise PolicyServerTimeout(f"{what} at {shown} did not report ready on {urlsplit(url).path} within "
                              f"{timeout_s:g} s ({last}); {hint}", "connect")


__all__ = ["health_url", "http_ready", "open_websocket"]
