// The client against real lockd processes, with the session stream on and
// off (LOCKD_STREAM=off's unary path must keep every guarantee too).
import { after, afterEach, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { Client, LockdError, leaseDeadline } from "../dist/index.js";
import { lockdBin, startCluster, waitFor } from "./lockd.mjs";

const skip = lockdBin().skip;
let cluster;
// Node 20's JavaScript has no `await using` (TypeScript compiles it for
// users): the clients a test makes are closed after it.
const clients = [];
const track = (c) => { clients.push(c); return c; };
afterEach(async () => { await Promise.all(clients.splice(0).map((c) => c[Symbol.asyncDispose]())); });
before(async () => { if (!skip) cluster = await startCluster(1); });
after(async () => { await cluster?.stop(); });

for (const stream of [true, false]) {
  describe(`stream=${stream}`, { skip }, () => {
    const mk = () => new Client({ endpoints: cluster.endpoints, stream });
    const name = (n) => `${n}-${stream}`;

    test("mutual exclusion, increasing tokens, busy names the holder", async () => {
      const c = track(mk());
      const s1 = await c.session({ ttlMs: 5000, owner: "one" });
      const s2 = await c.session({ ttlMs: 5000, owner: "two" });
      let inside = 0, maxInside = 0, last = 0n;
      const worker = async (s) => {
        for (let i = 0; i < 10; i++) {
          const m = await s.mutex(name("mx")).lock({ timeoutMs: 10_000 });
          inside++; maxInside = Math.max(maxInside, inside);
          assert.ok(m.token > last, "tokens increase");
          last = m.token;
          await new Promise((r) => setImmediate(r));
          inside--;
          await m.unlock();
        }
      };
      await Promise.all([worker(s1), worker(s2)]);
      assert.equal(maxInside, 1);
      const held = await s1.mutex(name("busy")).tryLock();
      await assert.rejects(s2.mutex(name("busy")).tryLock(), (e) => e instanceof LockdError && e.code === "busy" && e.holders[0].owner === "one");
      assert.equal((await c.checkToken(name("busy"), held.token)).valid, true);
      await held.unlock();
      assert.equal((await c.checkToken(name("busy"), held.token)).valid, false);
    });

    test("a blocking lock that times out withdraws its wait", async () => {
      const c = track(mk());
      const s1 = await c.session({ ttlMs: 5000 });
      const s2 = await c.session({ ttlMs: 5000 });
      const m = await s1.mutex(name("to")).lock();
      const t0 = Date.now();
      await assert.rejects(s2.mutex(name("to")).lock({ timeoutMs: 300 }), (e) => e.code === "deadline");
      assert.ok(Date.now() - t0 < 5000, "returns near its timeout");
      await m.unlock();
      // The withdrawn wait must not have been granted: a third session takes it at once.
      const s3 = await c.session({ ttlMs: 5000 });
      await waitFor(async () => { try { await (await s3.mutex(name("to")).tryLock()).unlock(); return true; } catch (e) { if (e.code !== "busy") throw e; return false; } }, 5000, "the lock to be free");
    });

    test("await using releases; complete runs once", async () => {
      const c = track(mk());
      const s = await c.session({ ttlMs: 5000 });
      const m = await s.mutex(name("using")).lock();
      assert.ok(m.held);
      await m[Symbol.asyncDispose](); // what `await using` calls at the end of its block
      const again = await s.mutex(name("using")).tryLock(); // released by disposal
      const token = again.token;
      await again.complete(60_000);
      assert.equal(again.held, false);
      const s2 = await c.session({ ttlMs: 5000, owner: "late" });
      await assert.rejects(s2.mutex(name("using")).lock({ timeoutMs: 2000 }), (e) => e.code === "done" && e.mark.token === token);
    });

    test("semaphore and read-write lock", async () => {
      const c = track(mk());
      const ss = await Promise.all([1, 2, 3].map(() => c.session({ ttlMs: 5000 })));
      const a = await ss[0].semaphore(name("sem"), 2).tryLock();
      const b = await ss[1].semaphore(name("sem"), 2).tryLock();
      assert.notEqual(a.token, b.token);
      await assert.rejects(ss[2].semaphore(name("sem"), 2).tryLock(), (e) => e.code === "busy");
      await assert.rejects(ss[2].semaphore(name("sem"), 3).tryLock(), (e) => e.code === "limit_mismatch");
      const r1 = await ss[0].rwmutex(name("rw")).rlock();
      const r2 = await ss[1].rwmutex(name("rw")).tryRLock();
      await assert.rejects(ss[2].rwmutex(name("rw")).tryLock(), (e) => e.code === "busy");
      const w = ss[2].rwmutex(name("rw")).lock({ timeoutMs: 10_000 });
      await r1.runlock();
      await r2.runlock();
      assert.ok((await w).token > r2.token);
    });

    test("election: campaign in order, observe, proclaim, resign", async () => {
      const c = track(mk());
      const s1 = await c.session({ ttlMs: 5000, owner: "a" });
      const s2 = await c.session({ ttlMs: 5000, owner: "b" });
      const ac = new AbortController();
      const seen = [];
      const obs = (async () => { for await (const l of s1.election(name("el")).observe({ signal: ac.signal })) seen.push(Buffer.from(l.value).toString()); })();
      const e1 = await s1.election(name("el")).campaign("first");
      const e2p = s2.election(name("el")).campaign("second", { timeoutMs: 10_000 });
      assert.equal(Buffer.from((await e1.leader()).value).toString(), "first");
      await e1.proclaim("first-again");
      await e1.resign();
      const e2 = await e2p;
      assert.ok(e2.token > e1.token || e2.token > 0n);
      await waitFor(() => seen.includes("second"), 5000, "observer to see the second leader");
      ac.abort();
      await obs;
      assert.ok(seen.indexOf("first") < seen.indexOf("second"));
      assert.ok(seen.includes("first-again"));
    });

    test("watch resumes from a position", async () => {
      const c = track(mk());
      const s = await c.session({ ttlMs: 5000 });
      const ac = new AbortController();
      const it = c.watch(name("w") + "/", { signal: ac.signal });
      const first = it.next();
      await new Promise((r) => setTimeout(r, 200));
      const m = await s.mutex(name("w") + "/x").lock();
      const ev = (await first).value;
      assert.equal(ev.kindName, "GRANTED");
      assert.equal(ev.token, m.token);
      await m.unlock();
      const again = c.watch(name("w") + "/", { from: ev.position, signal: ac.signal });
      const next = (await again.next()).value;
      assert.equal(next.kindName, "RELEASED");
      ac.abort();
    });

    test("session close releases its locks; its signal fires", async () => {
      const c = track(mk());
      const s = await c.session({ ttlMs: 5000 });
      const m = await s.mutex(name("close")).lock();
      await s.close();
      assert.ok(m.signal.aborted && s.signal.aborted);
      assert.equal(s.signal.reason.code, "session_closed");
      const s2 = await c.session({ ttlMs: 5000 });
      await (await s2.mutex(name("close")).tryLock()).unlock();
    });
  });
}

describe("lease", { skip }, () => {
  test("deadline rule: sent + TTL·0.99 − max(100 ms, 2 % TTL)", () => {
    assert.equal(leaseDeadline(1000, 10_000), 1000 + 10_000 - 100 - 200);
    assert.equal(leaseDeadline(0, 2000), 2000 - 20 - 100);
  });

  test("a frozen server: the client declares the lease lost before the server may expire it", async () => {
    const own = await startCluster(1);
    try {
      for (const stream of [true, false]) {
        const c = track(new Client({ endpoints: own.endpoints, stream, requestTimeoutMs: 1000 }));
        const s = await c.session({ ttlMs: 2000 });
        const m = await s.mutex(`frozen-${stream}`).lock();
        const deadline = s.deadline; // moves on with every confirmed keepalive
        own.nodes[0].signal("SIGSTOP");
        const stoppedAt = Date.now();
        try {
          await new Promise((r) => s.signal.addEventListener("abort", r, { once: true }));
          const lostAt = Date.now();
          assert.equal(s.signal.reason.code, "lease_lost");
          assert.ok(m.signal.aborted, "the lock's signal fired too");
          assert.throws(() => m.guard(), (e) => e.code === "lease_lost");
          // The last keepalive was sent before the stop: the server's TTL
          // for it runs at least until stoppedAt + ... > the client's deadline.
          assert.ok(lostAt <= stoppedAt + 2000, `lost ${lostAt - stoppedAt} ms after the stop, within one TTL`);
          assert.ok(s.deadline >= deadline);
        } finally {
          own.nodes[0].signal("SIGCONT");
        }
      }
    } finally {
      await own.stop();
    }
  });
});
