#!/usr/bin/env node
// Conformance driver (protocol v1) for the TypeScript client: reads one JSON
// request per line on stdin, answers each (in any order, concurrently) with
// one JSON line on stdout, and writes unsolicited events (lease_lost,
// leader, watch). Endpoints come from LOCKD_ENDPOINTS, the token from
// LOCKD_TOKEN. Logs go to stderr.
import { createInterface } from "node:readline";
import { readFileSync } from "node:fs";
import { Client, LockdError, observeElection } from "./dist/index.js";

const version = JSON.parse(readFileSync(new URL("./package.json", import.meta.url), "utf8")).version;
const nowNs = () => BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6));

// JSON with exact 64-bit integers: bigints are written as bare numbers,
// and long integers in requests (tokens) are read as strings first.
function write(obj) {
  const s = JSON.stringify(obj, (_, v) => (typeof v === "bigint" ? `__big__${v}` : v)).replace(/"__big__(-?\d+)"/g, "$1");
  process.stdout.write(s + "\n");
}
const parse = (line) => JSON.parse(line.replace(/:\s*(\d{16,})/g, ':"$1"'));

const client = new Client({
  endpoints: (process.env.LOCKD_ENDPOINTS ?? "http://127.0.0.1:7070").split(",").filter(Boolean),
  token: process.env.LOCKD_TOKEN || undefined,
  logger: process.env.LOCKD_DRIVER_DEBUG ? (level, msg, attrs) => console.error(level, msg, JSON.stringify(attrs ?? {}, (_, v) => (typeof v === "bigint" ? String(v) : v))) : undefined,
});

let exiting;
async function shutdown() {
  for (const ac of streams.values()) ac.abort();
  await client.close().catch((e) => console.error("close:", e.message));
}

const sessions = new Map(), locks = new Map(), elections = new Map(), streams = new Map();

class DriverError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

const codeMap = {
  busy: "busy", not_held: "not_held", lease_lost: "lease_lost", session_closed: "lease_lost", already_held: "already_held",
  unavailable: "unavailable", deadline: "deadline", cancelled: "cancelled", permission_denied: "permission_denied",
  unauthenticated: "unauthenticated", invalid: "invalid", done: "done", no_leader: "not_found", deadlock: "deadlock", hold_expired: "lease_lost",
};

function get(map, key, what) {
  const v = map.get(key);
  if (!v) throw new DriverError("not_found", `no ${what} ${JSON.stringify(key)}`);
  return v;
}

const callOpts = (r) => (r.timeout_ms !== undefined && r.timeout_ms !== null ? { timeoutMs: Number(r.timeout_ms) } : {});

const mutexOpts = (r) => (r.max_hold_ms ? { maxHoldMs: Number(r.max_hold_ms) } : {});

async function take(r, make, kind, unlock) {
  const s = get(sessions, r.session, "session");
  const l = make(s);
  if (r.try) await (kind === "read" ? l.tryRLock() : l.tryLock());
  else await (kind === "read" ? l.rlock(callOpts(r)) : l.lock(callOpts(r)));
  locks.set(r.lock, { l, unlock: () => unlock(l) });
  return { token: l.token };
}

