"""peerd: a daemon for decentralized federated learning with signed model caches.

Two pure packages, ``peerd.protocol`` (the wire format) and ``peerd.core`` (the Cached-DFL
algorithm, deterministic), under the stages of the data path, net → node → store → learn →
control, which ``peerd.daemon`` wires together (``docs/architecture.md``). No module sits
here but this one, and nothing is imported eagerly, so ``import peerd.protocol`` never
pulls in torch.
"""

__version__ = "0.1.0"
