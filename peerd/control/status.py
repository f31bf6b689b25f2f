"""The daemon's status as the control API serves it (``peerd status --json``).

Shape (extra fields allowed)::

    {"node": {"id", "fleet", "round", "version", "examples", "train_loss", "val_accuracy"},
     "config": {"tau_max", "capacity", "rho", "local_steps", "alpha"},
     "cache": [{"origin", "version", "created_at", "age_s", "staleness", "examples",
                "alpha", "drift", "received_from", "received_at", "verified"}],
     "peers": [{"id", "addrs", "connected", "last_seen", "bytes_in", "bytes_out"}],
     "rejected": {"<reason>": count}}

NaN and infinities become ``null``: JSON has no spelling for them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peerd.daemon.daemon import Daemon


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def build_status(d: Daemon) -> dict[str, Any]:
    node, m, learning = d.node, d.metrics, d.cfg.learning
    now = d.now()
    clock = node.clock(now)
    stats = d.transport.peer_stats() if hasattr(d, "transport") else {}
    bytes_in, bytes_out = d.transport.byte_totals() if hasattr(d, "transport") else (0, 0)
    connected = set(d.transport.connected_peers()) if hasattr(d, "transport") else set()
    cache = [
        {
            "origin": item.meta.origin,
            "version": item.meta.version,
            "created_at": item.meta.created_at,
            "age_s": now - item.meta.created_at,
            "staleness": clock.staleness(item.meta),
            "examples": item.meta.num_examples,
            "alpha": _num(m.alpha.get(item.meta.origin)),
            "drift": _num(m.drift.get(item.meta.origin)),
            "received_from": item.received_from,
            "received_at": item.received_at,
            "verified": item.verified,
        }
        for item in node.cache
    ]
    peers = []
    for pid in sorted(set(d.peers) | connected):
        p = d.peers.get(pid)
        s = stats.get(pid)
        peers.append({
            "id": pid,
            "addrs": list(p.addrs) if p else [],
            "connected": pid in connected,
            "last_seen": p.last_seen if p else (s.last_seen if s else None),
            "bytes_in": s.bytes_in if s else 0,
            "bytes_out": s.bytes_out if s else 0,
            "budget_refusals": s.budget_refusals if s else 0,
            "source": p.source if p else "inbound",
            "sessions": p.sessions if p else 0,
            "last_error": p.last_error if p else None,
        })
    own = node.own
    return {
        "node": {
            "id": node.id,
            "fleet": node.fleet_id.hex(),
            "round": m.round,
            "version": m.version,
            "examples": m.examples,
            "train_loss": _num(m.train_loss),
            "val_loss": _num(m.val_loss),
            "val_accuracy": _num(m.val_accuracy),
            "own_alpha": _num(m.alpha.get(node.id)),
            "published_version": own.entry.meta.version if own else None,
            "manifest_seq": node.manifest.seq,
            "listen": d.listen_addrs,
            # Since start, peers no longer listed included (the metrics' byte counters).
            "bytes_in": bytes_in,
            "bytes_out": bytes_out,
        },
        "config": {
            "tau_max": learning.tau_max,
            "staleness": learning.staleness,
            "capacity": learning.capacity,
            "rho": learning.rho,
            "local_steps": learning.local_steps,
            "alpha": learning.alpha,
            "epsilon": learning.epsilon,
            "round_interval_s": learning.round_interval_s,
            "task": d.cfg.task.name,
        },
        "cache": cache,
        "peers": peers,
        "accepted": node.accepted,
        "rejected": dict(sorted(node.rejected.items())),
        "dropped": dict(sorted(node.dropped.items())),
        "flagged": sorted(node.ledger.flagged),
    }
