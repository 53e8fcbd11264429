// Aedes on 127.0.0.1:<port> with its defaults (in-memory persistence); TCP options Node's default, or
// TCP_NODELAY on every client socket with "nodelay".
// Usage: node launch.mjs PORT [default|nodelay]
import { createServer } from 'node:net'
import { Aedes } from 'aedes'

const port = Number(process.argv[2])
const aedes = await Aedes.createBroker()
const server = createServer({ noDelay: process.argv[3] === 'nodelay' }, aedes.handle)

function stop () {
  server.close()
  aedes.close(() => process.exit(0))
}

process.on('SIGTERM', stop)
process.on('SIGINT', stop)
server.listen(port, '127.0.0.1')
