"""The learning stage: tasks (where a node's data and model come from), datasets, model
architectures and the daemon's side of a round (evaluation, the worker-thread call into
:func:`peerd.core.round`).

Owns torch modules and local data, which never leave the device. It must not touch the
network, the cache or the state directory.
"""
