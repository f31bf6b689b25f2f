"""The network stage: discovery (mDNS) → transport (libp2p host, per-peer budgets) → framing
→ gossip (the async driver of :mod:`peerd.protocol.session`).

Owns sockets, the trio event loop's network tasks and bytes in flight. It must not decide what
an entry is worth (that is :mod:`peerd.node`), train (:mod:`peerd.learn`) or write state
files except through :mod:`peerd.store` (received frames are spooled there).
"""
