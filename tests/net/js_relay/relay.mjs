// A Circuit Relay v2 relay on js-libp2p (TCP + Noise + Yamux, identify, circuitRelayServer):
// the independent relay of tests/net/test_js_relay.py (issue 27 item 4). It has no
// rendezvous point: js-libp2p ships none.
// Usage: node relay.mjs PORT [RESERVATION_TTL_S] [DATA_LIMIT_BYTES] — listens on
// 127.0.0.1:PORT (0: any free port), prints one JSON line {"peer_id", "addr"} once
// listening, and runs until killed.
import { createLibp2p } from 'libp2p'
import { tcp } from '@libp2p/tcp'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { identify } from '@libp2p/identify'
import { circuitRelayServer } from '@libp2p/circuit-relay-v2'

// Node 20 (Debian's) lacks Promise.withResolvers (Node 22), which these releases call.
Promise.withResolvers ??= function () {
  let resolve, reject
  const promise = new Promise((res, rej) => { resolve = res; reject = rej })
  return { promise, resolve, reject }
}

const [port, ttlS, dataLimit] = process.argv.slice(2)
// Generous for a test unless told (js-libp2p's defaults, 128 KiB and 2 minutes per relayed
// connection, would cut a session's model bytes short): 256 MiB and 10 minutes per relayed
// connection, reservations of an hour.
const DATA_LIMIT = BigInt(dataLimit ?? 256 << 20)
const DURATION_LIMIT_MS = 10 * 60 * 1000
const RESERVATION_TTL_MS = Number(ttlS ?? 3600) * 1000

const node = await createLibp2p({
  addresses: { listen: [`/ip4/127.0.0.1/tcp/${Number(port ?? 0)}`] },
  transports: [tcp()],
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  services: {
    identify: identify(),
    relay: circuitRelayServer({
      reservations: {
        maxReservations: 64,
        reservationTtl: RESERVATION_TTL_MS,
        defaultDataLimit: DATA_LIMIT,
        defaultDurationLimit: DURATION_LIMIT_MS
      }
    })
  }
})
const addr = node.getMultiaddrs().find((a) => a.toString().startsWith('/ip4/127.0.0.1/tcp/'))
console.log(JSON.stringify({ peer_id: node.peerId.toString(), addr: addr.toString() }))

const stop = async () => { await node.stop(); process.exit(0) }
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
