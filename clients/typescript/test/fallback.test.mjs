// Behind a proxy that speaks only HTTP/1.1 the session stream cannot open:
// the client must fall back to unary calls on that endpoint and keep
// working (sessions, keepalives, locks).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer, request } from "node:http";
import { Client } from "../dist/index.js";
import { lockdBin, startCluster } from "./lockd.mjs";

test("an HTTP/1.1-only proxy: unary fallback", { skip: lockdBin().skip, timeout: 60_000 }, async () => {
  const cluster = await startCluster(1);
  const target = new URL(cluster.endpoints[0]);
  const proxy = createServer((req, res) => {
    const up = request({ host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers }, (r) => {
      res.writeHead(r.statusCode, r.headers);
      r.pipe(res);
    });
    up.on("error", () => res.destroy());
    req.pipe(up);
  });
  await new Promise((r) => proxy.listen(0, "127.0.0.1", r));
  const c = new Client({ endpoints: [`http://127.0.0.1:${proxy.address().port}`] });
  try {
    const s = await c.session({ ttlMs: 2000, timeoutMs: 20_000 });
    const m = await s.mutex("fallback").lock({ timeoutMs: 10_000 });
    await new Promise((r) => setTimeout(r, 2500)); // longer than the TTL: unary keepalives kept it
    assert.equal(s.signal.aborted, false, `session lost: ${s.signal.reason?.message}`);
    assert.ok(m.guard() > 0n);
    await m.unlock();
    assert.equal(c.eps[0].stream.isOpen(), false);
  } finally {
    await c.close();
    proxy.close();
    proxy.closeAllConnections();
    await cluster.stop();
  }
});
