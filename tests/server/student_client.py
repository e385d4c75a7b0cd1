"""A student's clients for the security tests (test_security2*.py): a websocket and a raw HTTP
POST from a source address of its own (127.0.0.2 and up stand for students' laptops)."""

from __future__ import annotations

import json
import socket

from server_client import Client
from websockets.asyncio.client import connect

STUDENT, OTHER = "127.0.0.2", "127.0.0.3"


async def student(ws_url: str, source: str = STUDENT, **kw) -> Client:
    ws = await connect(ws_url, max_size=None, local_addr=(source, 0), **kw)
    c = Client(ws)
    assert (await c.recv(30))["type"] == "hello"
    return c


def post_from(
    base: str, path: str, body: bytes, source: str = STUDENT, bearer: str | None = None
) -> tuple[int, dict]:
    """A POST from ``source`` (a student's address): (status, JSON body)."""
    auth = f"Authorization: Bearer {bearer}\r\n" if bearer else ""
    host, port = base.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0))
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{auth}Connection: close\r\n\r\n"
        ).encode()
        conn.sendall(head + body)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    finally:
        conn.close()
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1] or b"{}")
