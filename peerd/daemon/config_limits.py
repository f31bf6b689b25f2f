"""Bounds on the daemon's configuration values, each saying what it protects.

Kept apart from :mod:`peerd.daemon.config` (the dataclasses and the loader) the way
``peerd.protocol.limits`` keeps the wire's limits: one place to read what a config file can
ask of a node. Plain constants only.
"""

from __future__ import annotations

from peerd.protocol.limits import MAX_DIGEST_ITEMS, MAX_MEMBERS

#: Largest config file read: a real one is a few KB; refuse to parse a runaway file.
MAX_CONFIG_FILE_LEN = 1 << 20
#: Bound on static peers: each is dialled and retried, so the list is a cost, not free data.
MAX_STATIC_PEERS = 256
#: Bound on bootstrap entries: each is resolved (DNS) and dialled while no peer is in reach;
#: a handful per site is what joining needs.
MAX_BOOTSTRAP_PEERS = 64
#: Bound on ``[network] relays``: each holds a reservation (a connection kept open, refreshed)
#: and a rendezvous registration, and its circuit address competes for the record's few
#: places (peerd.node.addrbook.CIRCUIT_PLACES); two or three relays are redundancy enough.
MAX_RELAYS = 8
#: Bound on mDNS interface names: a host has a handful; a long list is a mistake.
MAX_MDNS_INTERFACES = 64
#: Bound on CSV feature column names (wide tables exist; a million names is a mistake).
MAX_CSV_FEATURES = 100_000
#: Bound on a torch thread count: more than the cores only adds contention.
MAX_TORCH_THREADS = 1024
#: Bound on concurrent entry receptions: each writes one model-sized temporary file.
MAX_CONCURRENT_RECEIVES = 64
#: ``[network] fanout`` above this is a fleet-wide session storm rather than a setting (every
#: sweep opens this many sessions, each a handshake and a digest exchange).
MAX_FANOUT = 64
#: ``[network] max_inbound_sessions`` above this no longer bounds anything: each running
#: session may hold a digest merge and an entry being received.
MAX_INBOUND_SESSIONS = 256
#: Bound on the cache capacity C. The cache keeps one entry per origin and a manifest lists
#: at most MAX_MEMBERS nodes, so a larger C holds nothing more; it would only inflate the
#: per-peer byte budget (a burst of C + 1 entries) and the disk a cache may fill. And a
#: node's Digest lists its own entry and the C cached ones, which must fit MAX_DIGEST_ITEMS
#: (peers refuse a longer one): 511.
MAX_CAPACITY = min(MAX_MEMBERS, MAX_DIGEST_ITEMS - 1)
#: Shortest round interval. The automatic per-peer byte rate is one whole session per
#: interval, so an interval near 0 would make that budget unbounded (and 0 divides by zero);
#: a round also trains K steps, which takes longer than this anyway.
MIN_ROUND_INTERVAL_S = 0.1

LOG_LEVELS = ("debug", "info", "warning", "error")
#: Cordial mode's largest P: the shared index (27·P ids) must fit one view entry's rows
#: (peerd.protocol.limits.MAX_KNOWLEDGE_SAMPLES).
MAX_CORDIAL_IMAGES_PER_DIGIT = 606
#: The largest P scikit-learn's digits allow (``[task] name = "digits"``): each digit needs 2P
#: training images (train and validation pools) and P test images, and the rarest digit of
#: the split has 122 and 39 (tests/learn/test_pairwise10_digits.py checks this against the data).
MAX_CORDIAL_DIGITS_IMAGES_PER_DIGIT = 39
#: Cordial mode's sensor window (buckets kept, each a row of the node's view entry): a round
#: redraws a restored window and scores and publishes all of it, so this bounds a round's
#: work and a view's size. The least is two batches of two (the leave-one-out covariance).
MIN_CORDIAL_WINDOW, MAX_CORDIAL_WINDOW = 4, 4096
#: The update-norm history is kept in memory, one float per norm seen: bounds its size.
MAX_UPDATE_NORM_WINDOW = 100_000
#: FedBSS trains E passes over the local data per round: bounds a round's compute (a typo of
#: 1e6 epochs would hold the node in one round for days).
MAX_FEDBSS_EPOCHS = 1000
#: ``fedbss_steps`` above this is no budget: a round's steps run back to back on the CPU.
MAX_FEDBSS_STEPS = 1_000_000
