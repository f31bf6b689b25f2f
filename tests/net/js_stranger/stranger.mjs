// A stranger on js-libp2p (TCP + Noise + Yamux, identify on): the independent client of
// issue 27 item 6. Each session is a fresh node (fresh key) that dials the target, opens
// /peerd/cache/1.0.0, sends its Hello and reads until the target ends the stream; it prints
// one JSON line per session: {"i", "received" (hex of every byte read), "error"}.
// Usage: node stranger.mjs TARGET_MULTIADDR HELLO_TEMPLATE_HEX SESSIONS
// The Hello template (built by the Python test) names a placeholder node id of 52 'X's,
// replaced by this node's peer id (an Ed25519 peer id is always 52 characters).
import { createLibp2p } from 'libp2p'
import { tcp } from '@libp2p/tcp'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { identify } from '@libp2p/identify'
import { multiaddr } from '@multiformats/multiaddr'

// Node 20 (Debian's) lacks Promise.withResolvers (Node 22), which these releases call.
Promise.withResolvers ??= function () {
  let resolve, reject
  const promise = new Promise((res, rej) => { resolve = res; reject = rej })
  return { promise, resolve, reject }
}

const [target, templateHex, sessions] = process.argv.slice(2)
const template = Buffer.from(templateHex, 'hex')
const placeholder = Buffer.from('X'.repeat(52))
const SESSION_TIMEOUT_MS = 10000

for (let i = 0; i < Number(sessions); i++) {
  const node = await createLibp2p({
    addresses: { listen: [] },
    transports: [tcp()],
    connectionEncrypters: [noise()],
    streamMuxers: [yamux()],
    services: { identify: identify() }
  })
  const received = []
  let error = null
  try {
    const signal = AbortSignal.timeout(SESSION_TIMEOUT_MS)
    const stream = await node.dialProtocol(multiaddr(target), '/peerd/cache/1.0.0', { signal })
    const hello = Buffer.from(template)
    const at = hello.indexOf(placeholder)
    hello.write(node.peerId.toString(), at)
    const header = Buffer.alloc(4)
    header.writeUInt32BE(hello.length)
    stream.send(Buffer.concat([header, hello]))
    for await (const chunk of stream) {
      received.push(Buffer.from(chunk.subarray()))
    }
  } catch (e) {
    error = String(e)
  }
  console.log(JSON.stringify({ i, received: Buffer.concat(received).toString('hex'), error }))
  await node.stop()
}
