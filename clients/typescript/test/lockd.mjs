// Test helper: real `lockd serve` processes on free 127.0.0.1 ports. The
// binary is LOCKD_BIN, or built from this repository with `go build`. When
// neither go nor LOCKD_BIN is there the tests skip with a message, except
// under CI=true where they fail.
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "../dist/index.js";

const repo = resolve(fileURLToPath(new URL("../../..", import.meta.url)));
let bin;

/** lockdBin returns the lockd binary, or a reason to skip. */
export function lockdBin() {
  if (bin !== undefined) return bin;
  if (process.env.LOCKD_BIN) return (bin = { path: process.env.LOCKD_BIN });
  const out = join(tmpdir(), `lockd-ts-test-${process.pid}`, "lockd");
  try {
    execFileSync("go", ["build", "-o", out, "./cmd/lockd"], { cwd: repo, stdio: ["ignore", "ignore", "pipe"] });
    bin = { path: out };
  } catch (e) {
    const why = `no lockd binary: set LOCKD_BIN or install go (${String(e.message).split("\n")[0]})`;
    if (process.env.CI === "true") throw new Error(why);
    bin = { skip: why };
  }
  return bin;
}

/** freePort returns a port free on 127.0.0.1 now. */
export function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => res(p)); });
  });
}

/** Node is one lockd serve process. */
export class Node {
  constructor(args, dir) { this.args = args; this.dir = dir; }
  start() {
    this.proc = spawn(lockdBin().path, ["serve", ...this.args], { stdio: ["ignore", "ignore", "pipe"] });
    this.log = "";
    this.proc.stderr.on("data", (d) => { this.log = (this.log + d).slice(-20000); });
    this.exited = new Promise((r) => this.proc.on("exit", r));
  }
  signal(sig) { this.proc.kill(sig); }
  async stop() {
    if (!this.proc || this.proc.exitCode !== null) return;
    this.proc.kill("SIGCONT");
    this.proc.kill("SIGTERM");
    const t = setTimeout(() => this.proc.kill("SIGKILL"), 5000);
    await this.exited;
    clearTimeout(t);
  }
}

/** startCluster starts n nodes (the first bootstraps, the others join) and waits until a leader answers. */
export async function startCluster(n = 1, extra = []) {
  const dir = mkdtempSync(join(tmpdir(), "lockd-ts-"));
  const nodes = [];
  for (let i = 0; i < n; i++) {
    const api = await freePort(), raft = await freePort();
    const args = ["--data-dir", join(dir, `n${i}`), "--listen", `127.0.0.1:${api}`, "--raft-listen", `127.0.0.1:${raft}`, "--node-id", `n${i}`, ...extra];
    if (i > 0) args.push("--join", nodes[0].url);
    const node = new Node(args, dir);
    node.url = `http://127.0.0.1:${api}`;
    node.start();
    nodes.push(node);
    if (i === 0) await waitReady([node.url]);
  }
  const endpoints = nodes.map((x) => x.url);
  if (n > 1) await waitMembers(endpoints, n);
  return {
    nodes, endpoints,
    async stop() { await Promise.all(nodes.map((x) => x.stop())); rmSync(dir, { recursive: true, force: true }); },
  };
}

async function waitReady(endpoints) {
  const c = new Client({ endpoints, stream: false, requestTimeoutMs: 1000 });
  const until = Date.now() + 30_000;
  for (;;) {
    try { const st = await c.status({ timeoutMs: 2000 }); if (st.leader) break; } catch (e) { if (Date.now() > until) throw e; }
    if (Date.now() > until) throw new Error("lockd did not become ready in 30 s");
    await new Promise((r) => setTimeout(r, 100));
  }
  await c.close();
}

async function waitMembers(endpoints, n) {
  const c = new Client({ endpoints, stream: false, requestTimeoutMs: 1000 });
  const until = Date.now() + 60_000;
  for (;;) {
    try {
      const st = await c.status({ timeoutMs: 2000 });
      if (st.leader && st.members.filter((m) => m.voter).length === n) break;
    } catch { /* polling */ }
    if (Date.now() > until) throw new Error(`cluster of ${n} did not form in 60 s`);
    await new Promise((r) => setTimeout(r, 200));
  }
  await c.close();
}

/** waitFor polls cond until it holds, up to ms. */
export async function waitFor(cond, ms, what) {
  const until = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export { existsSync };
