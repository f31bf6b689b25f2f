"""The Cached-DFL algorithm as pure, deterministic functions.

Must not do I/O (files, sockets, threads, event loops, clock reads), use a global RNG, or
import anything of peerd outside ``peerd.core`` (``tests/core/test_core_purity.py``,
``tests/test_architecture.py``): callers pass time (``now``/``round``) and randomness
(``torch.Generator``) in. Submodules are imported explicitly (``from peerd.core.cache import
merge``) so that light modules such as :mod:`peerd.core.reasons` stay importable without torch.
"""
