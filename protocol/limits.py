"""Every size and count limit of the wire protocol, each naming the threat it bounds.

These are checked *before* allocation wherever the format allows it (frame length
prefix, msgpack container headers, signed payload length against the local schema).
Constants only, no code. A limit that depends on the model (an entry's payload) comes from
the local schema, not from here; validation limits (norm, examples) are ``peerd.core``'s.
"""

from __future__ import annotations

#: Current wire protocol version (``v`` in every message and envelope).
PROTOCOL_VERSION = 1
#: Oldest version still accepted; anything below is ``version_too_old``.
MIN_PROTOCOL_VERSION = 1

#: Bytes of the big-endian length prefix in front of every frame.
FRAME_HEADER_LEN = 4
#: Largest control frame (everything but an Entry): bounds the memory a peer can make us
#: buffer with a single small-looking message (Hello/Digest/Want/Manifest/Error).
MAX_CONTROL_FRAME_LEN = 64 * 1024
#: Largest msgpack head of an Entry frame (envelope with body and tensor index): a model
#: with thousands of tensors has an index of tens of KiB, so 1 MiB is ample while bounding
#: what is parsed (and copied into the msgpack buffer) before the signature is checked.
#: The raw payload that follows is bounded separately by the local model's schema.
MAX_ENTRY_HEAD_LEN = 1024 * 1024
#: Absolute ceiling on any frame whatever the schema says: a 4-byte prefix could claim
#: 4 GiB, and a misconfigured schema must not let a peer make us buffer that much.
MAX_FRAME_LEN_CEILING = 2 * 1024**3

#: msgpack decoder limits (applied by the C decoder before it allocates a container).
#: Longest byte string: bounds bin allocations (an entry body holds the tensor index, so
#: this follows the entry head limit; control frames are bounded by their frame limit).
MAX_BIN_LEN = MAX_ENTRY_HEAD_LEN
#: Longest text string: bounds names, node ids and error texts.
MAX_STR_LEN = 4096
#: Longest array: stops an array header claiming 2**32 elements from preallocating.
MAX_ARRAY_LEN = 4096
#: Largest map: our messages have a dozen keys at most.
MAX_MAP_LEN = 32
#: Deepest nesting the type checker will walk; msgpack's own stack limit is far above.
MAX_DEPTH = 8

#: Fleet id length in bytes (random at ``peerd fleet init``); fixed so that the signing
#: input ``domain || fleet_id || body`` is unambiguous.
FLEET_ID_LEN = 16
#: Ed25519 public key and signature sizes.
PUBLIC_KEY_LEN = 32
SIGNATURE_LEN = 64
#: SHA-256 output (payload digest, schema id).
DIGEST_LEN = 32

#: Longest node id string (an Ed25519 libp2p peer id is 52 characters).
MAX_NODE_ID_LEN = 64
#: Most tensors in one entry: bounds the index a peer makes us validate.
MAX_TENSORS = 4096
#: Longest tensor name.
MAX_TENSOR_NAME_LEN = 256
#: Most dimensions of one tensor (torch itself allows 64; real models use <= 5).
MAX_NDIM = 16
#: Most entries announced in one Digest / requested in one Want: cache capacity C is
#: tens, so 512 is generous, bounds per-message work and fits a control frame (~92 B each).
MAX_DIGEST_ITEMS = 512
#: Most capabilities announced in Hello, and the length of each.
MAX_CAPABILITIES = 32
MAX_CAPABILITY_LEN = 64
#: Longest Error text (bounded so peers cannot fill our logs).
MAX_ERROR_TEXT_LEN = 1024
#: Longest Error code.
MAX_ERROR_CODE_LEN = 64
#: Most members / revoked ids in a fleet manifest. Threat: the work of decoding a manifest the
#: admin key signed (a key-to-id derivation and a dictionary slot per member), the rows it
#: gives the ledger and the admissions file, and with MAX_MANIFEST_FRAME_LEN the bytes a peer
#: makes us buffer in a session's manifest turn. 1,024 holds the 1,000-node fleets of issue 14.
MAX_MEMBERS = 1024
MAX_REVOKED = 1024
#: Highest cordial agent index a manifest may bind a member to (``agent-<index>``: four
#: digits, as the cordial group names them). Threat: an index the group label cannot name
#: would bind a member to no agent anyone speaks for; bounded, its value costs ≤ 3 B a member.
MAX_AGENT_INDEX = 9999
#: Largest Manifest frame, the one control message allowed past MAX_CONTROL_FRAME_LEN. Threat:
#: the bytes a peer makes us buffer (and hash, to check the admin's signature) in the manifest
#: turn of a session before anything in them is trusted. The largest manifest the format can
#: hold, MAX_MEMBERS members with an expiry and MAX_REVOKED revoked ids, is a frame of 155,895
#: bytes (98 B per member, 54 B per revoked id; tests/protocol/test_protocol_manifest_large.py
#: builds it), 158,967 with every member bound to an agent (3 B more each); a fleet of 1,000
#: without revocations is ~90 KB.
MAX_MANIFEST_FRAME_LEN = 256 * 1024

