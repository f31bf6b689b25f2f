"""Probe: does py-libp2p 0.8.1's DCUtR (``libp2p/relay/circuit_v2/dcutr.py``) upgrade a relayed
connection to a direct one across the namespace WAN of tests/net/wan.py? (issue 27 item 3)

    sudo .venv/bin/python -m benchmarks.dcutr_probe [--case public|site-b|site-b-eim] [--wait 30]
    sudo .venv/bin/python -m benchmarks.dcutr_probe --case all --wait 20   # every case: JSON + doc
    .venv/bin/python -m benchmarks.dcutr_probe --render    # bench:dcutr from the committed JSON

Three hosts, each a process in its own namespace running peerd's transport
(:func:`peerd.net.transport.open_transport`: TCP + Noise + Yamux, peerd's mends) with
py-libp2p's ``CircuitV2Protocol`` and ``DCUtRProtocol`` services beside it:

* R, the relay, on the public segment (``203.0.113.10``), runs the hop;
* A, behind site a's router (plain MASQUERADE: endpoint-independent mapping), reserves a slot
  at R and listens for relayed connections;
* B dials A through ``/ip4/R/tcp/…/p2p/R/p2p-circuit/p2p/A`` and then both run DCUtR
  (its auto-drive loop every 2 s on each side, and A initiates once at once, as the spec's
  initiator is the side that accepted the relayed connection). B is, by ``--case``:
  ``public``: a public host (``203.0.113.11``): A could simply dial it (DCUtR's step 0,
  the unilateral upgrade); ``site-b``: a host behind site b's router (``--random-fully``: a
  random port per flow, symmetric; hole punching is expected to fail); ``site-b-eim``: the
  same host with site b's rule replaced by plain MASQUERADE (both sites endpoint-
  independent: the case hole punching is for).

After the relayed connection, each side waits up to ``--wait`` seconds for a direct
connection to the other, then reports its connections' remote multiaddrs, their path
(:func:`peerd.node.paths.classify`), a ping RTT over libp2p ping, and DCUtR's log lines.
Prints one JSON object; exit 0 if B ends with a direct connection to A. ``--case all`` runs
every case of :data:`CASES` in turn and writes their reports, with the run's provenance, to
docs/reproduction/dcutr/dcutr-cases.json and docs/transport.md's ``bench:dcutr`` table.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
READINGS = ROOT / "docs" / "reproduction" / "dcutr" / "dcutr-cases.json"
TRANSPORT_DOC = ROOT / "docs" / "transport.md"
MARK = "dcutr"
LISTEN_PORT = 4001
RELAY_PORT = 4011
#: A process that outlives this is killed: every step has its own deadline well inside it.
NODE_TIMEOUT_S = 120.0


class _Lines(logging.Handler):
    """Keeps the DCUtR module's log lines (what it tried, what failed) for the report."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.lines) < 200:
            self.lines.append(f"{record.levelname} {record.getMessage()}"[:300])


# ------------------------------------------------------------------ one node (in a namespace)