const ops = {
  // version is the driver protocol's (conformance/DRIVER.md); package is
  // this client's own version.
  hello: async () => ({
    client: "typescript",
    version: "1",
    package: version,
    capabilities: ["semaphore", "rwlock", "election", "observe", "complete", "watch", "check_token", "multilock", "max_hold"],
  }),
  open_session: async (r) => {
    const opts = { ttlMs: Number(r.ttl_ms) };
    if (r.owner) opts.owner = r.owner;
    const s = await client.session(opts);
    sessions.set(r.session, s);
    s.signal.addEventListener("abort", () => {
      if (s.signal.reason?.code === "lease_lost") write({ event: "lease_lost", session: r.session, t: nowNs() });
    }, { once: true });
    return { session_id: s.id, owner: s.owner };
  },
  close_session: async (r) => { await get(sessions, r.session, "session").close(); sessions.delete(r.session); return {}; },
  session_deadline: async (r) => ({ deadline: BigInt(Math.round(get(sessions, r.session, "session").deadline * 1e6)) }),
  lock: (r) => take(r, (s) => s.mutex(r.name, mutexOpts(r)), "write", (l) => l.unlock()),
  try_lock: (r) => take({ ...r, try: true }, (s) => s.mutex(r.name, mutexOpts(r)), "write", (l) => l.unlock()),
  lock_deadline: async (r) => ({ deadline: BigInt(Math.round(get(locks, r.lock, "lock").l.deadline * 1e6)) }),
  semaphore: (r) => take(r, (s) => s.semaphore(r.name, Number(r.permits)), "write", (l) => l.unlock()),
  wlock: (r) => take(r, (s) => s.rwmutex(r.name), "write", (l) => l.unlock()),
  rlock: (r) => take(r, (s) => s.rwmutex(r.name), "read", (l) => l.runlock()),
  multi_lock: async (r) => {
    const s = get(sessions, r.session, "session");
    for (const m of r.modes ?? []) if (m !== "exclusive") throw new DriverError("invalid", `multi_lock: mode ${JSON.stringify(m)}: exclusive only`);
    const l = s.multiLock(r.names ?? []);
    if (r.try) await l.tryLock();
    else await l.lock(callOpts(r));
    locks.set(r.lock, { l, multi: true, unlock: () => l.unlock() });
    return { tokens: Object.fromEntries(l.tokens) };
  },
  unlock: async (r) => { const h = get(locks, r.lock, "lock"); await h.unlock(); return {}; },
  guarded: async (r) => {
    const h = get(locks, r.lock, "lock");
    try { return h.multi ? { tokens: Object.fromEntries(h.l.guard()) } : { token: h.l.guard() }; } catch (e) { throw new DriverError("lease_lost", e.message); }
  },
  check_token: async (r) => {
    const token = BigInt(r.token);
    const [chk, desc] = await Promise.all([client.checkToken(r.name, token), client.describeLock(r.name)]);
    let current = 0n;
    for (const h of desc.lock?.holders ?? []) if (h.token > current) current = h.token;
    return { valid: chk.valid, current };
  },
  complete: async (r) => { await get(locks, r.lock, "lock").l.complete(Number(r.retention_ms)); return {}; },
  campaign: async (r) => {
    const e = get(sessions, r.session, "session").election(r.name);
    await e.campaign(r.value ?? "", callOpts(r));
    elections.set(r.election, e);
    return { token: e.token };
  },
  resign: async (r) => { await get(elections, r.election, "election").resign(); return {}; },
  observe: async (r) => {
    const ac = new AbortController();
    streams.set(r.observe, ac);
    void (async () => {
      try {
        for await (const l of observeElection(client, r.name, { signal: ac.signal })) {
          write({ event: "leader", observe: r.observe, value: Buffer.from(l.value).toString(), token: l.token, t: nowNs() });
        }
      } catch (e) { console.error("observe", r.observe, e.message); }
    })();
    return {};
  },
  watch: async (r) => {
    const ac = new AbortController();
    streams.set(r.watch, ac);
    void (async () => {
      try {
        for await (const ev of client.watch(r.prefix ?? "", { from: r.from || undefined, signal: ac.signal })) {
          write({ event: "watch", watch: r.watch, kind: String(ev.kindName).toLowerCase(), name: ev.name, position: ev.position, token: ev.token, t: nowNs() });
        }
      } catch (e) { console.error("watch", r.watch, e.message); }
    })();
    return {};
  },
  stop: async (r) => { const k = r.observe ?? r.watch; get(streams, k, "observe/watch").abort(); streams.delete(k); return {}; },
  exit: async (r, self) => {
    // Let the answers in flight go out first (at most 2 s: a blocking lock may wait longer).
    const others = [...inflight].filter(([tok]) => tok !== self).map(([, p]) => p);
    await Promise.race([Promise.allSettled(others), new Promise((res) => setTimeout(res, 2000))]);
    exiting ??= shutdown();
    await exiting;
    setImmediate(() => process.exit(0));
    return {};
  },
};

async function handle(line, self) {
  let r;
  try { r = parse(line); } catch (e) { write({ id: null, ok: false, error: { code: "invalid", message: `bad JSON: ${e.message}` }, t0: nowNs(), t1: nowNs() }); return; }
  const t0 = nowNs();
  try {
    const op = ops[r.op];
    if (!op) throw new DriverError("invalid", `unknown op ${JSON.stringify(r.op)}`);
    const res = await op(r, self);
    write({ id: r.id, ok: true, ...res, t0, t1: nowNs() });
  } catch (e) {
    const code = e instanceof DriverError ? e.code : e instanceof LockdError ? codeMap[e.code] ?? "other" : "other";
    const error = { code, message: String(e?.message ?? e) };
    if (e instanceof LockdError && e.code === "busy") error.holder = e.holders[0]?.owner ?? "";
    write({ id: r.id, ok: false, error, t0, t1: nowNs() });
  }
}

const inflight = new Map();
createInterface({ input: process.stdin }).on("line", (line) => {
  if (!line.trim()) return;
  const tok = {};
  const p = handle(line, tok).catch(() => {});
  inflight.set(tok, p);
  void p.finally(() => inflight.delete(tok));
}).on("close", async () => {
  // stdin closed: let the answers in flight go out, then close the sessions.
  await Promise.allSettled([...inflight.values()]);
  exiting ??= shutdown();
  await exiting;
  process.exit(0);
});
