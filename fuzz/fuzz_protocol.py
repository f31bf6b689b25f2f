"""atheris (libFuzzer) harness over frame -> decode -> verify -> admit. Not run in CI.

Run (the PyPI wheels of atheris bundle libFuzzer; nothing else to install):

    .venv/bin/pip install 'atheris>=2.3,<3'
    mkdir -p /tmp/peerd-corpus
    .venv/bin/python fuzz/fuzz_protocol.py --seed-corpus /tmp/peerd-corpus   # valid frames
    .venv/bin/python fuzz/fuzz_protocol.py /tmp/peerd-corpus -max_len=4096 -timeout=5

The invariant checked: for any input, split into the chunk size its first byte chooses,
the pipeline (a weight node's admission, a knowledge node's and a view node's,
peerd.protocol.knowledge)
yields messages or raises ProtocolError, never anything else (any other
exception is a crash libFuzzer reports together with the input that caused it).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

NOW = 1_700_000_000.0


def build() -> tuple[Callable[[bytes], None], list[bytes]]:
    """Import the protocol (inside atheris' instrumentation when fuzzing) and set up a fleet."""
    import numpy as np

    from peerd.protocol.admission import admit_entry, entry_frame_limit
    from peerd.protocol.encoding import Encoding
    from peerd.protocol.entry import sign_entry
    from peerd.protocol.errors import ProtocolError
    from peerd.protocol.frames import FrameDecoder
    from peerd.protocol.identity import node_id_of, private_key_from_seed, public_key_bytes
    from peerd.protocol.knowledge import (
        KnowledgeSchema,
        admit_typed,
        sign_keys,
        sign_knowledge,
        sign_view,
    )
    from peerd.protocol.ledger import OriginLedger
    from peerd.protocol.manifest import Manifest
    from peerd.protocol.messages import (
        Addrs,
        Digest,
        DigestItem,
        Entry,
        Error,
        Hello,
        ManifestMessage,
        Want,
        decode_frame,
    )
    from peerd.protocol.peerrecord import sign_record, verify_record

    fleet = bytes(range(16))
    key = private_key_from_seed(hashlib.sha256(b"fuzz-origin").digest())
    admin = private_key_from_seed(hashlib.sha256(b"fuzz-admin").digest())
    manifest = Manifest(fleet, 1).admit(public_key_bytes(key), None)
    schema = {"n": ("int64", (1,)), "w": ("float32", (8,))}
    kschema = KnowledgeSchema(key_dim=4, num_classes=3, encoder="fuzz", max_samples=16)
    vschema = KnowledgeSchema(key_dim=4, num_classes=3, encoder="fuzz", max_samples=16,
                              view_ids=64)
    limit = max(entry_frame_limit(schema), kschema.frame_limit(), vschema.frame_limit())

    def pipeline(data: bytes) -> None:
        # The first byte picks a chunk size so the fuzzer explores split points too.
        chunk = (data[0] % 17) + 1 if data else 1
        dec = FrameDecoder(limit)
        try:
            for i in range(1, len(data), chunk):
                for frame in dec.feed(data[i : i + chunk]):
                    msg = decode_frame(frame)
                    if isinstance(msg, Addrs):  # each record on its own, as a book takes them
                        for record in msg.records:
                            with contextlib.suppress(ProtocolError):
                                verify_record(record, fleet, NOW)
                    if isinstance(msg, Entry):
                        with contextlib.suppress(ProtocolError):  # then as a knowledge node
                            admit_entry(msg, fleet_id=fleet, manifest=manifest,
                                        ledger=OriginLedger(), schema=schema, now=NOW)
                        with contextlib.suppress(ProtocolError):  # then as a view node
                            admit_typed(msg, fleet_id=fleet, manifest=manifest,
                                        ledger=OriginLedger(), schema=kschema, now=NOW)
                        admit_typed(msg, fleet_id=fleet, manifest=manifest,
                                    ledger=OriginLedger(), schema=vschema, now=NOW)
            dec.close()
        except ProtocolError:
            pass

    def weights(encoding: str) -> bytes:
        return sign_entry(key, fleet, version=1, created_at=NOW, schema_id="00" * 32,
                          num_examples=3, encoding=Encoding.parse(encoding),
                          tensors={"w": np.arange(8, dtype=np.float32),
                                   "n": np.array([3], dtype=np.int64)}).to_message().to_wire()

    me = node_id_of(key)
    keys = sign_keys(key, fleet, schema=kschema, version=1, created_at=NOW,
                     keys=np.eye(3, 4, dtype=np.float32), labels=np.array([0, 1, 2]))
    know = sign_knowledge(key, fleet, schema=kschema, version=2, created_at=NOW,
                          ids=np.array([0, 2]), logits=np.ones((2, 3), dtype=np.float32),
                          keys_digest=keys.body.digest)
    view = sign_view(key, fleet, schema=vschema, version=3, created_at=NOW,
                     ids=np.array([1, 40]), vectors=np.ones((2, 4), dtype=np.float32))
    seeds = [
        view.to_message().to_wire(),
        weights("float32"),
        weights("int8"),  # compact encodings: the codec fields and int8 scales
        weights("float16"),
        keys.to_message().to_wire(),
        know.to_message().to_wire(),
        Digest((DigestItem(me, 2, NOW, b"\x00" * 32, kind="knowledge"),)).to_wire(),
        Hello(fleet, me, 1, ("relay",)).to_wire(),
        Digest((DigestItem(me, 1, NOW, b"\x00" * 32),)).to_wire(),
        Want(((me, 1),)).to_wire(),
        Error("malformed", "x").to_wire(),
        ManifestMessage(manifest.sign(admin)).to_wire(),
        Addrs((sign_record(key, fleet, seq=1, addrs=("/ip4/10.0.0.2/tcp/4011",),
                           expires=NOW + 60).envelope,)).to_wire(),
    ]
    return pipeline, [b"\x00" + s for s in seeds]  # chunk byte 0: one byte at a time


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--seed-corpus":
        for i, seed in enumerate(build()[1]):
            (Path(sys.argv[2]) / f"seed-{i}").write_bytes(seed)
        return
    atheris: Any = importlib.import_module("atheris")  # optional: only this command needs it
    with atheris.instrument_imports(include=["peerd", "msgpack"]):
        pipeline, _ = build()
    atheris.Setup(sys.argv, pipeline)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
