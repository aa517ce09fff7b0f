"""HTTP/1.1 for the load scenarios' asyncio clients, just enough: a GET on
a connection of its own, and an answer read whole (Content-Length, chunked
with its trailers, or none). Imported by overload-load.py and
coalesce-load.py (run from this directory, which Python puts on the path).
"""
import asyncio
import re

# The `code` of a problem body (the proxy's error JSON).
CODE = re.compile(rb'"code"\s*:\s*"([A-Z_]+)"')


def split(address):
    """`host:port` as (host, port)."""
    host, _, port = address.rpartition(":")
    return host, int(port)


async def read_response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, _, header_block = head.partition(b"\r\n")
    status = int(status_line.split(b" ")[1])
    length, chunked, close = 0, False, False
    for line in header_block.split(b"\r\n"):
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value:
            chunked = True
        elif name == b"connection" and value == b"close":
            close = True
    body = b""
    if chunked:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the empty line
                    pass
                break
            body += (await reader.readexactly(size + 2))[:-2]
    elif length:
        body = await reader.readexactly(length)
    return status, body, close


async def get(address, path, timeout=2.0):
    """One request on a new connection (the samplers' and the admin's reads)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {address[0]}\r\nConnection: close\r\n\r\n".encode())
        return await asyncio.wait_for(read_response(reader), timeout)
    finally:
        writer.close()


def problem_code(body):
    """The `code` of a problem body, or "" (not one)."""
    m = CODE.search(body)
    return m.group(1).decode() if m else ""
