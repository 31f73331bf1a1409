// The raw API (client.service()) against a real lockd, through the same
// retry loop as the rest (an endpoint where nothing listens is passed
// over); and the connect timeout against sockets that accept and never
// answer (a 127.0.0.1 server the test opens and never reads).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { Client, LockdError } from "../dist/index.js";
import { freePort, lockdBin, startCluster } from "./lockd.mjs";

const skip = lockdBin().skip;
let cluster;
before(async () => { if (!skip) cluster = await startCluster(1); });
after(async () => { await cluster?.stop(); });

for (const stream of [true, false]) {
  describe(`raw service stream=${stream}`, { skip }, () => {
    test("listSessions, listLocks, forceRelease, clearMark", async () => {
      const dead = `http://127.0.0.1:${await freePort()}`; // refuses: the loop moves on to the node
      const c = new Client({ endpoints: [dead, ...cluster.endpoints], stream });
      try {
        const svc = c.service();
        const owner = `raw-${stream}`;
        const s = await c.session({ ttlMs: 5000, owner });
        const m = await s.mutex(`raw/${stream}/a`).lock();
        const sessions = (await svc.listSessions({})).sessions.filter((x) => x.owner === owner);
        assert.deepEqual(sessions.map((x) => x.sessionId), [s.id]);
        assert.equal(sessions[0].holds, 1);
        const locks = (await svc.listLocks({ prefix: `raw/${stream}/` })).locks;
        assert.deepEqual(locks.map((l) => [l.name, l.holders[0]?.token]), [[m.name, m.token]]);

        const fr = await svc.forceRelease({ name: m.name }, { timeoutMs: 10_000 });
        assert.deepEqual(fr.sessionIds, [s.id]);
        // Safe force-release revokes the holder's session (its lock goes when its lease would have run out).
        assert.equal((await svc.listSessions({})).sessions.find((x) => x.sessionId === s.id)?.revoked, true);

        // Run once: complete, then the mark refuses the next lock until an admin clears it.
        const s2 = await c.session({ ttlMs: 5000 });
        const job = await s2.mutex(`raw/${stream}/job`).lock();
        await job.complete(60_000); // releases the lock and leaves the mark
        const err = await s2.mutex(`raw/${stream}/job`).tryLock().then(() => undefined, (e) => e);
        assert.ok(err instanceof LockdError && err.code === "done", String(err));
        await svc.clearMark({ name: job.name, token: err.mark.token });
        await (await s2.mutex(`raw/${stream}/job`).tryLock()).unlock();

        // A refusal is a LockdError, final (not retried).
        await assert.rejects(svc.forceRelease({ name: "" }), (e) => e instanceof LockdError && e.code === "invalid");
      } finally { await c.close(); }
    });
  });
}

describe("connect timeout", () => {
  let servers = [], sockets = [], endpoints = [];
  before(async () => {
    for (let i = 0; i < 2; i++) {
      // Accepts and never reads nor writes: a hung node, as seen from a client.
      const srv = createServer({ pauseOnConnect: true }, (sock) => { sockets.push(sock); });
      await new Promise((r) => srv.listen(0, "127.0.0.1", r));
      servers.push(srv);
      endpoints.push(`http://127.0.0.1:${srv.address().port}`);
    }
  });
  after(async () => {
    for (const s of sockets) s.destroy();
    await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
  });

  for (const stream of [true, false]) {
    test(`endpoints that accept and never answer: unavailable within the connect timeout (stream=${stream})`, async () => {
      // Without the connect timeout these calls would retry for the 30 s retry budget.
      const c = new Client({ endpoints, stream, connectTimeoutMs: 1000, requestTimeoutMs: 5000, retryTimeoutMs: 30_000 });
      try {
        for (const call of [() => c.session({ ttlMs: 5000 }), () => c.status(), () => c.service().listLocks({ prefix: "" })]) {
          const t0 = Date.now();
          const e = await call().then(() => undefined, (x) => x);
          const took = Date.now() - t0;
          assert.ok(e instanceof LockdError, String(e));
          assert.equal(e.code, "unavailable", e.message);
          assert.match(e.message, /no endpoint answered within the connect timeout \(1000 ms\)/);
          // Generous bound on a busy machine, far below the retry budget.
          assert.ok(took < 10_000, `took ${took} ms`);
        }
        assert.ok(sockets.length > 0, "the client did connect");
      } finally { await c.close(); }
    });
  }

  test("a negative connect timeout is refused", () => {
    assert.throws(() => new Client({ endpoints, connectTimeoutMs: -1 }), (e) => e.code === "invalid");
  });
});
