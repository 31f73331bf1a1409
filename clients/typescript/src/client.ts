// Client: endpoints, transports and the retry loop (do) every call goes
// through. Sessions and locks are in session.ts and lock.ts.
import { type Client as RpcClient, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { readFileSync } from "node:fs";
import type { Agent as HttpsAgent } from "node:https";
import type { Socket } from "node:net";
import { ClusterService, LockService, SessionService, WatchService, type CheckTokenResponse, type StatusResponse, type DescribeLockResponse } from "./gen/lockd/v1/lockd_pb.js";
import { detailOf, LockdError, toLockdError } from "./errors.js";
import { now } from "./lease.js";
import {
  attemptTimeout, type Ctx, ctxDone, ctxError, ctxWithin, delay, electionUnderWay, isRefused, type Policy,
  retryable, sleep, streamBroken, unanswered,
} from "./retry.js";
import { KeepaliveScheduler } from "./keepalive.js";
import { StreamSlot } from "./stream.js";
import type { Session, SessionOptions } from "./session.js";
import { openSession } from "./session.js";
import { dialer, httpsAgent, probeTls, resetBeforeAnswer, TlsMaterial, type TlsOptions, tlsError, tlsRefusal } from "./tls.js";
import { clusterService, type ClusterServiceRaw, lockService, type LockServiceRaw } from "./service.js";
import { type WatchEvent, type WatchOptions, watch } from "./watch.js";

/** Options of a Client. */
export interface ClientOptions {
  /** API URLs of the cluster's nodes (default LOCKD_ENDPOINTS, comma-separated, else http://127.0.0.1:7070). */
  endpoints?: string[];
  /** Bearer token for a server run with --auth-file (default LOCKD_TOKEN). */
  token?: string;
  /** A file whose first line is the bearer token (surrounding whitespace ignored), read once here; excludes `token` (default LOCKD_TOKEN_FILE). */
  tokenFile?: string;
  /**
   * TLS: the CA that verifies the servers and the client's certificate and
   * key, as PEM or files (read again when they change). Given, endpoints
   * without a scheme are https://, and the default endpoint is
   * https://127.0.0.1:7070. Default from LOCKD_CA, LOCKD_CERT, LOCKD_KEY
   * (files) when any is set. An https:// endpoint without it is verified
   * against Node's built-in roots.
   */
  tls?: TlsOptions;
  /** Bounds one attempt of one call (default 5000 ms). */
  requestTimeoutMs?: number;
  /** Bounds the retries of a call given no timeout (default 30000 ms). */
  retryTimeoutMs?: number;
  /**
   * Bounds a call while no endpoint has answered it at all (every attempt
   * refused, unreachable or timed out), whatever its timeout allows: it then
   * fails with "unavailable", so a dead or hung cluster gives a fast answer.
   * Once any server answered (even "no leader"), the call's timeout and the
   * retry timeout decide alone. Each attempt is cut to what is left of it.
   * Default 0: no such bound.
   */
  connectTimeoutMs?: number;
  /** Carry session calls over the session stream (HTTP/2) with batched keepalives; false: unary HTTP/1.1 only. Default on unless LOCKD_STREAM=off. */
  stream?: boolean;
  /** Receives the client's log lines (default: none). */
  logger?: (level: "debug" | "info" | "warn", msg: string, attrs?: Record<string, unknown>) => void;
}

/** Per-call options: an AbortSignal and/or a timeout. */
export interface CallOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
}

const maxEndpoints = 32;
const silentFor = 10_000;
export const clusterIdHeader = "lockd-cluster-id";

