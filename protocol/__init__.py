"""peerd wire protocol (installed as ``peerd.protocol``): pure bytes-in, typed-messages-out.

Must not touch the world: no sockets, files, clock, threads, event loop, torch or global
RNG, and nothing of peerd but ``peerd.core.reasons`` (enforced by
``tests/protocol/test_protocol_purity.py``). Everything the network can throw at this
package comes out as :class:`peerd.protocol.errors.ProtocolError` or a typed message.

Entry points: :class:`~peerd.protocol.frames.FrameDecoder` (bytes -> frames),
:func:`~peerd.protocol.messages.decode_frame` (frame -> message),
:func:`~peerd.protocol.admission.admit_entry` (Entry -> verified tensors),
:func:`~peerd.protocol.entry.sign_entry` (tensors -> signed frame parts),
:func:`~peerd.protocol.manifest.accept_manifest` (fleet membership updates),
:class:`~peerd.protocol.session.Session` (the order of a gossip session, sans-IO).
Formats and limits are described in ``docs/protocol.md``.
"""
