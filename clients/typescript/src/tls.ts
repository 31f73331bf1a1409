// TLS: the CA that verifies the servers and the client's own certificate,
// applied to every connection the client opens (the session stream's
// node:http2 connection, connect-node's HTTP/2 and HTTP/1.1 transports),
// and the errors of a refused handshake. Files are read again when they
// change, as the Go client's WithTLSFiles does: a renewed certificate is
// used by the next new connection, open ones keep theirs.
import { X509Certificate } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { Agent as HttpsAgent, type AgentOptions, request as httpsRequest } from "node:https";
import { connect as netConnect, isIP, type Socket } from "node:net";
import { connect as tlsConnect, type ConnectionOptions, createSecureContext } from "node:tls";
import { LockdError } from "./errors.js";

/** TLS options of a Client: PEM text or a file for each item, not both. */
export interface TlsOptions {
  /** PEM of the CA certificate(s) that verify the servers (default: Node's built-in roots). */
  ca?: string | Buffer;
  /** A file holding `ca` (`lockd cert ca` writes ca.crt); read again when it changes. */
  caFile?: string;
  /** PEM of the client's certificate, for a server that asks for one (--tls-client-auth). With `key`. */
  cert?: string | Buffer;
  /** A file holding `cert` (`lockd cert client NAME` writes NAME.crt). */
  certFile?: string;
  /** PEM of the client certificate's private key. With `cert`. */
  key?: string | Buffer;
  /** A file holding `key`. */
  keyFile?: string;
}

type Pem = { ca?: string | Buffer; cert?: string | Buffer; key?: string | Buffer };
type Item = "ca" | "cert" | "key";

/** stamp identifies a file's version: modification time, size and inode (a rename over it changes the inode). */
function stamp(path: string): string {
  const s = statSync(path);
  return `${s.mtimeMs}/${s.size}/${s.ino}`;
}

/** TlsMaterial is a client's TLS settings, with its files read again when they change. */
export class TlsMaterial {
  private readonly files: Partial<Record<Item, string>> = {};
  private pem: Pem = {};
  private stamps = "";

  constructor(o: TlsOptions, private readonly log: (level: "warn", msg: string, attrs?: Record<string, unknown>) => void = () => {}) {
    const inline: Pem = {};
    for (const k of ["ca", "cert", "key"] as Item[]) {
      const file = o[`${k}File`];
      if (file !== undefined && o[k] !== undefined) throw new LockdError("invalid", `lockd: tls: ${k} and ${k}File exclude each other`);
      if (file !== undefined) {
        if (!file) throw new LockdError("invalid", `lockd: tls: empty ${k}File`);
        this.files[k] = file;
      } else if (o[k] !== undefined) inline[k] = o[k];
    }
    const hasCert = o.cert !== undefined || o.certFile !== undefined;
    const hasKey = o.key !== undefined || o.keyFile !== undefined;
    if (hasCert !== hasKey) throw new LockdError("invalid", "lockd: tls: a client certificate needs its key, and a key its certificate");
    this.pem = inline;
    try {
      this.pem = this.load(inline);
    } catch (e) {
      throw new LockdError("invalid", `lockd: tls: ${(e as Error).message}`, { cause: e });
    }
  }

  /** load reads the files over inline, checks that the whole loads as a TLS context, and records the files' stamps. */
  private load(base: Pem): Pem {
    const pem: Pem = { ...base };
    const stamps: string[] = [];
    for (const [k, f] of Object.entries(this.files) as [Item, string][]) {
      stamps.push(stamp(f));
      pem[k] = readFileSync(f);
    }
    createSecureContext(pem); // throws on a bad certificate or key, or a key that does not match its certificate
    if (pem.ca !== undefined) new X509Certificate(pem.ca); // a CA that does not parse is otherwise ignored
    this.stamps = stamps.join(",");
    return pem;
  }

  /** current returns the PEMs for a new connection, read again first if a file changed (kept as they were if the new files do not load). */
  current(): Pem {
    const names = Object.values(this.files);
    if (names.length === 0) return this.pem;
    let now: string;
    try { now = names.map(stamp).join(","); } catch (e) {
      this.log("warn", "tls files changed but do not load: keeping the previous ones", { err: String(e) });
      return this.pem;
    }
    if (now === this.stamps) return this.pem;
    try {
      this.pem = this.load(this.pem);
    } catch (e) {
      this.log("warn", "tls files changed but do not load: keeping the previous ones", { err: String(e) });
    }
    return this.pem;
  }

  /** options returns tls.connect options for host (verification by the CA and the host's name or IP). */
  options(host: string, alpn: string[]): ConnectionOptions {
    // SNI takes a DNS name only; the certificate is still checked against an IP host.
    return { ...this.current(), ALPNProtocols: alpn, ...(isIP(host) ? {} : { servername: host }) };
  }
}

