"""The node stage: what one node knows — its own signed entry, its cache, verification of
received entries, and the table of peers it may talk to.

Pure bookkeeping over :mod:`peerd.core` and :mod:`peerd.protocol`: no sockets, no event loop,
no clock reads (time is passed in). Entry bytes may live in mapped state files (the store's
:mod:`peerd.store.spool`), which this stage reads but never writes, through the interface
it declares (:mod:`peerd.node.entryfile`): the node never imports the store.
"""
