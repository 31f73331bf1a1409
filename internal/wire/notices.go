package wire

import (
	"context"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// Release-request notices: a session subscribes on a stream
// (SubscribeNotices, a stream-only call), and the stream's reader hands
// each ReleaseRequested frame (call_id 0) to Caller.OnNotice. The
// subscription lasts as long as the stream: the client subscribes again on
// the next one (Done says when).

// Done returns a channel closed when the stream has ended.
func (s *Stream) Done() <-chan struct{} { return s.done }

// SubscribeNotices asks s to deliver the notices of session id.
func (s *Stream) SubscribeNotices(ctx context.Context, id, secret string) error {
	_, err := s.Call(ctx, &lockdv1.StreamRequest{Body: &lockdv1.StreamRequest_SubscribeNotices{
		SubscribeNotices: &lockdv1.SubscribeNoticesRequest{SessionId: id, Secret: secret}}})
	return err
}
