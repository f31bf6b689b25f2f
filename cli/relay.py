"""`peerd relay`: a Circuit Relay v2 hop and a rendezvous point for fleets behind NATs, and
nothing else (issue 27 item 2; docs/transport.md, "Running a relay").

The relay is no fleet member: no manifest, no cache, no training, no config file. Its only
state is its identity key (``DIR/node.key``, created on first start, the same file and
format as a node's: :mod:`peerd.store.keyfile`), so its peer id, and with it the address
members put into ``[network] relays``, stays the same across restarts; the state
directory's lock keeps a second relay off the same key. On start it prints one line, its
peer id then its full multiaddrs (``--json``: one JSON object), and serves until SIGINT or
SIGTERM (exit status 0). Every start-up failure (a port in use, a state directory it
cannot use, a key file it cannot read) is one line on stderr and exit status 2, before
libp2p is imported where it can be (as ``peerd run``'s preflight).
"""

from __future__ import annotations

import ipaddress
import json
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peerd.net.framing import TransportError
from peerd.net.portprobe import check_port_free
from peerd.store import lock as state_lock
from peerd.store.keyfile import NODE_KEY_FILE, KeyFileError, new_node_key, read_private_key

if TYPE_CHECKING:
    from peerd.net.transport import Stream

#: Exit status of a start-up failure (as `peerd run`'s).
EXIT_STARTUP = 2
#: The relay's TCP port unless told otherwise (the daemon's own default is 4001).
DEFAULT_RELAY_PORT = 4011


def _fail(message: str) -> typer.Exit:
    # One line, whatever the message: a journal or a script reads the first line only.
    typer.echo(f"peerd relay: {' '.join(message.split())}", err=True)
    return typer.Exit(code=EXIT_STARTUP)


def _identity(state_dir: Path) -> Ed25519PrivateKey:
    path = state_dir / NODE_KEY_FILE
    if not path.exists() and not path.is_symlink():
        try:
            return new_node_key(state_dir)
        except OSError as exc:
            raise _fail(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        return read_private_key(path)
    except KeyFileError as exc:
        raise _fail(f"identity key unusable: {exc}") from None


def relay(
    state_dir: Annotated[Path, typer.Option(
        "--state-dir", help="Where the relay keeps its identity key (created if missing).")],
    port: Annotated[int, typer.Option(
        "--port", min=0, max=65535, help="TCP port to listen on (0: any free one).")
    ] = DEFAULT_RELAY_PORT,
    host: Annotated[str, typer.Option(
        "--host", help="IP address to listen on.")] = "0.0.0.0",  # noqa: S104 - a relay serves others
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the start line as one JSON object {peer_id, addrs}.")] = False,
) -> None:
    """Run a Circuit Relay v2 service and a rendezvous point (no fleet membership)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise _fail(f"--host must be an IP address, got {host!r}") from None
    directory = state_dir.absolute()
    try:
        held = state_lock.acquire(directory)
    except state_lock.StateLockError as exc:
        raise _fail(str(exc)) from None
    try:
        key = _identity(directory)
        if port != 0:
            try:
                check_port_free(host, port)
            except TransportError as exc:
                raise _fail(str(exc)) from None
        import trio  # the libp2p side only once every check above passed

        try:
            trio.run(_serve, key, host, port, as_json)
        except TransportError as exc:
            raise _fail(str(exc)) from None
    finally:
        held.release()


async def _no_sessions(stream: Stream) -> None:
    """A relay is no member: a gossip stream is closed unanswered."""
    return None


async def _serve(key: Ed25519PrivateKey, host: str, port: int, as_json: bool) -> None:
    import trio

    from peerd.net.relay import serve_relay
    from peerd.net.transport import TransportConfig, open_transport

    cfg = TransportConfig(listen_host=host, listen_port=port)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_transport(key, _no_sessions, cfg) as transport, \
                serve_relay(transport.host):
            addrs = [f"{a}/p2p/{transport.peer_id}" for a in transport.listen_addrs]
            if as_json:
                line = json.dumps({"peer_id": transport.peer_id, "addrs": addrs})
            else:
                line = " ".join([transport.peer_id, *addrs])
            typer.echo(line)
            async for _ in signals:
                return