#: Largest integer accepted for versions, seq numbers and counts (int64 range; msgpack
#: could carry uint64 and Python ints are unbounded).
MAX_INT = 2**63 - 1
#: Highest entry version accepted: 2**53, the largest integer a JSON reader holding numbers
#: as float64 (``peerd status --json`` in JavaScript, jq) still reads exactly. Threat: a
#: version at the integer ceiling (2**63 - 1), signed by a buggy or stolen key, leaves its
#: origin nothing newer to publish: every later entry of it would be refused for ever. At
#: MAX_VERSIONS_PER_S it is reached 285,000 years after VERSION_EPOCH_S.
MAX_VERSION = 2**53
#: Fastest sustained rate at which an origin's versions may advance, per second of its signed
#: ``created_at`` (see protocol/ledger.py: version_limit). A daemon publishes at most once per
#: round, and a round trains, signs and fsyncs its entry: far below 1,000 a second. Threat: a
#: version far ahead of what its origin can have published (a corrupt counter, a stolen key)
#: racing towards MAX_VERSION; with this bound it cannot outrun the clock.
MAX_VERSIONS_PER_S = 1000
#: Versions an origin may run ahead of MAX_VERSIONS_PER_S: bursts, and a clock stepped back
#: (its next entry is then "older" than the held one but one version newer).
VERSION_SLACK = 1024
#: Where the version clock of an origin seen for the first time starts (2020-01-01 UTC; no
#: peerd entry is older): version <= VERSION_SLACK + MAX_VERSIONS_PER_S * (created_at -
#: VERSION_EPOCH_S). Threat: without it, the first entry a node holds of an origin could carry
#: any version up to MAX_VERSION.
VERSION_EPOCH_S = 1_577_836_800.0

#: Default allowed clock skew for ``created_at`` in the future (seconds).
DEFAULT_MAX_CLOCK_SKEW_S = 300.0

# --- typed entries (peerd.protocol.knowledge) -------------------------------------------
#: Most samples one knowledge or keys entry may carry (its num_examples, its rows). Threat:
#: the rows a peer makes us hash, decode and put into the ANN index for one origin; with
#: MAX_KEY_DIM float16 keys that is at most 16 MiB per keys entry. FedCache's clients hold
#: ~200 samples each (FashionMNIST over 300 clients); a node with more publishes a subset.
MAX_KNOWLEDGE_SAMPLES = 16_384
#: Widest sample key. Threat: bounds a keys entry's row (and the ANN index's vector) size.
MAX_KEY_DIM = 512
#: Most classes of a knowledge schema. Threat: bounds a logits row (num_classes float16s)
#: and with MAX_KNOWLEDGE_SAMPLES a knowledge entry's payload (32 MiB at the ceiling).
MAX_KNOWLEDGE_CLASSES = 1024
#: Largest |logit| accepted. Threat: teacher logits are averaged over R neighbours; one
#: origin's 6e4 (float16's ceiling) would outvote the other R - 1 and saturate the softmax.
#: Trained classifiers stay within tens.
MAX_LOGIT_ABS = 1000.0
#: How far from 1 a key's L2 norm may be (keys are L2-normalised, then rounded to float16:
#: ~1e-3 relative error). Threat: a zero or huge key breaks cosine similarity in the index.
KEY_NORM_TOLERANCE = 0.01
#: Largest shared index a view schema may name (its ids are int32 rows of it). Threat: a
#: receiver keeps, per origin, a table over the ids it uses; the index size is local config,
#: but a schema built from a hostile or mistyped value must not overflow int32 ids.
MAX_VIEW_IDS = 1 << 30
#: Largest |value| of a view entry's vector (cordial learning's embedded outputs h_j, inputs
#: of the receiver's coordination layers). Threat: one origin's 6e4 (float16's ceiling) would
#: saturate every receiver's Λ_j h_j term and its gradients; ReLU embeddings stay within tens.
MAX_VIEW_ABS = 1000.0

