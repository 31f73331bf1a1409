#!/usr/bin/env node
// Workload (a) of `lockd bench` ("own") for the TypeScript client: N
// workers, each with its own Client (own connections) and session, take
// and release their own lock in a loop. Reports acquire+release pairs per
// second, the pair's latency and this process's CPU per pair over the
// measured window, to compare with `lockd bench --workload own`:
//
//   LOCKD_ENDPOINTS=http://127.0.0.1:7070 node bench.mjs [--clients 16] [--duration 10] [--warmup 2]
import { Client } from "./dist/index.js";

const arg = (name, def) => { const i = process.argv.indexOf(`--${name}`); return i > 0 ? Number(process.argv[i + 1]) : def; };
const clients = arg("clients", 16), duration = arg("duration", 10) * 1000, warmup = arg("warmup", 2) * 1000;
const endpoints = (process.env.LOCKD_ENDPOINTS ?? "http://127.0.0.1:7070").split(",");
const prefix = `bench-ts/${Math.random().toString(16).slice(2)}`;

let measuring = false, stop = false, errors = 0;
const lat = [];
async function worker(i) {
  const c = new Client({ endpoints });
  const s = await c.session({ ttlMs: 10_000 });
  const m = s.mutex(`${prefix}/${i}`);
  let n = 0;
  while (!stop && n < 10_000_000) {
    const t = performance.now();
    try {
      await m.lock({ timeoutMs: 10_000 });
      await m.unlock({ timeoutMs: 10_000 });
      if (measuring) lat.push(performance.now() - t);
      n++;
    } catch (e) {
      if (!stop) { errors++; console.error(e.message); }
    }
  }
  await c.close();
}
const done = Promise.all(Array.from({ length: clients }, (_, i) => worker(i)));
await new Promise((r) => setTimeout(r, warmup));
const cpu0 = process.cpuUsage(), t0 = performance.now();
measuring = true;
await new Promise((r) => setTimeout(r, duration));
measuring = false;
const cpu = process.cpuUsage(cpu0), secs = (performance.now() - t0) / 1000;
stop = true;
await done;
lat.sort((a, b) => a - b);
const q = (p) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))]?.toFixed(2);
const cpuSecs = (cpu.user + cpu.system) / 1e6;
console.log(JSON.stringify({
  client: "typescript", workload: "own", clients, seconds: +secs.toFixed(2), ops: lat.length, ops_per_sec: +(lat.length / secs).toFixed(0),
  latency_ms: { p50: q(0.5), p99: q(0.99) }, errors, client_cpu_seconds: +cpuSecs.toFixed(3),
  cpu_us_per_op: +((cpuSecs * 1e6) / lat.length).toFixed(1),
}));
