// Aedes on 127.0.0.1:<port> with its defaults (in-memory persistence, Node's default TCP options).
// Usage: node launch.mjs PORT
import { createServer } from 'node:net'
import { Aedes } from 'aedes'

const port = Number(process.argv[2])
const aedes = await Aedes.createBroker()
const server = createServer(aedes.handle)

function stop () {
  server.close()
  aedes.close(() => process.exit(0))
}

process.on('SIGTERM', stop)
process.on('SIGINT', stop)
server.listen(port, '127.0.0.1')
