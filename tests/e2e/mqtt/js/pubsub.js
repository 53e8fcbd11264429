// MQTT.js over WebSocket: subscribe, publish COUNT messages to ourselves, print each PUBLISH sent and each
// message received as a JSON line, exit 0. With MQTT 5 the client accepts topic aliases from the broker and
// assigns its own.
// usage: node pubsub.js ws://127.0.0.1:PORT/mqtt TOPIC PROTOCOL_VERSION COUNT
const mqtt = require("mqtt");

const [url, topic, version, count] = process.argv.slice(2);
const v5 = Number(version) === 5;
const options = { protocolVersion: Number(version), clientId: `mqttjs-${version}`, reconnectPeriod: 0 };
if (v5) {
  options.properties = { topicAliasMaximum: 4 }; // the broker may alias the topics it sends us
  options.autoAssignTopicAlias = true; // and we alias the topics we send it
}
const client = mqtt.connect(url, options);
const timer = setTimeout(() => { console.error("timeout"); process.exit(2); }, 10000);
let received = 0;
client.on("packetsend", (packet) => {
  if (packet.cmd !== "publish") return;
  const alias = packet.properties && packet.properties.topicAlias;
  console.log(JSON.stringify({ sent: packet.topic, alias: alias || null }));
});
client.on("error", (err) => { console.error(String(err)); process.exit(1); });
client.on("connect", () => {
  client.subscribe(topic, { qos: 1 }, (err) => {
    if (err) { console.error(String(err)); process.exit(1); }
    for (let i = 0; i < Number(count); i++) client.publish(topic, `hello ${i} from mqtt.js`, { qos: 1 });
  });
});
client.on("message", (t, payload, packet) => {
  const alias = packet.properties && packet.properties.topicAlias;
  console.log(JSON.stringify({ received: t, payload: payload.toString(), qos: packet.qos, alias: alias || null }));
  received += 1;
  if (received === Number(count)) {
    clearTimeout(timer);
    client.end(false, () => process.exit(0));
  }
});
