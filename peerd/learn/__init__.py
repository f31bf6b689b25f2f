"""The learning stage: tasks (where a node's data and model come from), datasets, model
architectures, the daemon's side of a round (evaluation, the worker-thread call into
:func:`peerd.core.round`), and knowledge mode's sample keys (``keys``) and knowledge cache
(``knowcache``: peers' per-sample logits, indexed by key).

Owns torch modules and local data, which never leave the device. It must not touch the
network, the model cache or the state directory.
"""
