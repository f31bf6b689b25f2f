"""peerd wire protocol (installed as ``peerd.protocol``): pure bytes-in, typed-messages-out.

No sockets, no event loop, no torch. Everything the network can throw at this package
comes out as :class:`peerd.protocol.errors.ProtocolError` or a typed message.
"""
