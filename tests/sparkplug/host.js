// A Sparkplug host application on Eclipse Tahu's payload library (npm
// sparkplug-payload) and MQTT.js, driven by tests/sparkplug_output.rs. It decodes
// every spBv1.0 message of one edge node and checks the rules an edge node must
// follow (Sparkplug 3.0, the TCK's edge-node checks); one JSON event per stdout line.
//   node host.js URL GROUP NODE HOST_ID
// HOST_ID non-empty: act as that Primary Host (retained STATE, offline as its will).
// Stdin ops: {"op":"online"}, {"op":"offline"}, {"op":"rebirth"}.
// Events: {"ev":"ready"}, {"ev":"NBIRTH","bdSeq","names"}, {"ev":"NDEATH","bdSeq"},
// {"ev":"DBIRTH","device"}, {"ev":"DDEATH","device"}, {"ev":"NDATA","m":{name:value}},
// {"ev":"DDATA","device","historical","stamps":[...],"m":{name:value},"bytes"},
// {"ev":"rebirth_complete","devices":n}, {"ev":"violation","what"}.
"use strict";
const readline = require("readline");
const mqtt = require("mqtt");
const payloads = require("sparkplug-payload").get("spBv1.0");

const [url, group, node, hostId] = process.argv.slice(2);
const say = (ev) => process.stdout.write(JSON.stringify(ev) + "\n");
const violation = (what) => say({ ev: "violation", what });
const num = (v) => (v !== null && typeof v === "object" && typeof v.toNumber === "function" ? v.toNumber() : v);

const stateTopic = hostId ? `spBv1.0/STATE/${hostId}` : null;
const stamp = () => Date.now();
let hostOnline = !hostId;
// Set once the node's NDEATH after the host went offline arrived: from then on it must be silent.
let silenced = false;
const client = mqtt.connect(url, {
  clientId: `host-${process.pid}`,
  clean: true,
  keepalive: 5,
  protocolVersion: 5,
  will: stateTopic
    ? { topic: stateTopic, payload: JSON.stringify({ online: false, timestamp: stamp() }), qos: 1, retain: true }
    : undefined,
});

const session = {
  bdSeq: null, // of the current NBIRTH
  seq: null, // last seq seen
  born: false,
  nodeAliases: new Map(),
  devices: new Map(), // device -> { aliases: Map(alias -> {name, type}), alive }
  rebirthWanted: null, // devices alive when a rebirth was asked
  reborn: new Set(),
  rebirthNbirth: false,
};

function checkSeq(kind, p) {
  if (p.seq === undefined || p.seq === null) return violation(`${kind} without seq`);
  const s = num(p.seq);
  if (s < 0 || s > 255) violation(`${kind} seq ${s} out of 0..255`);
  if (session.seq !== null && s !== (session.seq + 1) % 256) violation(`${kind} seq ${s} after ${session.seq}`);
  session.seq = s;
}

function state(online) {
  const body = JSON.stringify({ online, timestamp: stamp() });
  client.publish(stateTopic, body, { qos: 1, retain: true }, () => {
    hostOnline = online;
    if (online) silenced = false;
    say({ ev: "done", op: online ? "online" : "offline" });
  });
}

client.on("connect", () => {
  client.subscribe("spBv1.0/#", { qos: 1 }, () => {
    if (stateTopic) state(true);
    say({ ev: "ready" });
  });
});