/** Endpoint is one server the client may call. */
export class Endpoint {
  readonly url: string;
  readonly h1: RpcClient<typeof LockService>;
  readonly h2: RpcClient<typeof LockService> | undefined;
  readonly sessions: RpcClient<typeof SessionService> | undefined;
  readonly watch: RpcClient<typeof WatchService>;
  readonly cluster: RpcClient<typeof ClusterService>;
  readonly stream = new StreamSlot(this);
  /** Opens a connection for HTTP/2 (the session stream's): TCP, or TLS with the client's material. */
  readonly dial: () => Socket;
  private readonly h2sm?: Http2SessionManager;
  refused = false; // answered another cluster's id
  silentUntil = 0; // did not answer: passed over until then
  constructor(url: string, t: Transports) {
    const { interceptors, streamOn } = t;
    this.url = url;
    this.dial = dialer(url, t.tls);
    const tlsH1 = url.startsWith("https:") && t.agent ? { nodeOptions: { agent: t.agent } } : {};
    const h1 = createConnectTransport({ baseUrl: url, httpVersion: "1.1", useBinaryFormat: true, interceptors, ...tlsH1 });
    this.h1 = createClient(LockService, h1);
    this.watch = createClient(WatchService, h1);
    this.cluster = createClient(ClusterService, h1);
    if (streamOn) {
      // One HTTP/2 connection carries the stream and the unary calls; it
      // is pinged every second and closed when a ping is not answered in
      // 1 s, so calls on a frozen node fail over.
      // Pings run while a stream is open (the session stream always is
      // while the client has sessions); an idle connection closes after
      // 2 s, which is also how Client.close lets it go (aborting the
      // manager while its ping timer runs throws from the timer).
      this.h2sm = new Http2SessionManager(url, { pingIntervalMs: 1000, pingTimeoutMs: 1000, pingIdleConnection: false, idleConnectionTimeoutMs: 2000 }, {
        // Small frames go out at once (no Nagle delay behind the server's delayed ACK); TLS with the client's material.
        createConnection: this.dial,
      });
      const h2 = createConnectTransport({ baseUrl: url, httpVersion: "2", useBinaryFormat: true, interceptors, sessionManager: this.h2sm });
      this.h2 = createClient(LockService, h2);
      this.sessions = createClient(SessionService, h2);
    }
  }
  /** close ends the endpoint's HTTP/2 connection (Client.close). */
  async close(): Promise<void> {
    await this.stream.close();
  }
  /** unary returns the client for unary calls: over the stream's HTTP/2 connection once a stream is open there, else HTTP/1.1. */
  unary(): RpcClient<typeof LockService> {
    return this.h2 && this.stream.isOpen() ? this.h2 : this.h1;
  }
}

/** Transports says how an Endpoint connects: a Client's settings. */
export interface Transports {
  interceptors: Interceptor[];
  streamOn: boolean;
  tls?: TlsMaterial;
  agent?: HttpsAgent;
}

/** normalizeURL makes "host:port" or a URL a comparable "http(s)://host:port" (scheme: the one of an endpoint written without). */
export function normalizeURL(u: string, scheme = "http"): string {
  const s = u.includes("://") ? u : `${scheme}://${u}`;
  const p = new URL(s);
  return `${p.protocol}//${p.host}`;
}

/** readToken returns the bearer token: token, else tokenFile's first line, else LOCKD_TOKEN, else LOCKD_TOKEN_FILE's. */
function readToken(opts: ClientOptions): string {
  if (opts.token !== undefined && opts.tokenFile !== undefined) throw new LockdError("invalid", "lockd: token and tokenFile exclude each other");
  const env = process.env;
  let token = opts.token;
  const file = opts.tokenFile ?? (opts.token === undefined && !env.LOCKD_TOKEN && env.LOCKD_TOKEN_FILE ? env.LOCKD_TOKEN_FILE : undefined);
  if (file !== undefined) {
    let b: string;
    try { b = readFileSync(file, "utf8"); } catch (e) {
      throw new LockdError("invalid", `lockd: token file: ${(e as Error).message}`, { cause: e });
    }
    token = b.split("\n", 1)[0].trim();
    if (!token) throw new LockdError("invalid", `lockd: token file ${file}: empty first line`);
  }
  token = (token ?? env.LOCKD_TOKEN ?? "").trim();
  if (/[\r\n]/.test(token)) throw new LockdError("invalid", "lockd: multi-line token");
  return token;
}

/**
 * Client is a connection to a lockd cluster through one or more endpoints.
 * Locks are taken through a Session (client.session()), which owns the
 * lease they live and die with.
 */
export class Client {
  readonly requestTimeoutMs: number;
  readonly retryTimeoutMs: number;
  readonly streamOn: boolean;
  readonly log: NonNullable<ClientOptions["logger"]>;
  readonly ka: KeepaliveScheduler;
  readonly connectTimeoutMs: number;
  private readonly transports: Transports;
  private readonly scheme: string;
  /** Headers of the session stream's request (the bearer token). */
  readonly streamHeaders: Record<string, string>;
  eps: Endpoint[];
  private cur: number;
  private clusterId = "";
  private closing = false;
  closed = false;
  readonly sessions = new Set<Session>();

