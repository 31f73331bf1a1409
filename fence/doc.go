// Package fence keeps a resource safe from a stale lock holder: a holder
// that was paused (GC, SIGSTOP, a slow disk, a partition) past its lease
// may still believe it holds the lock after another holder took it. A
// TTL cannot stop its late write; the lock's fencing token can. Every
// grant carries a token strictly larger than every earlier grant's, so the
// resource remembers the highest token it has accepted per key and refuses
// any lower one.
//
// Guard does this in memory, for a resource inside one process. Package
// fence/pgfence does it in PostgreSQL, in the same transaction as the
// write it protects. docs/fencing.md shows the SQL for other databases
// and when Client.CheckToken is the better tool.
//
// The package imports nothing from lockd: any source of increasing tokens
// works (lockd's Mutex.Token, Election.Token, $LOCKD_TOKEN in `lockd run`).
package fence
