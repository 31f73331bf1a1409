// lockd client for Node.js: sessions (leases kept alive over the session
// stream), Mutex, Semaphore, RWMutex, Election, fencing tokens, run-once.
export { Client, type ClientOptions, type CallOptions } from "./client.js";
export type { TlsOptions } from "./tls.js";
export type { LockServiceRaw, ClusterServiceRaw } from "./service.js";
export { Session, type SessionOptions } from "./session.js";
export { Mutex, Semaphore, RWMutex, type LockOptions } from "./lock.js";
export { MultiLock, type MultiLockOptions } from "./multilock.js";
export { Election, observeElection, type Leader } from "./election.js";
export { type WatchEvent, type WatchOptions, EventKind } from "./watch.js";
export { LockdError, type ErrorCode, type Holder, type Mark } from "./errors.js";
export { leaseDeadline, renewInterval, jeopardyInterval } from "./lease.js";