  constructor(opts: ClientOptions = {}) {
    const env = process.env;
    this.log = opts.logger ?? (() => {});
    const tlsOpts = opts.tls ?? (env.LOCKD_CA || env.LOCKD_CERT || env.LOCKD_KEY
      ? { caFile: env.LOCKD_CA || undefined, certFile: env.LOCKD_CERT || undefined, keyFile: env.LOCKD_KEY || undefined } : undefined);
    const tls = tlsOpts ? new TlsMaterial(tlsOpts, this.log) : undefined;
    this.scheme = tls ? "https" : "http";
    const endpoints = opts.endpoints ?? (env.LOCKD_ENDPOINTS ? env.LOCKD_ENDPOINTS.split(",") : [`${this.scheme}://127.0.0.1:7070`]);
    if (endpoints.length === 0) throw new LockdError("invalid", "lockd: no endpoints");
    this.requestTimeoutMs = opts.requestTimeoutMs ?? 5000;
    this.retryTimeoutMs = opts.retryTimeoutMs ?? 30_000;
    this.connectTimeoutMs = opts.connectTimeoutMs ?? 0;
    if (!(this.requestTimeoutMs > 0) || !(this.retryTimeoutMs > 0)) throw new LockdError("invalid", "lockd: timeouts must be positive");
    if (!(this.connectTimeoutMs >= 0)) throw new LockdError("invalid", "lockd: connect timeout must not be negative");
    this.streamOn = opts.stream ?? !["off", "0", "false"].includes(env.LOCKD_STREAM ?? "");
    const token = readToken(opts);
    this.streamHeaders = token ? { authorization: `Bearer ${token}` } : {};
    const interceptors: Interceptor[] = token ? [(next) => (req) => { req.header.set("Authorization", `Bearer ${token}`); return next(req); }] : [];
    this.transports = { interceptors, streamOn: this.streamOn, tls, agent: tls ? httpsAgent(tls) : undefined };
    this.eps = [...new Set(endpoints.map((u) => normalizeURL(u.trim(), this.scheme)))].map((u) => new Endpoint(u, this.transports));
    // Start at a random endpoint, so that many clients given one list do not all wait on its first node when that one hangs.
    this.cur = Math.floor(Math.random() * this.eps.length);
    this.ka = new KeepaliveScheduler(this);
  }

  /** session opens a session (a lease) and keeps it alive until closed or lost. */
  session(opts: SessionOptions = {}): Promise<Session> {
    if (this.closing) return Promise.reject(new LockdError("closed", "lockd: client closed"));
    return openSession(this, opts);
  }

  /** checkToken says whether token is a current grant of lock name (a linearizable read): what a fenced resource asks. */
  async checkToken(name: string, token: bigint, opts: CallOptions = {}): Promise<CheckTokenResponse> {
    return this.call({ idempotent: true }, name, opts, (ep, signal) => this.rpc(ep, signal, (o) => ep.unary().checkToken({ name, token }, o)));
  }

  /** describeLock returns a lock's holders and queue (absent when free with no waiters). */
  async describeLock(name: string, opts: CallOptions = {}): Promise<DescribeLockResponse> {
    return this.call({ idempotent: true }, name, opts, (ep, signal) => this.rpc(ep, signal, (o) => ep.unary().describeLock({ name }, o)));
  }

  /** status describes the node answering and the cluster as it sees it. */
  async status(opts: CallOptions = {}): Promise<StatusResponse> {
    return this.call({ idempotent: true }, "", opts, (ep, signal) => this.rpc(ep, signal, (o) => ep.unary().status({}, o)));
  }

  /** watch yields the events of the locks whose names start with prefix, reconnecting and resuming by itself. */
  watch(prefix: string, opts: WatchOptions = {}): AsyncGenerator<WatchEvent> {
    return watch(this, prefix, opts);
  }

  /**
   * service returns the raw API for the calls the client does not wrap
   * (listSessions, listLocks, forceRelease, clearMark, setValue, and the
   * reads checkToken, describeLock, status). Every call goes through the
   * same failover and retries as the rest of the client: it moves between
   * endpoints, follows leader hints, checks the cluster id and throws a
   * LockdError. A call is re-sent after an unknown outcome only when that
   * is safe: reads always, clearMark with its token and setValue with its
   * seq, forceRelease never (only when the server surely did not get it).
   */
  service(): LockServiceRaw {
    return (this.rawLock ??= lockService(this));
  }

  /** clusterService is the raw membership API (removeMember and join re-sent after an unknown outcome, transferLeadership never), with the same failover. */
  clusterService(): ClusterServiceRaw {
    return (this.rawCluster ??= clusterService(this));
  }

  private rawLock?: LockServiceRaw;
  private rawCluster?: ClusterServiceRaw;

  /** clusterID is the id of the cluster the client talks to ("" before the first answer). */
  get clusterID(): string {
    return this.clusterId;
  }

