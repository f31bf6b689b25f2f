"""peerd wire protocol (installed as ``peerd.protocol``): pure bytes-in, typed-messages-out.

No sockets, no event loop, no torch. Everything the network can throw at this package
comes out as :class:`peerd.protocol.errors.ProtocolError` or a typed message.

Entry points: :class:`~peerd.protocol.frames.FrameDecoder` (bytes -> frames),
:func:`~peerd.protocol.messages.decode_frame` (frame -> message),
:func:`~peerd.protocol.admission.admit_entry` (Entry -> verified tensors),
:func:`~peerd.protocol.entry.sign_entry` (tensors -> signed frame parts),
:func:`~peerd.protocol.manifest.accept_manifest` (fleet membership updates).
Formats and limits are described in ``docs/protocol.md``.
"""