client.on("message", (topic, buf, packet) => {
  const parts = topic.split("/");
  if (parts[1] === "STATE") return;
  if (parts[1] !== group || parts[3] !== node) return;
  const kind = parts[2];
  const device = parts[4];
  if (packet.retain) violation(`${kind} retained`);
  let p;
  try {
    p = payloads.decodePayload(buf);
  } catch (e) {
    return violation(`${kind} does not decode: ${e}`);
  }
  const metrics = p.metrics || [];
  if (p.timestamp === undefined) violation(`${kind} without a payload timestamp`);
  if (silenced && kind !== "NDEATH") violation(`${kind} while the primary host was offline`);
  switch (kind) {
    case "NBIRTH": {
      if (packet.qos !== 0) violation(`NBIRTH qos ${packet.qos}`);
      if (!hostOnline) violation("NBIRTH before the primary host's STATE online");
      if (num(p.seq) !== 0) violation(`NBIRTH seq ${num(p.seq)}`);
      const bd = metrics.find((m) => m.name === "bdSeq");
      if (!bd) violation("NBIRTH without bdSeq");
      if (!metrics.some((m) => m.name === "Node Control/Rebirth" && m.type === "Boolean"))
        violation("NBIRTH without Node Control/Rebirth");
      session.bdSeq = bd ? num(bd.value) : null;
      session.seq = 0;
      session.born = true;
      for (const d of session.devices.values()) d.alive = false;
      if (session.rebirthWanted) session.rebirthNbirth = true;
      say({ ev: "NBIRTH", bdSeq: session.bdSeq, names: metrics.map((m) => m.name) });
      break;
    }
    case "NDEATH": {
      const bd = metrics.find((m) => m.name === "bdSeq");
      const v = bd ? num(bd.value) : null;
      if (v !== session.bdSeq) violation(`NDEATH bdSeq ${v} but the NBIRTH's was ${session.bdSeq}`);
      session.born = false;
      if (!hostOnline) silenced = true;
      say({ ev: "NDEATH", bdSeq: v });
      break;
    }
    case "NDATA": {
      if (!session.born) violation("NDATA before NBIRTH");
      checkSeq(kind, p);
      if (packet.qos !== 0) violation(`NDATA qos ${packet.qos}`);
      say({ ev: "NDATA", m: Object.fromEntries(metrics.map((m) => [m.name, num(m.value)])) });
      break;
    }
    case "DBIRTH": {
      if (!session.born) violation("DBIRTH before NBIRTH");
      if (packet.qos !== 0) violation(`DBIRTH qos ${packet.qos}`);
      checkSeq(kind, p);
      const aliases = new Map();
      for (const m of metrics) {
        if (m.name === undefined || m.alias === undefined || m.type === undefined)
          violation(`DBIRTH metric without name, alias or type: ${JSON.stringify(m)}`);
        aliases.set(num(m.alias), { name: m.name, type: m.type });
      }
      session.devices.set(device, { aliases, alive: true });
      if (session.rebirthNbirth) {
        session.reborn.add(device);
        if ([...session.rebirthWanted].every((d) => session.reborn.has(d))) {
          say({ ev: "rebirth_complete", devices: session.reborn.size });
          session.rebirthWanted = null;
          session.rebirthNbirth = false;
        }
      }
      say({ ev: "DBIRTH", device });
      break;
    }
    case "DDEATH": {
      checkSeq(kind, p);
      const d = session.devices.get(device);
      if (!d || !d.alive) violation(`DDEATH of ${device}, not born`);
      else d.alive = false;
      say({ ev: "DDEATH", device });
      break;
    }
    case "DDATA": {
      if (packet.qos !== 0) violation(`DDATA qos ${packet.qos}`);
      checkSeq(kind, p);
      const d = session.devices.get(device);
      if (!d || !d.alive) {
        violation(`DDATA of ${device} without a DBIRTH in this session`);
        break;
      }
      const m = {};
      const stamps = new Set();
      let historical = null;
      for (const x of metrics) {
        if (x.name !== undefined) violation("DDATA names a metric its birth aliased");
        const def = d.aliases.get(num(x.alias));
        if (!def) {
          violation(`DDATA alias ${num(x.alias)} of ${device} not in its DBIRTH`);
          continue;
        }
        if (x.timestamp === undefined) violation(`DDATA metric ${def.name} without a timestamp`);
        stamps.add(num(x.timestamp));
        const h = x.isHistorical === true;
        if (historical !== null && historical !== h) violation("DDATA mixes historical and live metrics");
        historical = h;
        m[def.name] = num(x.value);
      }
      say({ ev: "DDATA", device, historical: historical === true, stamps: [...stamps], m, bytes: buf.length });
      break;
    }
    default:
      break;
  }
});

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const op = JSON.parse(line);
  if (op.op === "online" || op.op === "offline") state(op.op === "online");
  else if (op.op === "rebirth") {
    session.rebirthWanted = new Set([...session.devices].filter(([, d]) => d.alive).map(([k]) => k));
    session.reborn = new Set();
    session.rebirthNbirth = false;
    const body = payloads.encodePayload({
      timestamp: stamp(),
      metrics: [{ name: "Node Control/Rebirth", type: "Boolean", value: true }],
    });
    client.publish(`spBv1.0/${group}/NCMD/${node}`, Buffer.from(body), { qos: 0 }, () =>
      say({ ev: "done", op: "rebirth" })
    );
  }
});
