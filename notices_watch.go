package lockd

import (
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// The notices' fallback without a stream: a watch of each name a lock
// acquires or holds, with its state, and DescribeLock of the name when the
// watch starts or resets and on each request the watch shows. It needs
// read permission on the name (Watch and DescribeLock); refused, it tries
// again after a growing pause (backoff). Watch takes a prefix: the watch of
// "job" carries the events of every lock whose name starts with "job" too
// (they are skipped here), and its state scans them all.

// watchUnary delivers notices from watches of the locks' names, until ctx
// ends or until (nil: never).
func (h *noticeHub) watchUnary(ctx context.Context, until <-chan time.Time) {
	watching := map[string]context.CancelFunc{}
	defer func() {
		for _, stop := range watching {
			stop()
		}
	}()
	for {
		names := h.names()
		for name, stop := range watching {
			if !names[name] {
				stop()
				delete(watching, name)
			}
		}
		for _, l := range h.takeAgain() { // a watch reads pending requests as it starts
			for _, name := range l.noticeNames() {
				if stop := watching[name]; stop != nil {
					stop()
					delete(watching, name)
				}
			}
		}
		for name := range names {
			if watching[name] == nil {
				wctx, stop := context.WithCancel(ctx)
				watching[name] = stop
				h.wg.Go(func() { h.watchName(wctx, name) })
			}
		}
		t := time.NewTimer(time.Second) // sessions that ended
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-until:
			t.Stop()
			return
		case <-h.fresh:
		case <-t.C:
		}
		t.Stop()
	}
}

// watchName delivers the requests of one lock name: its holders' pending
// ones when the watch starts or resets, then each one the watch shows.
func (h *noticeHub) watchName(ctx context.Context, name string) {
	var retry backoff
	warned := false
	for ctx.Err() == nil {
		// Watch reconnects by itself; it ends only for good reasons
		// (permission, credentials, the client closed), retried here
		// after a pause that grows while it keeps failing.
		for ev, err := range h.c.Watch(ctx, name, WatchState()) {
			if err != nil && !errors.Is(err, ErrWatchReset) {
				if (errors.Is(err, ErrPermissionDenied) || connect.CodeOf(err) == connect.CodePermissionDenied) && !warned {
					warned = true
					h.c.logger.Warn("release-request notices: no read permission on the lock to watch it", "lock", name, "err", err)
				} else {
					h.c.logger.Debug("release-request notices: watch ended", "lock", name, "err", err)
				}
				break
			}
			retry.reset()
			switch {
			case ev.Kind == EventSynced:
				h.pending(ctx, name)
			case ev.Kind == EventReleaseRequested && ev.Name == name:
				// The holder's record has the first request's time and
				// the revoke grace; the event, only the reason.
				if !h.pending(ctx, name) {
					h.deliver(&lockdv1.ReleaseRequested{SessionId: ev.Session, Name: name, Token: ev.Token, Reason: string(ev.Value),
						RequestedAt: timestamppb.Now()})
				}
			}
		}
		h.pause(ctx, nil, retry.wait())
	}
}

// pending delivers the pending requests of name's holders (DescribeLock);
// false when the lock could not be read.
func (h *noticeHub) pending(ctx context.Context, name string) bool {
	resp, err := h.c.Service().DescribeLock(ctx, connect.NewRequest(&lockdv1.DescribeLockRequest{Name: name}))
	if err != nil {
		return false
	}
	for _, hd := range resp.Msg.GetLock().GetHolders() {
		if hd.GetReleaseRequestedAt() != nil {
			h.deliver(&lockdv1.ReleaseRequested{SessionId: hd.GetSessionId(), Name: name, Token: hd.GetToken(),
				Reason: hd.GetReleaseReason(), RequestedAt: hd.GetReleaseRequestedAt(), RevokeGrace: hd.GetRevokeGrace(), RevokeGraceFrom: hd.GetRevokeGraceFrom()})
		}
	}
	return true
}
