// An Eclipse Tahu edge node (npm sparkplug-client) driven by tests/sparkplug.rs:
// one JSON op per stdin line, one JSON event per stdout line.
//   node edge.js URL GROUP NODE
// Ops: {"op":"nbirth","metrics":[...]}, {"op":"dbirth","device":D,"metrics":[...]},
//      {"op":"ndata"|"ddata","device"?:D,"metrics":[...]}, {"op":"ddeath","device":D},
//      {"op":"skip"} (the next message skips one seq number).
// A metric: {"name"?, "alias"?, "type", "value", "dt"?}; its timestamp is now + dt ms
// when dt is given (reported back in the "done" event).
"use strict";
const readline = require("readline");
const sparkplug = require("sparkplug-client");

const [url, groupId, edgeNode] = process.argv.slice(2);
const client = sparkplug.newClient({
  serverUrl: url,
  username: "",
  password: "",
  groupId,
  edgeNode,
  clientId: `tahu-${groupId}-${edgeNode}`,
  version: "spBv1.0",
  keepalive: 5,
});
const births = { node: null, devices: new Map() };
const say = (ev) => process.stdout.write(JSON.stringify(ev) + "\n");

function metrics(list) {
  const now = Date.now();
  const stamps = [];
  const out = list.map((m) => {
    const r = { type: m.type, value: m.value };
    if (m.name !== undefined) r.name = m.name;
    if (m.alias !== undefined) r.alias = m.alias;
    if (m.dt !== undefined) {
      r.timestamp = now + m.dt;
      stamps.push(r.timestamp);
    }
    return r;
  });
  return { payload: { timestamp: now, metrics: out }, stamps, now };
}

function publishBirths() {
  if (births.node) client.publishNodeBirth(metrics(births.node).payload);
  for (const [d, m] of births.devices) client.publishDeviceBirth(d, metrics(m).payload);
}

client.on("connect", () => say({ event: "connected" }));
client.on("ncmd", (payload) => {
  const names = (payload.metrics || []).map((m) => m.name);
  say({ event: "ncmd", metrics: names });
  if (names.includes("Node Control/Rebirth")) publishBirths();
});

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  const op = JSON.parse(line);
  let done = { event: "done", op: op.op };
  switch (op.op) {
    case "nbirth":
      births.node = op.metrics;
      client.publishNodeBirth(metrics(op.metrics).payload);
      break;
    case "dbirth":
      births.devices.set(op.device, op.metrics);
      client.publishDeviceBirth(op.device, metrics(op.metrics).payload);
      break;
    case "ndata": {
      const m = metrics(op.metrics);
      client.publishNodeData(m.payload);
      done = { ...done, now: m.now, stamps: m.stamps };
      break;
    }
    case "ddata": {
      const m = metrics(op.metrics);
      client.publishDeviceData(op.device, m.payload);
      done = { ...done, now: m.now, stamps: m.stamps };
      break;
    }
    case "ddeath":
      births.devices.delete(op.device);
      client.publishDeviceDeath(op.device, { timestamp: Date.now(), metrics: [] });
      break;
    case "skip":
      client.incrementSeqNum();
      break;
    default:
      done = { event: "error", op: op.op };
  }
  say(done);
});