  /** close closes every session (releasing their locks, best effort) and the streams. A second close returns at once. */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    await Promise.allSettled([...this.sessions].map((s) => s.close({ timeoutMs: this.requestTimeoutMs })));
    this.closed = true;
    this.ka.close();
    await Promise.all(this.eps.map((ep) => ep.close()));
    this.transports.agent?.destroy();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /**
   * rpc makes one unary attempt and checks the cluster id of its answer
   * (the message's cluster_id, else the Lockd-Cluster-Id header; on an
   * error, the ErrorDetail's).
   */
  async rpc<T>(ep: Endpoint, signal: AbortSignal, f: (o: { signal: AbortSignal; onHeader: (h: Headers) => void }) => Promise<T>): Promise<T> {
    let id = "";
    const o = { signal, onHeader: (h: Headers) => { id = h.get(clusterIdHeader) ?? ""; } };
    let r: T;
    try {
      r = await f(o);
    } catch (e) {
      const d = detailOf(e);
      this.checkCluster(ep, d?.clusterId || (e instanceof ConnectError ? e.metadata.get(clusterIdHeader) ?? "" : ""));
      throw e;
    }
    this.checkCluster(ep, (r as { clusterId?: string })?.clusterId || id);
    return r;
  }

  /**
   * tlsRefused returns the error to throw when an attempt on an https
   * endpoint broke because the server refused the client in the TLS
   * handshake (probeTls), within ms (at most 1 s).
   */
  async tlsRefused(ep: Endpoint, err: unknown, ms = Infinity): Promise<LockdError | undefined> {
    if (!ep.url.startsWith("https:") || !resetBeforeAnswer(err)) return undefined;
    const limit = Math.min(1000, this.requestTimeoutMs, ms);
    if (!(limit > 0)) return undefined;
    const refusal = await probeTls(ep.url, this.transports.tls, limit);
    return refusal ? tlsError(refusal, ep.url) : undefined;
  }

  /** pick returns the endpoint to try next and whether another usable one exists. */
  private pick(): [Endpoint, boolean] {
    const t = now();
    let best: Endpoint | undefined;
    let bestAt = 0;
    let usable = 0;
    for (let i = 0; i < this.eps.length; i++) {
      const at = (this.cur + i) % this.eps.length;
      const ep = this.eps[at];
      if (ep.refused) continue;
      usable++;
      const better = !best || (best.silentUntil > t && (ep.silentUntil <= t || ep.silentUntil < best.silentUntil));
      if (better) { best = ep; bestAt = at; }
    }
    if (!best) throw new LockdError("cluster_mismatch", `lockd: every endpoint answered for a cluster other than ${this.clusterId}`);
    this.cur = bestAt;
    return [best, usable > 1];
  }

  /** follow makes the leader a hint names the next endpoint; it reports whether the hint named another endpoint. */
  private follow(from: Endpoint, hint: string): boolean {
    let u: string;
    try { u = normalizeURL(hint, this.scheme); } catch { return false; }
    if (u === from.url) return false;
    const i = this.eps.findIndex((e) => e.url === u);
    if (i >= 0) {
      if (this.eps[i].refused) return false;
      this.cur = i;
      this.eps[i].silentUntil = 0; // a server just saw it lead
      return true;
    }
    if (this.eps.length >= maxEndpoints) return false;
    this.eps.push(new Endpoint(u, this.transports));
    this.cur = this.eps.length - 1;
    this.log("info", "leader endpoint added", { endpoint: u });
    return true;
  }

  /** checkCluster records the first cluster id seen and refuses an endpoint that answers with another. */
  checkCluster(ep: Endpoint, id: string): void {
    if (!id) return;
    if (!this.clusterId) { this.clusterId = id; return; }
    if (this.clusterId === id) return;
    if (!ep.refused) this.log("warn", "endpoint refused", { endpoint: ep.url, cluster: id });
    ep.refused = true;
    throw new LockdError("cluster_mismatch", `lockd: ${ep.url} answered for cluster ${id}, not ${this.clusterId}`);
  }

  /** call runs fn under ctx built from CallOptions. */
  call<T>(p: Policy, name: string, opts: CallOptions, fn: (ep: Endpoint, signal: AbortSignal) => Promise<T>): Promise<T> {
    return this.do(ctxWithin({ signal: opts.signal }, opts.timeoutMs), p, name, fn);
  }

