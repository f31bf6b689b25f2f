"""peerd: a daemon for decentralized federated learning with signed model caches.

The package is layered: ``peerd.protocol`` (wire format, pure), ``peerd.core`` (the
Cached-DFL algorithm, pure and deterministic), and thin I/O shells around them.
Nothing is imported eagerly here so ``import peerd.protocol`` never pulls in torch.
"""

__version__ = "0.1.0"
