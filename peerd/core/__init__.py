"""The Cached-DFL algorithm as pure, deterministic functions.

No sockets, threads or clock reads: callers pass time (``now``/``round``) and randomness
(``torch.Generator``) in. Submodules are imported explicitly (``from peerd.core.cache import
merge``) so that light modules such as :mod:`peerd.core.reasons` stay importable without torch.
"""
