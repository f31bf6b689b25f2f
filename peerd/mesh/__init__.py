"""Local meshes shared by `peerd demo`, the tests and the benchmarks: throw-away LANs of
network namespaces, a mesh of real `peerd run` daemons, and an in-process mesh of nodes that
call the same core round with no network at all.

Never used by the daemon itself.
"""