  /**
   * do runs fn against endpoints until it succeeds, fails in a way not
   * worth retrying, or ctx ends. Each attempt gets the request timeout
   * (less when the lease or the caller's deadline leaves less); between
   * attempts it waits with exponential backoff and full jitter, moving to
   * the next endpoint after a transport error or an unavailable answer, or
   * straight to the leader a server named. A ctx without a deadline stops
   * retrying after the retry timeout.
   */
  async do<T>(ctx: Ctx, p: Policy, name: string, fn: (ep: Endpoint, signal: AbortSignal) => Promise<T>): Promise<T> {
    if (this.closed) throw new LockdError("closed", "lockd: client closed");
    const start = now();
    const giveUpAt = ctx.deadline === undefined && !p.once ? start + this.retryTimeoutMs : Infinity;
    let followed = false, brokeBefore = false, answered = false, last: unknown;
    for (let attempt = 0; ; attempt++) {
      if (ctxDone(ctx)) throw ctxError(ctx, last);
      let connectLeft = -1;
      if (!answered && this.connectTimeoutMs > 0) {
        connectLeft = this.connectTimeoutMs - (now() - start);
        if (connectLeft <= 0) {
          throw new LockdError("unavailable", `lockd: unavailable: no endpoint answered within the connect timeout (${this.connectTimeoutMs} ms): ${toLockdError(last, name).message}`, { cause: last });
        }
      }
      const [ep, others] = this.pick();
      const timeout = attemptTimeout(this.requestTimeoutMs, p, ctx, others, connectLeft);
      const ac = new AbortController();
      let timedOut = false;
      const timer = setTimeout(() => { timedOut = true; ac.abort(); }, timeout);
      const onAbort = () => ac.abort();
      ctx.signal?.addEventListener("abort", onAbort, { once: true });
      ctx.also?.addEventListener("abort", onAbort, { once: true });
      let err: unknown;
      try {
        const r = await fn(ep, ac.signal);
        ep.silentUntil = 0;
        return r;
      } catch (e) {
        err = e;
      } finally {
        clearTimeout(timer);
        ctx.signal?.removeEventListener("abort", onAbort);
        ctx.also?.removeEventListener("abort", onAbort);
      }
      if (tlsRefusal(err)) throw tlsError(err, ep.url); // a TLS misconfiguration: no retry heals it
      const refusal = timedOut || ctxDone(ctx) ? undefined : await this.tlsRefused(ep, err, p.until ? p.until() - now() : Infinity);
      if (refusal) throw refusal;
      if (ctxDone(ctx)) {
        const mapped = toLockdError(err, name);
        if (timedOut || mapped.code === "unavailable" || mapped.code === "other" || mapped.code === "cancelled") throw ctxError(ctx, err);
        throw mapped;
      }
      if (timedOut) {
        err = Object.assign(new LockdError("unavailable", `lockd: attempt timed out after ${Math.round(timeout)} ms at ${ep.url}`, { cause: err }), { [streamBroken]: false });
        if (p.abandon) ep.stream.abandon(); // a node that does not answer a keepalive in time: its stream's calls go elsewhere
      }
      if (timedOut || unanswered(err)) ep.silentUntil = now() + silentFor;
      else { ep.silentUntil = 0; answered = true; }
      const [ok, hint] = retryable(err, p.idempotent, timedOut);
      const broken = !!(err as any)?.[streamBroken] || timedOut;
      const electing = !hint && electionUnderWay(err);
      last = err;
      const mapped = toLockdError(err, name);
      let immediate = false;
      if (hint) immediate = this.follow(ep, hint) && !followed;
      else if (ok && this.eps[this.cur] === ep) this.cur = (this.cur + 1) % this.eps.length;
      if (!ok) throw mapped;
      if (mapped.code === "cluster_mismatch") immediate = true;
      if (broken && !brokeBefore && !hint) immediate = true;
      if (isRefused(err) && !hint && this.eps.some((e) => e !== ep && !e.refused)) immediate = attempt < this.eps.length;
      brokeBefore = broken;
      followed = !!hint && immediate;
      if (p.once && !(immediate && attempt === 0)) throw mapped;
      this.log("debug", "call failed", { endpoint: ep.url, attempt: attempt + 1, err: mapped.message });
      if (!immediate) {
        let wait = delay(attempt);
        if (electing) wait = Math.min(wait, electionPoll());
        if (now() + wait >= giveUpAt) throw mapped.code === "unavailable" ? mapped : new LockdError("unavailable", `lockd: unavailable: ${mapped.message}`, { cause: err });
        // While nobody answered, wake by the connect timeout's end (the loop's top then says so).
        if (connectLeft > 0 && !answered) wait = Math.max(0, Math.min(wait, this.connectTimeoutMs - (now() - start)));
        await sleep(wait, ctx.also && ctx.signal ? AbortSignal.any([ctx.signal, ctx.also]) : ctx.signal ?? ctx.also);
      }
    }
  }
}

const electionPoll = () => 200;
