// TLS against a real `lockd serve` with --tls-client-auth require and an
// auth file that grants by client certificate (PKI made by `lockd cert`),
// over the session stream and unary: the right certificate gets a lock;
// no client certificate, a server CA not trusted, or a client certificate
// from another CA is refused at once with a TLS error, not a hang.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { appendFileSync, copyFileSync, mkdirSync, renameSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client, LockdError } from "../dist/index.js";
import { freePort, lockdBin, Node, waitFor } from "./lockd.mjs";

const skip = lockdBin().skip;
let dir, node, url;
const f = (p) => join(dir, p);

before(async () => {
  if (skip) return;
  dir = mkdtempSync(join(tmpdir(), "lockd-ts-tls-"));
  const lockd = (...a) => execFileSync(lockdBin().path, a, { cwd: dir, stdio: ["ignore", "pipe", "pipe"] }).toString();
  lockd("cert", "ca", "--dir", "pki");
  lockd("cert", "node", "n0", "--dir", "pki");
  lockd("cert", "client", "app", "--dir", "pki");
  lockd("cert", "ca", "--dir", "other");
  lockd("cert", "client", "app", "--dir", "other");
  // app: its certificate's name, may lock anything; billing-app: a token, only billing/.
  writeFileSync(f("auth.txt"), lockd("token", "--out", "billing.token", "--grant", "lock:billing/", "billing-app"));
  appendFileSync(f("auth.txt"), "grant app lock\n");
  const api = await freePort(), raft = await freePort();
  node = new Node(["--node-id", "n0", "--data-dir", f("n0"), "--listen", `127.0.0.1:${api}`, "--raft-listen", `127.0.0.1:${raft}`,
    "--tls-cert", f("pki/n0.crt"), "--tls-key", f("pki/n0.key"), "--tls-ca", f("pki/ca.crt"), "--tls-client-auth", "require", "--auth-file", f("auth.txt")], dir);
  url = `127.0.0.1:${api}`; // no scheme: https, because TLS options are given
  node.start();
  const c = new Client({ endpoints: [url], stream: false, requestTimeoutMs: 1000, tls: good() });
  await waitFor(async () => { try { return !!(await c.status({ timeoutMs: 2000 })).leader; } catch { return false; } }, 30_000, "the TLS node to lead");
  await c.close();
});
after(async () => { await node?.stop(); if (dir) rmSync(dir, { recursive: true, force: true }); });

const good = () => ({ caFile: f("pki/ca.crt"), certFile: f("pki/app.crt"), keyFile: f("pki/app.key") });

