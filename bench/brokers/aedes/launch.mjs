// Aedes on 127.0.0.1:<port>: TCP options Node's default, or TCP_NODELAY on every client socket with
// "nodelay"; its default in-memory persistence, or aedes-persistence-level (LevelDB) in DATA_DIR with
// "level".
// Usage: node launch.mjs PORT [default|nodelay] [memory|level DATA_DIR]
import { createServer } from 'node:net'
import { Aedes } from 'aedes'

const [portArg, tcp = 'default', store = 'memory', dataDir] = process.argv.slice(2)
const port = Number(portArg)
let persistence
if (store === 'level') {
  const { Level } = await import('level')
  const { default: levelPersistence } = await import('aedes-persistence-level')
  persistence = levelPersistence(new Level(dataDir))
}
const aedes = await Aedes.createBroker(persistence ? { persistence } : {})
const server = createServer({ noDelay: tcp === 'nodelay' }, aedes.handle)

function stop () {
  server.close()
  aedes.close(() => process.exit(0))
}

process.on('SIGTERM', stop)
process.on('SIGINT', stop)
server.listen(port, '127.0.0.1')
