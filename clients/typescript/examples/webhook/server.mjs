// The payment-webhook story: a payment provider delivers each webhook at
// least once, to any of several processes behind a load balancer, and
// sometimes twice at the same time. Each webhook id must credit the
// account exactly once. Every process runs this server; they share lockd
// and the ledger (here a JSON-lines file standing in for a database).
//
// Per delivery: take the lock webhook/<id> (waiting behind a concurrent
// delivery of the same id), credit the ledger fenced by the lock's token,
// then Complete the lock: for the retention every later delivery of the
// id, to any process, is answered "done" by lockd without doing anything.
//
//   LOCKD_ENDPOINTS=http://127.0.0.1:7070 PORT=8081 LEDGER=/tmp/ledger.jsonl node server.mjs
import { appendFileSync } from "node:fs";
import { createServer } from "node:http";
import { Client } from "@lockd/client";

const port = Number(process.env.PORT ?? 8081);
const ledger = process.env.LEDGER ?? "ledger.jsonl";
const client = new Client(); // LOCKD_ENDPOINTS, LOCKD_TOKEN
const session = await client.session({ ttlMs: 10_000, owner: `webhook/${process.pid}` });

/** credit writes the ledger line, fenced: only while the lock is still ours (its lease deadline not passed). */
function credit(lock, hook) {
  const token = lock.guard(); // throws "lease_lost" once the client may no longer write
  appendFileSync(ledger, JSON.stringify({ id: hook.id, account: hook.account, amount: hook.amount, token: String(token), pid: process.pid }) + "\n");
}

async function handle(hook) {
  const lock = session.mutex(`webhook/${hook.id}`);
  try {
    await lock.lock({ timeoutMs: 10_000 });
  } catch (e) {
    if (e.code === "done") return { status: 200, body: { id: hook.id, result: "already processed" } };
    throw e;
  }
  try {
    credit(lock, hook);
    // Done for 7 days: later deliveries of this id get "done" at once.
    await lock.complete(7 * 24 * 3600 * 1000);
    return { status: 200, body: { id: hook.id, result: "credited" } };
  } finally {
    if (lock.held) await lock.unlock().catch(() => {}); // credit failed: let a retry try again
  }
}

const server = createServer((req, res) => {
  if (req.method !== "POST" || req.url !== "/webhook") { res.writeHead(404).end(); return; }
  let body = "";
  req.on("data", (d) => { body += d; });
  req.on("end", async () => {
    let out;
    try {
      const hook = JSON.parse(body);
      if (typeof hook.id !== "string" || !/^[A-Za-z0-9_-]{1,100}$/.test(hook.id)) out = { status: 400, body: { error: "bad webhook id" } };
      else out = await handle(hook);
    } catch (e) {
      out = { status: 503, body: { error: e.code ?? "other", message: e.message } }; // the provider redelivers
    }
    res.writeHead(out.status, { "content-type": "application/json" }).end(JSON.stringify(out.body));
  });
});
server.listen(port, "127.0.0.1", () => console.log(`webhook server ${process.pid} on 127.0.0.1:${port}`));

for (const sig of ["SIGINT", "SIGTERM"]) {
  process.on(sig, async () => {
    server.close();
    await client.close();
    process.exit(0);
  });
}
