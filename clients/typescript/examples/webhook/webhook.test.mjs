// The payment-webhook example end to end: one lockd, three server
// processes, every webhook delivered to all three at once and once more
// later; the ledger must credit each id exactly once.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { freePort, lockdBin, startCluster, waitFor } from "../../test/lockd.mjs";

const here = fileURLToPath(new URL(".", import.meta.url));

test("each webhook id is credited once across three processes", { skip: lockdBin().skip, timeout: 120_000 }, async () => {
  const cluster = await startCluster(1);
  const ledger = join(mkdtempSync(join(tmpdir(), "webhook-")), "ledger.jsonl");
  const servers = [];
  try {
    for (let i = 0; i < 3; i++) {
      const port = await freePort();
      const p = spawn(process.execPath, [join(here, "server.mjs")], {
        env: { ...process.env, LOCKD_ENDPOINTS: cluster.endpoints.join(","), PORT: String(port), LEDGER: ledger },
        stdio: ["ignore", "pipe", "inherit"],
      });
      const ready = new Promise((res) => p.stdout.on("data", (d) => { if (String(d).includes("on 127.0.0.1")) res(); }));
      servers.push({ p, url: `http://127.0.0.1:${port}/webhook`, ready });
    }
    await Promise.all(servers.map((s) => s.ready));
    const ids = Array.from({ length: 25 }, (_, i) => `evt_${i}`);
    const deliver = async (url, id) => {
      for (let attempt = 0; ; attempt++) {
        const r = await fetch(url, { method: "POST", body: JSON.stringify({ id, account: "acct_1", amount: 100 }) });
        const body = await r.json();
        if (r.status === 200) return body.result;
        assert.ok(attempt < 5, `delivery of ${id} kept failing: ${JSON.stringify(body)}`); // a 503 is redelivered, as a provider would
      }
    };
    // Every id to all three processes at the same time...
    const first = await Promise.all(ids.flatMap((id) => servers.map((s) => deliver(s.url, id))));
    // ...and once more later, to one of them.
    const later = await Promise.all(ids.map((id, i) => deliver(servers[i % 3].url, id)));
    assert.ok(later.every((r) => r === "already processed"));
    assert.equal(first.filter((r) => r === "credited").length, ids.length);
    await waitFor(() => existsSync(ledger), 1000, "the ledger");
    const lines = readFileSync(ledger, "utf8").trim().split("\n").map((l) => JSON.parse(l));
    const byId = new Map();
    for (const l of lines) byId.set(l.id, (byId.get(l.id) ?? 0) + 1);
    assert.equal(lines.length, ids.length, "one ledger line per webhook id");
    for (const id of ids) assert.equal(byId.get(id), 1, `${id} credited once`);
    assert.ok(new Set(lines.map((l) => l.pid)).size >= 2, "the work spread over the processes");
  } finally {
    for (const s of servers) s.p.kill("SIGTERM");
    await Promise.all(servers.map((s) => new Promise((r) => (s.p.exitCode !== null ? r() : s.p.on("exit", r)))));
    await cluster.stop();
  }
});
