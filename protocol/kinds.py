"""Entry kinds: what an entry's signed body says its payload is.

``weights`` is every entry before kinds existed; its body carries no ``kind`` key at all, so
a weight entry is byte for byte what it always was (golden vectors, external peers). The
other kinds name themselves in the signed body (``"kind": "knowledge"``) and in Digest
items (a fifth element). A kind a node does not know is malformed, never skipped: a new
kind is added here, with its payload layout beside :mod:`peerd.protocol.knowledge`'s, and
documented in docs/protocol.md. Issue 17's views needed none: a view entry is a knowledge
entry under a view schema (another layout of the same kind, one admission and cache path).

Constants only: no code, no imports from the rest of the package (messages and entries both
read it).
"""

from __future__ import annotations

#: A model's tensors (the original and default kind; never written on the wire).
WEIGHTS = "weights"
#: Per-sample logits of an origin's private samples, naming the samples by id (FedCache);
#: under a view schema, per-sample vectors for ids of a fleet-wide shared index (cordial).
KNOWLEDGE = "knowledge"
#: The sample keys (encoder outputs) and labels a knowledge entry's ids refer to: sent once,
#: referenced by payload digest from every knowledge entry that uses them.
KEYS = "keys"

#: Every kind this version reads. Order is irrelevant; membership is what is checked.
KINDS = frozenset({WEIGHTS, KNOWLEDGE, KEYS})
#: The kinds that are written explicitly (all but the implicit default).
TYPED_KINDS = KINDS - {WEIGHTS}
