"""The control stage: the typed status (one schema, one JSON codec), the 0600 Unix control
socket (server and client) and the Prometheus metrics fed from that status.

Reads what the other stages report; it never changes node state, and it is the only way the
CLI learns about a running daemon.
"""