/** hostPort splits a URL into the host (no IPv6 brackets) and port to dial. */
function hostPort(u: URL): [string, number] {
  return [u.hostname.replace(/^\[|\]$/g, ""), Number(u.port || (u.protocol === "https:" ? 443 : 80))];
}

/** dialer returns how to open a connection to url for HTTP/2: plain TCP for http, TLS with ALPN h2 for https. Small frames go out at once (no Nagle delay behind the server's delayed ACK). */
export function dialer(url: string, mat: TlsMaterial | undefined): () => Socket {
  const u = new URL(url);
  const [host, port] = hostPort(u);
  if (u.protocol === "http:") return () => netConnect({ host, port, noDelay: true });
  return () => {
    const s = tlsConnect({ host, port, ...(mat ? mat.options(host, ["h2"]) : isIP(host) ? { ALPNProtocols: ["h2"] } : { ALPNProtocols: ["h2"], servername: host }) });
    s.setNoDelay(true);
    return s;
  };
}

/** httpsAgent returns the HTTP/1.1 agent of a client with TLS material: each new connection uses the current files. */
export function httpsAgent(mat: TlsMaterial): HttpsAgent {
  const opts: AgentOptions = { keepAlive: true };
  const agent = new HttpsAgent(opts);
  const base = agent.createConnection.bind(agent);
  agent.createConnection = (o: any, cb?: any) => base({ ...o, ...mat.current() }, cb);
  return agent;
}

/** X.509 verification failures Node reports by code. */
const verifyCodes = new Set([
  "UNABLE_TO_GET_ISSUER_CERT", "UNABLE_TO_GET_ISSUER_CERT_LOCALLY", "UNABLE_TO_VERIFY_LEAF_SIGNATURE", "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN", "CERT_HAS_EXPIRED", "CERT_NOT_YET_VALID", "CERT_UNTRUSTED", "CERT_REJECTED", "CERT_SIGNATURE_FAILURE",
  "INVALID_CA", "INVALID_PURPOSE", "HOSTNAME_MISMATCH", "ERR_TLS_CERT_ALTNAME_INVALID",
]);

/**
 * tlsRefusal returns the TLS error in err's cause chain: a handshake that
 * failed on a certificate (the server's not trusted, the client's missing
 * or unknown to the server) or with a peer that does not speak TLS. No
 * retry heals it, so the retry loop returns it at once.
 */
export function tlsRefusal(err: unknown): (Error & { code: string }) | undefined {
  for (let e: any = err, i = 0; e && i < 8; e = e.cause, i++) {
    const c = e?.code;
    if (typeof c === "string" && (verifyCodes.has(c) || c.startsWith("ERR_SSL_"))) return e;
  }
  return undefined;
}

/** tlsError is the error a call refused in the TLS handshake throws. */
export function tlsError(err: unknown, url: string): LockdError {
  const t = tlsRefusal(err)!;
  let why = t.message;
  if (/CERTIFICATE_REQUIRED/.test(t.code)) why = "the server requires a client certificate (tls cert and key)";
  else if (/ALERT_UNKNOWN_CA|ALERT_BAD_CERTIFICATE/.test(t.code)) why = `the server refused the client certificate (${/alert [a-z ]+/.exec(t.message)?.[0] ?? t.message.trim()})`;
  else if (verifyCodes.has(t.code)) why = `the server's certificate is not trusted (${t.message.trim()}): check the tls ca`;
  return new LockdError("unavailable", `lockd: unavailable: tls handshake with ${url} failed: ${why} [${t.code}]`, { cause: err });
}

/**
 * probeTls tells whether an https endpoint refuses this client in the TLS
 * handshake. Over TLS 1.3 a server checks the client's certificate after
 * the client's side of the handshake is done, so an HTTP/1.1 call already
 * writing its request sees only a reset or broken pipe, not the server's
 * alert; a fresh connection that asks for /healthz reads the alert. It
 * returns the TLS error, or undefined (any other outcome), within ms.
 */
export function probeTls(url: string, mat: TlsMaterial | undefined, ms: number): Promise<Error | undefined> {
  const u = new URL(url);
  const [host, port] = hostPort(u);
  return new Promise((resolve) => {
    const opts = mat ? mat.options(host, ["http/1.1"]) : isIP(host) ? {} : { servername: host };
    const req = httpsRequest({ host, port, path: "/healthz", method: "GET", agent: false, ...opts }, (res) => { res.resume(); finish(undefined); });
    const t = setTimeout(() => finish(undefined), ms);
    function finish(e: Error | undefined) {
      clearTimeout(t);
      req.destroy();
      resolve(e && tlsRefusal(e) ? e : undefined);
    }
    req.on("error", (e) => finish(e));
    req.end();
  });
}

/** resetBeforeAnswer: the connection was reset or its pipe broke (no server's answer came). */
export function resetBeforeAnswer(err: unknown): boolean {
  for (let e: any = err, i = 0; e && i < 8; e = e.cause, i++) {
    if (e?.code === "ECONNRESET" || e?.code === "EPIPE") return true;
  }
  return false;
}