async def _node(role: str, relay: str | None, target: str | None, wait_s: float) -> None:
    import libp2p.transport.tcp.tcp as tcp
    import multiaddr
    import trio
    from libp2p.peer.id import ID
    from libp2p.peer.peerinfo import PeerInfo
    from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
    from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
    from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_ID
    from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
    from libp2p.relay.circuit_v2.resources import RelayLimits
    from libp2p.relay.circuit_v2.transport import CircuitV2Transport
    from libp2p.tools.anyio_service.context import background_trio_service

    from peerd.net.addrs import local_networks
    from peerd.net.holepunch import dcutr_upgraded
    from peerd.net.ping import PingError, ping_ms
    from peerd.net.transport import TransportConfig, open_transport
    from peerd.node.paths import classify

    lines = _Lines()
    logging.getLogger("libp2p.relay.circuit_v2.dcutr").addHandler(lines)
    logging.getLogger("libp2p.relay.circuit_v2.dcutr").setLevel(logging.DEBUG)
    # What the TCP dial from the listen port hit (the swarm reports only "fail to open").
    bound_dial = tcp._open_tcp_stream_from
    dial_errors: list[str] = []  # every failed dial, kept apart from the log's last lines

    async def noted_dial(host: str, port: int, source: tuple[str, int]) -> Any:
        try:
            return await bound_dial(host, port, source)
        except Exception as e:
            cause = e.__cause__
            line = f"TCP {source[0]}:{source[1]} -> {host}:{port}: {e}" \
                   f"{f' ({cause!r})' if cause else ''}"[:300]
            lines.lines.append(line)
            if len(dial_errors) < 200:
                dial_errors.append(line)
            raise

    tcp._open_tcp_stream_from = noted_dial
    limits = RelayLimits(duration=600, data=64 << 20, max_circuit_conns=8, max_reservations=8,
                         reservation_ttl=600)
    port = RELAY_PORT if role == "relay" else LISTEN_PORT
    cfg = TransportConfig(listen_host="0.0.0.0", listen_port=port)

    async def no_handler(stream: object) -> None:
        return None

    def say(obj: dict[str, Any]) -> None:
        print(json.dumps(obj), flush=True)

    async with open_transport(os.urandom(32), no_handler, cfg) as t:
        h = t.host
        circuit = CircuitV2Protocol(h, limits=limits, allow_hop=role == "relay")
        dcutr = DCUtRProtocol(h)
        async with background_trio_service(circuit), background_trio_service(dcutr), \
                trio.open_nursery() as nursery:
            await circuit.event_started.wait()
            await dcutr.event_started.wait()
            if role == "relay":
                say({"id": t.peer_id})
                await trio.sleep(NODE_TIMEOUT_S)
                return
            assert relay is not None
            relay_id, relay_addr = relay.split("@")
            rid = ID.from_base58(relay_id)
            await h.connect(PeerInfo(rid, [multiaddr.Multiaddr(relay_addr)]))
            client = CircuitV2Transport(h, circuit, RelayConfig(
                roles=RelayRole.STOP | RelayRole.CLIENT, limits=limits))
            report: dict[str, Any] = {"role": role, "id": t.peer_id}
            if role == "listener":
                stream = await h.new_stream(rid, [HOP_ID])
                report["reserved"] = await client.reserve(stream, rid, nursery)
                say({"id": t.peer_id, "reserved": report["reserved"]})
                # Wait for the dialer's relayed connection, then initiate once ourselves.
                with trio.move_on_after(30):
                    while not [p for p in t.connected_peers() if p != relay_id]:  # noqa: ASYNC110
                        await trio.sleep(0.1)
                others = [p for p in t.connected_peers() if p != relay_id]
                if not others:
                    report["error"] = "no relayed connection came"
                    say(report)
                    return
                peer = others[0]
                t0 = time.monotonic()
                try:
                    with trio.fail_after(wait_s):
                        report["initiate_result"] = await dcutr.initiate_hole_punch(
                            ID.from_base58(peer))
                except trio.TooSlowError:
                    report["initiate_result"] = "timed out"
                except Exception as e:  # noqa: BLE001 - what the library raised is the finding
                    report["initiate_result"] = f"raised {e!r}"
                report["initiate_s"] = round(time.monotonic() - t0, 2)
            else:
                assert target is not None
                peer = target
                dial = multiaddr.Multiaddr(f"{relay_addr}/p2p/{relay_id}/p2p-circuit/p2p/{peer}")
                t0 = time.monotonic()
                await client.dial(dial)
                report["relayed_dial_s"] = round(time.monotonic() - t0, 3)
                report["after_dial"] = t.connection_multiaddrs(peer)
                # The relayed RTT, kept only if no direct connection came meanwhile (the
                # swarm would have sent the ping over it).
                try:
                    rtt = round(await ping_ms(h, peer), 3)
                except PingError as e:
                    report["relayed_ping_ms"] = str(e)
                else:
                    still = all("/p2p-circuit" in a for a in t.connection_multiaddrs(peer))
                    report["relayed_ping_ms"] = rtt if still else None
            # Either side: wait for a direct connection (DCUtR's or the other side's); the
            # dialer longer, as the listener's own attempt may take all of wait_s first.
            deadline = time.monotonic() + (wait_s if role == "listener" else 2 * wait_s + 10)
            started = time.monotonic()
            while time.monotonic() < deadline:
                if any("/p2p-circuit" not in a for a in t.connection_multiaddrs(peer)):
                    break
                await trio.sleep(0.2)
            report["direct_after_s"] = None if time.monotonic() >= deadline else \
                round(time.monotonic() - started, 2)
            await trio.sleep(1.0)  # connections settle (a second dial of the pair)
            addrs = t.connection_multiaddrs(peer)
            path = classify(addrs, local_networks())
            report["connections"] = addrs
            report["path"] = None if path is None else path.kind
            report["relay"] = None if path is None else path.relay
            # The path as the daemon would report it with this DCUtR service on its host.
            told = classify(addrs, local_networks(), hole_punched=peer in dcutr_upgraded(h))
            report["path_with_dcutr"] = None if told is None else told.kind
            try:
                report["ping_ms"] = round(await ping_ms(h, peer), 3)
            except PingError as e:
                report["ping_ms"] = str(e)
            observed = getattr(h, "_observed_addr_manager", None)
            if observed is not None:
                report["observed_addrs"] = [str(a) for a in observed.addrs(min_observers=1)]
            report["dcutr_log"] = lines.lines[-40:]
            report["dial_errors"] = dial_errors
            say(report)
            # Held open until the orchestrator has the other side's report too.
            # (The trio-typing stubs py-libp2p pulls in predate abandon_on_cancel.)
            await trio.to_thread.run_sync(  # type: ignore[call-arg]
                sys.stdin.read, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()


# ------------------------------------------------------------------ the orchestration

def _spawn(host: Any, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(host.python("-m", "benchmarks.dcutr_probe", "node", *args),
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _first_line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"node exited: {proc.stderr.read()[-2000:] if proc.stderr else ''}")
    parsed: dict[str, Any] = json.loads(line)
    return parsed


def probe(case: str = "public", wait_s: float = 30.0, *,
          routers_drop: bool = False) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tests.net.wan import drop_unsolicited, punchable, skip_reason, wan

    reason = skip_reason()
    if reason is not None:
        return {"case": case, "skipped": reason}
    procs: list[subprocess.Popen[str]] = []
    with wan((1, 1), 2) as w:
        a_host = w.sites["a"].hosts[0]
        b_host = w.public[1] if case == "public" else w.sites["b"].hosts[0]
        if case == "site-b-eim":
            punchable(w, routers_drop=routers_drop)
        elif routers_drop:
            drop_unsolicited(w)
        try:
            r = _spawn(w.public[0], "--role", "relay")
            procs.append(r)
            rid = _first_line(r)["id"]
            relay = f"{rid}@/ip4/{w.public[0].address}/tcp/{RELAY_PORT}"
            a = _spawn(a_host, "--role", "listener", "--relay", relay, "--wait", str(wait_s))
            procs.append(a)
            aid = _first_line(a)["id"]
            b = _spawn(b_host, "--role", "dialer", "--relay", relay, "--target", aid,
                       "--wait", str(wait_s))
            procs.append(b)
            out: dict[str, Any] = {"case": case, "routers_drop": routers_drop,
                                   "a": a_host.address, "b": b_host.address}
            reports = {}
            assert a.stdout is not None
            reports["listener"] = a.stdout.readline()  # its report; it stays up meanwhile
            try:
                reports["dialer"], b_err = b.communicate(timeout=NODE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                b.kill()
                reports["dialer"], b_err = b.communicate()
            try:
                _, a_err = a.communicate("", timeout=10)  # stdin closed: it ends
            except subprocess.TimeoutExpired:
                a.kill()
                _, a_err = a.communicate()
            for name, p, err in (("listener", a, a_err), ("dialer", b, b_err)):
                last = [ln for ln in reports[name].splitlines() if ln.startswith("{")]
                out[name] = json.loads(last[-1]) if last else {"stderr": err[-3000:]}
                out[name]["rc"] = p.returncode
            return out
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


# ------------------------------------------------------------------ every case, one output

#: The cases the probe knows, in the order they run: (--case, --routers-drop).
CASES: tuple[tuple[str, bool], ...] = (
    ("site-b-eim", True), ("site-b-eim", False), ("site-b", True), ("public", False))
NAT_TYPES = {
    "site-b-eim": "A endpoint-independent, B endpoint-independent",
    "site-b": "A endpoint-independent, B symmetric (a random port per flow)",
    "public": "A endpoint-independent, B public",
}
ROUTERS = {True: "drop unsolicited inbound SYNs",
           False: "answer unsolicited inbound SYNs with a RST (wan.py's default)"}
ERRNO = re.compile(r"\[Errno (\d+)\]")


def outcome(r: dict[str, Any]) -> str:
    """``hole-punched``, ``direct by step 0`` (DCUtR's unilateral dial), ``relayed`` or
    ``failed``, from one case's two reports."""
    a, b = r.get("listener", {}), r.get("dialer", {})
    if b.get("path") is None:
        return "failed"
    if b["path"] == "relayed":
        return "relayed"
    logs = a.get("dcutr_log", []) + b.get("dcutr_log", [])
    if any("Unilateral direct upgrade" in line and "succeeded" in line for line in logs):
        return "direct by step 0"
    return "hole-punched"


def exceptions(r: dict[str, Any]) -> list[str]:
    """The errors the two sides saw: errno names of failed TCP dials (with counts), the
    listener's ``initiate_hole_punch`` result when not True, a node's error."""
    counts: dict[str, int] = {}
    for side in ("listener", "dialer"):
        rep = r.get(side, {})
        for line in rep.get("dial_errors", rep.get("dcutr_log", [])):
            for m in ERRNO.finditer(line.split(" (OSError", 1)[0]):
                name = errno.errorcode.get(int(m.group(1)), f"errno {m.group(1)}")
                counts[name] = counts.get(name, 0) + 1
    out = [f"{name} ×{n}" for name, n in sorted(counts.items())]
    result = r.get("listener", {}).get("initiate_result")
    if result is not None and result is not True:
        out.append(f"initiate_hole_punch: {result}")
    out += [f"{side}: {r[side]['error']}" for side in ("listener", "dialer")
            if "error" in r.get(side, {})]
    return out


def _ms(v: Any) -> str:
    return f"{v:.1f} ms" if isinstance(v, float) else "—" if v is None else str(v)


def render(data: dict[str, Any]) -> str:
    """docs/transport.md's ``bench:dcutr`` block from the committed cases."""
    lines = [
        "| case | NAT types | routers | outcome | time to direct | ping relayed → at the end "
        "| exceptions seen |",
        "|---|---|---|---|---:|---|---|",
    ]
    for r in data["cases"]:
        a, b = r.get("listener", {}), r.get("dialer", {})
        flag = " --routers-drop" if r["routers_drop"] else ""
        direct = b.get("direct_after_s")
        when = f"{direct:.2f} s" if isinstance(direct, float | int) else "none"
        if a.get("initiate_result") is True:
            when += f" (punch {a['initiate_s']:.2f} s)"
        final = f"{_ms(b.get('ping_ms'))} {b.get('path') or '?'}"
        lines.append(
            f"| `--case {r['case']}{flag}` | {NAT_TYPES[r['case']]} | {ROUTERS[r['routers_drop']]} "
            f"| {outcome(r)} | {when} | {_ms(b.get('relayed_ping_ms'))} → {final} "
            f"| {'; '.join(exceptions(r)) or 'none'} |")
    lines += [
        "",
        f"Time to direct: from the dialer's relayed connection to its first direct one (waited "
        f"for up to {2 * data['wait_s'] + 10:.0f} s); punch: the listener's "
        "`initiate_hole_punch` call. Pings: libp2p ping from the dialer, over the relayed "
        "connection just after it opened (— when a direct one came first) and over the path "
        "it ended on, one sample each (the first on a new connection: not a latency "
        "comparison). Exceptions: the errno of every failed TCP dial, both sides, counted.",
    ]
    if "provenance" in data:
        from benchmarks import _provenance

        lines += ["", _provenance.line(data["provenance"])]
    return "\n".join(lines) + "\n"


def run_cases(wait_s: float) -> dict[str, Any]:
    """Every case of :data:`CASES`, one after another, with the WAN built afresh for each."""
    cases = []
    for case, drop in CASES:
        print(f"dcutr_probe: {case}{' --routers-drop' if drop else ''}", file=sys.stderr,
              flush=True)
        cases.append(probe(case, wait_s, routers_drop=drop))
    return {"wait_s": wait_s, "cases": cases}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=" ".join((__doc__ or "").split("\n\n")[0].split()))
    ap.add_argument("--case", choices=("public", "site-b", "site-b-eim", "all"),
                    default="public",
                    help="all: every case in turn, each with its own router setting; writes "
                         f"{READINGS.relative_to(ROOT)} and docs/transport.md's bench:dcutr")
    ap.add_argument("--wait", type=float, default=30.0)
    ap.add_argument("--routers-drop", action="store_true",
                    help="the routers drop unsolicited inbound SYNs (else their stack RSTs)")
    ap.add_argument("--render", action="store_true",
                    help="measure nothing: rewrite bench:dcutr from the committed cases")
    return ap


def main() -> None:
    if sys.argv[1:2] == ["node"]:  # one host of a case, started by probe()
        node = argparse.ArgumentParser(prog="dcutr_probe node")
        node.add_argument("--role", choices=("relay", "listener", "dialer"), required=True)
        node.add_argument("--relay")
        node.add_argument("--target")
        node.add_argument("--wait", type=float, default=30.0)
        n = node.parse_args(sys.argv[2:])
        import trio

        trio.run(_node, n.role, n.relay, n.target, n.wait)
        return
    ap = _parser()
    args = ap.parse_args()
    from benchmarks._report import write_section

    if args.render:
        write_section(MARK, render(json.loads(READINGS.read_text())), TRANSPORT_DOC)
        return
    if args.case != "all":
        res = probe(args.case, args.wait, routers_drop=args.routers_drop)
        print(json.dumps(res, indent=2))
        sys.exit(0 if res.get("dialer", {}).get("path") not in (None, "relayed") else 1)
    if args.routers_drop:
        print("dcutr_probe: --case all sets the routers per case; drop --routers-drop",
              file=sys.stderr)
        sys.exit(2)
    from benchmarks import _provenance

    started = _provenance.start(ap, args)
    data = run_cases(args.wait)
    if any("skipped" in r for r in data["cases"]):
        print(f"dcutr_probe: skipped: {data['cases'][0].get('skipped')}", file=sys.stderr)
        sys.exit(2)
    data["provenance"] = started.record()
    READINGS.parent.mkdir(parents=True, exist_ok=True)
    READINGS.write_text(json.dumps(data, indent=1) + "\n")
    md = render(data)
    write_section(MARK, md, TRANSPORT_DOC)
    print(md)


if __name__ == "__main__":
    main()