for (const stream of [true, false]) {
  describe(`tls stream=${stream}`, { skip }, () => {
    const mk = (o) => new Client({ endpoints: [url], stream, ...o });

    test("the right client certificate gets a lock (PEM or files), token by file on top", async () => {
      for (const tls of [good(), { ca: readFileSync(f("pki/ca.crt")), cert: readFileSync(f("pki/app.crt"), "utf8"), key: readFileSync(f("pki/app.key")) }]) {
        const c = mk({ tls });
        try {
          const s = await c.session({ ttlMs: 5000 });
          const m = await s.mutex(`tls-${stream}`).lock({ timeoutMs: 10_000 });
          assert.equal((await c.checkToken(m.name, m.token)).valid, true);
          // A watch over TLS: the hold in its state, then the release.
          const ac = new AbortController();
          const t = setTimeout(() => ac.abort(), 20_000);
          const kinds = [];
          for await (const ev of c.watch(m.name, { signal: ac.signal, state: true })) {
            kinds.push(ev.kindName);
            if (ev.kindName === "SYNCED") await m.unlock();
            if (ev.kindName === "RELEASED") break;
          }
          clearTimeout(t);
          assert.deepEqual(kinds, ["HELD", "SYNCED", "RELEASED"]);
        } finally { await c.close(); }
      }
      // With a token, the token's identity is judged (billing/ only), on every call of both transports.
      const t = mk({ tls: good(), tokenFile: f("billing.token") });
      try {
        const s = await t.session({ ttlMs: 5000 });
        await (await s.mutex(`billing/tls-${stream}`).lock({ timeoutMs: 10_000 })).unlock();
        await assert.rejects(s.mutex(`payments/tls-${stream}`).tryLock(), (e) => e instanceof LockdError && e.code === "permission_denied");
      } finally { await t.close(); }
    });

    test("certificate files are read again when they change (a renewal reaches the next connection)", async () => {
      const put = (from) => {
        for (const ext of ["crt", "key"]) { copyFileSync(f(`${from}.${ext}`), f(`rot-${stream}.${ext}.tmp`)); renameSync(f(`rot-${stream}.${ext}.tmp`), f(`rot-${stream}.${ext}`)); }
      };
      put("other/app"); // a certificate the server does not accept
      const c = mk({ tls: { caFile: f("pki/ca.crt"), certFile: f(`rot-${stream}.crt`), keyFile: f(`rot-${stream}.key`) } });
      try {
        await assert.rejects(c.session({ ttlMs: 5000, timeoutMs: 20_000 }), (e) => e.code === "unavailable" && /refused the client certificate/.test(e.message));
        put("pki/app"); // renewed, moved into place
        const s = await c.session({ ttlMs: 5000, timeoutMs: 20_000 });
        await (await s.mutex(`rot-${stream}`).lock({ timeoutMs: 10_000 })).unlock();
      } finally { await c.close(); }
    });

    for (const [what, tls, why] of [
      ["no client certificate", () => ({ caFile: f("pki/ca.crt") }), /requires a client certificate/],
      ["a server CA not trusted", () => ({ ...good(), caFile: f("other/ca.crt") }), /server's certificate is not trusted/],
      ["a client certificate from another CA", () => ({ caFile: f("pki/ca.crt"), certFile: f("other/app.crt"), keyFile: f("other/app.key") }), /refused the client certificate/],
    ]) {
      test(`${what} is refused with a TLS error, not a hang`, async () => {
        const c = mk({ tls: tls() });
        try {
          // Given 20 s, a hang would end in "deadline": the TLS error comes first, and is final.
          await assert.rejects(c.session({ ttlMs: 5000, timeoutMs: 20_000 }), (e) => {
            assert.ok(e instanceof LockdError);
            assert.equal(e.code, "unavailable", e.message);
            assert.match(e.message, /tls handshake with https:\/\/127\.0\.0\.1:\d+ failed/);
            assert.match(e.message, why);
            return true;
          });
          await assert.rejects(c.status({ timeoutMs: 20_000 }), (e) => e.code === "unavailable" && why.test(e.message));
          // A watch does not reconnect for ever: the TLS error ends it (the abort only bounds a hang).
          const ac = new AbortController();
          const t = setTimeout(() => ac.abort(), 20_000);
          try {
            await assert.rejects((async () => { for await (const _ of c.watch("tls/", { signal: ac.signal })) { /* none */ } throw new Error("watch ended without an error"); })(),
              (e) => e.code === "unavailable" && why.test(e.message));
          } finally { clearTimeout(t); }
        } finally { await c.close(); }
      });
    }
  });
}

describe("README", { skip }, () => {
  test("the Secure clusters snippet runs as written against the TLS node", () => {
    // The directory is laid out as the walkthrough's (pki/, billing.token); the package resolves as @lockd/client.
    const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8");
    const snippet = /^## Secure clusters$[\s\S]*?^```js$\n([\s\S]*?)^```$/m.exec(readme)?.[1];
    assert.ok(snippet, "the README has a js block under Secure clusters");
    writeFileSync(f("secure.mjs"), snippet);
    mkdirSync(f("node_modules/@lockd"), { recursive: true });
    symlinkSync(fileURLToPath(new URL("..", import.meta.url)), f("node_modules/@lockd/client"));
    const out = execFileSync(process.execPath, ["secure.mjs"], { cwd: dir, env: { ...process.env, LOCKD_ENDPOINTS: url }, timeout: 60_000 }).toString();
    assert.match(out, /^holding billing\/invoices with token \d+n$/m);
  });
});

describe("tls options", () => {
  test("bad options are refused when the client is made", () => {
    const dir2 = mkdtempSync(join(tmpdir(), "lockd-ts-tlsopt-"));
    try {
      writeFileSync(join(dir2, "empty.token"), "\n");
      for (const o of [
        { tls: { caFile: join(dir2, "missing.crt") } },
        { tls: { ca: "not a pem", caFile: join(dir2, "x") } },
        { tls: { cert: "x" } },
        { tls: { ca: "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n" } },
        { tokenFile: join(dir2, "missing.token") },
        { tokenFile: join(dir2, "empty.token") },
        { token: "a", tokenFile: join(dir2, "empty.token") },
      ]) {
        assert.throws(() => new Client({ endpoints: ["127.0.0.1:1"], ...o }), (e) => e instanceof LockdError && e.code === "invalid", JSON.stringify(o));
      }
    } finally { rmSync(dir2, { recursive: true, force: true }); }
  });
});
