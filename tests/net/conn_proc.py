"""One transport in its own process (run inside a test namespace), driven by JSON lines on
stdin: the other side of tests/net/test_stale_connections.py.

Prints ``{"id": …, "addrs": […]}`` once listening, then answers each command with one line:

- ``{"cmd": "echo", "peer": ID, "addrs": [...], "timeout": S}``: a stream to the peer, one
  frame there and back; ``{"ok": true, "local": "IP:PORT"}`` (the connection it went over),
  or ``{"ok": false, "error": …}``, each with ``wall_s`` (reported, never asserted);
- ``{"cmd": "conns", "peer": ID}``: the open connections to the peer, each with its local
  address, whether TCP reports it stalled, and its TCP_USER_TIMEOUT (ms).

Inbound streams are echoed. Ends when stdin closes.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from typing import Any

import trio
from libp2p.peer.id import ID

from peerd.net.mends import socket_of, stalled
from peerd.net.transport import (
    Stream,
    Transport,
    TransportConfig,
    TransportError,
    open_transport,
    read_frame,
    write_frame,
)


async def _echo(stream: Stream) -> None:
    await write_frame(stream, bytes(await read_frame(stream, 1024)))


def _local(conn: object) -> str | None:
    sock = socket_of(conn)
    if sock is None:
        return None
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


def _conns(t: Transport, peer: str) -> list[dict[str, Any]]:
    out = []
    swarm = t._host.get_network()
    for conn in swarm.connections.get(ID.from_base58(peer), []):
        sock = socket_of(conn.muxed_conn)
        if sock is None:
            continue
        try:
            user_timeout = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 4)
            local = _local(conn.muxed_conn)
        except OSError:  # its socket is closed already: the connection is on its way out
            continue
        out.append({"local": local, "closed": conn.is_closed, "stalled": stalled(sock),
                    "user_timeout_ms": int.from_bytes(user_timeout, sys.byteorder)})
    return out


async def _command(t: Transport, cmd: dict[str, Any]) -> dict[str, Any]:
    if cmd["cmd"] == "conns":
        return {"conns": _conns(t, cmd["peer"])}
    started = trio.current_time()
    try:
        async with t.open_stream(cmd["peer"], cmd.get("addrs", []),
                                 timeout_s=cmd["timeout"]) as stream:
            await write_frame(stream, b"ping")
            assert bytes(await read_frame(stream, 1024)) == b"ping"
            return {"ok": True, "local": _local(stream._raw.muxed_conn),
                    "wall_s": round(trio.current_time() - started, 2)}
    except TransportError as e:
        return {"ok": False, "error": str(e), "wall_s": round(trio.current_time() - started, 2)}


async def main(port: int, seed: int) -> None:
    cfg = TransportConfig(listen_port=port)
    async with open_transport(bytes([seed]) * 32, _echo, cfg) as t:
        print(json.dumps({"id": t.peer_id, "addrs": t.listen_addrs}), flush=True)
        while line := await trio.to_thread.run_sync(sys.stdin.readline):
            print(json.dumps(await _command(t, json.loads(line))), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seed", type=int, required=True, help="the identity key's seed byte")
    args = p.parse_args()
    trio.run(main, args.port, args.seed)
