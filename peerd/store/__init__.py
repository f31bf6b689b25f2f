"""The storage stage: everything that touches the state directory and the fleet directory.

One state-file module (atomic write and fsync; a checksummed header on state files) under the
counters, the audit log, the persisted entries, the spool of mapped entries, key files and the
fleet directory.
It must not talk to the network or train; it stores what the node stage decided to keep.
"""
