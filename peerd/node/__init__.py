"""The node stage: what one node knows — its own signed entry, its cache, verification of
received entries, and the table of peers it may talk to.

Pure bookkeeping over :mod:`peerd.core` and :mod:`peerd.protocol`: no sockets, no event loop,
no clock reads (time is passed in). Entry bytes may live in mapped state files
(:mod:`peerd.store.spool`), which this stage reads but never writes.
"""
