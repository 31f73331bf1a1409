// A three-node cluster whose leader is killed (SIGKILL): the session lives
// on through the new leader (leader hints, resends with the same seq), the
// lock stays held, and new acquires are served.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "../dist/index.js";
import { lockdBin, startCluster } from "./lockd.mjs";

test("leader kill -9: sessions survive, locks stay held", { skip: lockdBin().skip, timeout: 120_000 }, async () => {
  const cluster = await startCluster(3);
  const c = new Client({ endpoints: cluster.endpoints });
  try {
    const s = await c.session({ ttlMs: 8000 });
    const m = await s.mutex("failover").lock({ timeoutMs: 10_000 });
    const st = await c.status();
    const leader = cluster.nodes.find((n) => n.args.includes(st.leader));
    assert.ok(leader, `leader ${st.leader} is one of ours`);
    leader.signal("SIGKILL");
    // Calls go on through the new leader; nothing here waits on the dead node for long.
    const s2 = await c.session({ ttlMs: 8000, timeoutMs: 30_000 });
    await assert.rejects(s2.mutex("failover").tryLock({ timeoutMs: 30_000 }), (e) => e.code === "busy");
    const other = await s2.mutex("failover-2").lock({ timeoutMs: 30_000 });
    assert.ok(other.token > m.token);
    // Keepalives reach the new leader: the first session outlives its TTL.
    await new Promise((r) => setTimeout(r, 9000));
    assert.equal(s.signal.aborted, false, `session lost: ${s.signal.reason?.message}`);
    assert.equal((await c.checkToken("failover", m.guard())).valid, true);
    await m.unlock({ timeoutMs: 30_000 });
  } finally {
    await c.close();
    await cluster.stop();
  }
});
