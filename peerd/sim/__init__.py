"""``peerd sim``: simulated mobile agents running the very same Cached-DFL core as the daemon.

The simulator adds only mobility, contacts and batching; merging, alpha weights, blending and
the proximal local update come from :mod:`peerd.core`.
"""