# --- cache groups (peerd.core.cache: capacity_per_group) ---------------------------------
#: Longest group label an entry's signed body may carry (``group``; characters, all ASCII).
#: Threat: the label is a key of the merge's per-group bookkeeping, is shown by ``peerd
#: status`` and logged, and travels with every relayed copy of the entry; a peer's kilobyte
#: label would bloat all of them. A label names a data distribution or an area ("site-3",
#: "ward:east"), so 64 is ample.
MAX_GROUP_LEN = 64
#: The characters a group label may use (a regular expression character class): ASCII
#: letters, digits and ``. _ : -``. Threat: control characters, newlines and terminal escapes
#: written into the operator's log and status output; and Unicode look-alikes ("site-Ⅰ"
#: vs "site-I") that two nodes would count as different groups.
GROUP_CHARS = "[A-Za-z0-9._:-]"

# --- address records (peerd.protocol.peerrecord) -----------------------------------------
#: Most addresses in one member's address record. Threat: a record is dialled address by
#: address; a member listing hundreds would make every holder try hundreds (the mDNS record's
#: bound is 8, peerd.net.discovery). A host has one or two dialable addresses per site.
MAX_RECORD_ADDRS = 4
#: Longest multiaddr in a record (``/dns4/<name>/tcp/<port>``: a 100-character DNS name fits).
#: Threat: with MAX_RECORD_ADDRS, bounds a record's body and what the address book keeps.
MAX_RECORD_MULTIADDR_LEN = 128
#: Largest signed body of an address record: the largest well-formed one is ~650 bytes.
#: Threat: bytes hashed for a signature check before anything in them is trusted.
MAX_RECORD_BODY_LEN = 768
#: Furthest in the future a record may expire. Threat: a record signed to expire in years
#: would keep a dead or mistaken address in every address book of the fleet for years,
#: relayed from book to book; a member re-signs its record long before this.
MAX_RECORD_TTL_S = 24 * 3600.0
#: Most address records in one Addrs message. Threat: the signature checks (one Ed25519
#: verification each, ~60 µs) and book updates one message makes us do. The largest such
#: message (64 envelopes of a MAX_RECORD_BODY_LEN body) stays under MAX_CONTROL_FRAME_LEN
#: (tests/protocol/test_peerrecord.py builds it); a fleet with more members spreads its
#: records over several sessions.
MAX_ADDR_RECORDS = 64

# --- compact encodings of weight tensors (peerd.protocol.encoding) -----------------------
#: Fewest values per int8 scale (``int8:B``). Threat: the scales a peer makes us read and
#: check per value; at 16 they are at most a quarter of the int8 bytes (B = 0: one scale per
#: tensor). Below it per-block int8 saves little over float16 anyway.
MIN_INT8_BLOCK = 16
#: Most values per int8 scale: beyond it a per-block scale is a per-tensor one in all but
#: name (B = 0 says that plainly), and one outlier would flatten a million values.
MAX_INT8_BLOCK = 1 << 20
#: Largest int8 scale: 127 · scale stays a finite float32 (3.4e38 / 127 ≈ 2.68e36), so no
#: finite-looking bytes decode to Inf; the norm bound then judges the values themselves.
MAX_INT8_SCALE = 2.6e36
