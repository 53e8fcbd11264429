// MQTT.js over WebSocket: subscribe, publish to ourselves, print what arrives as one JSON line, exit 0.
// usage: node pubsub.js ws://127.0.0.1:PORT/mqtt TOPIC PROTOCOL_VERSION
const mqtt = require("mqtt");

const [url, topic, version] = process.argv.slice(2);
const client = mqtt.connect(url, { protocolVersion: Number(version), clientId: `mqttjs-${version}`, reconnectPeriod: 0 });
const timer = setTimeout(() => { console.error("timeout"); process.exit(2); }, 10000);
client.on("error", (err) => { console.error(String(err)); process.exit(1); });
client.on("connect", () => {
  client.subscribe(topic, { qos: 1 }, (err, granted) => {
    if (err) { console.error(String(err)); process.exit(1); }
    client.publish(topic, "hello from mqtt.js", { qos: 1 });
  });
});
client.on("message", (t, payload, packet) => {
  console.log(JSON.stringify({ topic: t, payload: payload.toString(), qos: packet.qos }));
  clearTimeout(timer);
  client.end(false, () => process.exit(0));
});
