// MultiLock (AcquireMany) and the deadlock refusal against a real lockd
// process, with the session stream on and off.
import { after, afterEach, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { Client, LockdError } from "../dist/index.js";
import { lockdBin, startCluster, waitFor } from "./lockd.mjs";

const skip = lockdBin().skip;
let cluster;
const clients = [];
const track = (c) => { clients.push(c); return c; };
afterEach(async () => { await Promise.all(clients.splice(0).map((c) => c[Symbol.asyncDispose]())); });
before(async () => { if (!skip) cluster = await startCluster(1); });
after(async () => { await cluster?.stop(); });

for (const stream of [true, false]) {
  describe(`stream=${stream}`, { skip }, () => {
    const mk = () => track(new Client({ endpoints: cluster.endpoints, stream }));
    const name = (n) => `ml-${n}-${stream}`;

    test("a set is refused, queued and granted whole", async () => {
      const c = mk();
      const s1 = await c.session({ ttlMs: 5000, owner: "single" });
      const s2 = await c.session({ ttlMs: 5000, owner: "set" });
      const single = await s1.mutex(name("a")).tryLock();
      const set = s2.multiLock([name("a"), name("b")]);
      await assert.rejects(set.tryLock(), (e) => e instanceof LockdError && e.code === "busy");
      assert.equal((await c.describeLock(name("b"))).lock?.holders.length ?? 0, 0, "a refused set holds nothing");
      const p = set.lock({ timeoutMs: 20_000 });
      await waitFor(async () => ((await c.describeLock(name("b"))).lock?.waiters.length ?? 0) === 1, 10_000, "the set queued");
      assert.equal((await c.describeLock(name("b"))).lock?.holders.length ?? 0, 0, "a queued set holds nothing");
      await single.unlock();
      await p;
      const toks = set.guard();
      assert.equal(toks.size, 2);
      assert.ok(toks.get(name("a")) > single.token, "the set's token fences the single holder's");
      await assert.rejects(s1.mutex(name("b")).tryLock(), (e) => e.code === "busy");
      await set.unlock();
      assert.throws(() => set.guard(), (e) => e.code === "not_held");
      const again = await s1.mutex(name("b")).tryLock();
      assert.ok(again.token > toks.get(name("b")));
      await again.unlock();
    });

    test("sets in opposite orders do not deadlock", async () => {
      const c = mk();
      const ss = [await c.session({ ttlMs: 5000 }), await c.session({ ttlMs: 5000 })];
      const orders = [[name("x"), name("y")], [name("y"), name("x")]];
      let inside = 0, maxInside = 0;
      await Promise.all(ss.map(async (s, i) => {
        for (let k = 0; k < 5; k++) {
          const m = await s.multiLock(orders[i]).lock({ timeoutMs: 20_000 });
          inside++; maxInside = Math.max(maxInside, inside);
          await new Promise((r) => setImmediate(r));
          inside--;
          await m.unlock();
        }
      }));
      assert.equal(maxInside, 1);
    });

    test("a hold budget: the client gives up before the server grants the next holder", async () => {
      const c = mk();
      const s1 = await c.session({ ttlMs: 10_000 });
      const s2 = await c.session({ ttlMs: 10_000 });
      await assert.rejects(s1.mutex(name("h"), { maxHoldMs: 10 }).lock(), (e) => e.code === "invalid");
      const m = await s1.mutex(name("h"), { maxHoldMs: 1000 }).lock({ timeoutMs: 10_000 });
      assert.ok(m.deadline < s1.deadline, "the budget ends before the lease");
      assert.ok(m.deadline <= Date.now() + 1000);
      const ended = new Promise((res) => m.signal.addEventListener("abort", () => res(Date.now()), { once: true }));
      const next = await s2.mutex(name("h")).lock({ timeoutMs: 20_000 });
      const grantedAt = Date.now();
      const gaveUp = await ended;
      assert.ok(gaveUp <= grantedAt, "the holder's client gave up before the next holder had the lock");
      assert.throws(() => m.guard(), (e) => e.code === "hold_expired");
      assert.ok(next.token > m.token);
      assert.equal(s1.signal.aborted, false, "the session lives on");
      await next.unlock();
    });

    test("bad name lists are invalid; a wait closing a cycle is a deadlock", async () => {
      const c = mk();
      const s1 = await c.session({ ttlMs: 5000 });
      const s2 = await c.session({ ttlMs: 5000 });
      await assert.rejects(s1.multiLock([name("p")]).tryLock(), (e) => e.code === "invalid");
      await assert.rejects(s1.multiLock([name("p"), name("p")]).tryLock(), (e) => e.code === "invalid");
      const a = await s1.mutex(name("p")).tryLock();
      const b = await s2.mutex(name("q")).tryLock();
      const first = s1.mutex(name("q")).lock({ timeoutMs: 20_000 });
      await waitFor(async () => ((await c.describeLock(name("q"))).lock?.waiters.length ?? 0) === 1, 10_000, "the first wait queued");
      await assert.rejects(s2.mutex(name("p")).lock({ timeoutMs: 10_000 }), (e) => e instanceof LockdError && e.code === "deadlock");
      await b.unlock();
      await (await first).unlock();
      await a.unlock();
    });
  });
}
