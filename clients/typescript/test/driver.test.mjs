// The conformance driver speaks protocol v1: a short session against a
// real lockd (the conformance suite runs it in full).
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { lockdBin, startCluster } from "./lockd.mjs";

test("driver protocol v1", { skip: lockdBin().skip, timeout: 60_000 }, async () => {
  const cluster = await startCluster(1);
  const p = spawn(process.execPath, [fileURLToPath(new URL("../driver.mjs", import.meta.url))], {
    env: { ...process.env, LOCKD_ENDPOINTS: cluster.endpoints.join(",") }, stdio: ["pipe", "pipe", "inherit"],
  });
  const waiting = new Map();
  const events = [];
  createInterface({ input: p.stdout }).on("line", (l) => {
    const m = JSON.parse(l.replace(/:\s*(\d{16,})/g, ':"$1"'));
    if (m.event) events.push(m);
    else waiting.get(m.id)?.(m);
  });
  let id = 0;
  const call = (op, args = {}) => new Promise((res) => { const i = ++id; waiting.set(i, res); p.stdin.write(JSON.stringify({ id: i, op, ...args }) + "\n"); });
  try {
    const hello = await call("hello");
    assert.equal(hello.client, "typescript");
    const a = await call("open_session", { session: "a", ttl_ms: 3000, owner: "owner-a" });
    assert.ok(a.ok && a.session_id && a.owner === "owner-a");
    await call("open_session", { session: "b", ttl_ms: 3000 });
    const l1 = await call("try_lock", { session: "a", lock: "l1", name: "drv" });
    assert.ok(l1.ok && BigInt(l1.token) > 0n && BigInt(l1.t1) >= BigInt(l1.t0));
    const busy = await call("try_lock", { session: "b", lock: "l2", name: "drv" });
    assert.deepEqual([busy.ok, busy.error.code, busy.error.holder], [false, "busy", "owner-a"]);
    const g = await call("guarded", { lock: "l1" });
    assert.equal(String(g.token), String(l1.token));
    const dl = await call("session_deadline", { session: "a" });
    assert.ok(BigInt(dl.deadline) > BigInt(dl.t0) && BigInt(dl.deadline) < BigInt(dl.t0) + 3_000_000_000n);
    const chk = await call("check_token", { name: "drv", token: l1.token });
    assert.deepEqual([chk.valid, String(chk.current)], [true, String(l1.token)]);
    const waiter = call("lock", { session: "b", lock: "l3", name: "drv", timeout_ms: 10_000 });
    await call("unlock", { lock: "l1" });
    const l3 = await waiter;
    assert.ok(l3.ok && BigInt(l3.token) > BigInt(l1.token));
    assert.equal((await call("guarded", { lock: "l1" })).error.code, "lease_lost");
    assert.equal((await call("complete", { lock: "l3", retention_ms: 60_000 })).ok, true);
    assert.equal((await call("lock", { session: "a", lock: "l4", name: "drv", timeout_ms: 2000 })).error.code, "done");
    assert.equal((await call("nonsense")).error.code, "invalid");
    assert.equal((await call("exit")).ok, true);
    assert.equal(await new Promise((r) => p.on("exit", r)), 0);
    assert.deepEqual(events.filter((e) => e.event === "lease_lost"), [], "no lease lost while the server ran");
  } finally {
    p.kill();
    await cluster.stop();
  }
});
