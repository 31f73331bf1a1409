package wire

import (
	"time"

	"github.com/lockd-dev/lockd/internal/lease"
)

// EarlyBy is how early a session may be renewed to join a batch: half its
// renew interval. Sessions created at different times then fall into step
// within two rounds (the first batch of a round reaches every session due
// within half an interval, and the rest come due before the next one),
// and the cost is at most one early renewal per session while they do.
func EarlyBy(ttl time.Duration) time.Duration { return lease.RenewInterval(ttl) / 2 }

// MaxBatch is the most sessions one KeepAliveBatch frame names (the
// server's bound).
const MaxBatch = 1000

// MaxBatchBytes bounds the encoded sessions of one KeepAliveBatch frame:
// the server reads at most 64 KiB per frame, and a session with its secret
// takes about 100 bytes (up to 300 with the longest secret), so a frame of
// MaxBatch sessions would not fit, and a frame too big breaks the whole
// stream. The rest of the 64 KiB is room for the frame's envelope.
const MaxBatchBytes = 60 << 10

// BatchEntryBytes bounds the encoded size of one session in a frame: its
// id and secret, each with a field tag and a length of up to 3 bytes, in
// a message with its own tag and length.
func BatchEntryBytes(id, secret string) int { return len(id) + len(secret) + 12 }

// SplitBatch cuts the sessions due in one round into frames of at most
// MaxBatch sessions and MaxBatchBytes; entry returns a session's id and
// secret.
func SplitBatch[T any](batch []T, entry func(T) (id, secret string)) [][]T {
	var frames [][]T
	for len(batch) > 0 {
		n, size := 0, 0
		for n < len(batch) && n < MaxBatch {
			e := BatchEntryBytes(entry(batch[n]))
			if n > 0 && size+e > MaxBatchBytes {
				break
			}
			size += e
			n++
		}
		frames = append(frames, batch[:n])
		batch = batch[n:]
	}
	return frames
}
