package api

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/ui"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
)

// This file mounts the web dashboard (internal/ui) and the one JSON
// endpoint it needs beyond the public API: the members' health, probed by
// the node because a browser may not reach the other members (nor read
// their answers across origins).

// dashboard serves the dashboard's routes.
type dashboard struct{ *Server }

// uiRoutes adds the dashboard's routes to mux.
func (s dashboard) uiRoutes(mux *http.ServeMux) {
	mux.Handle("/ui/", http.StripPrefix("/ui/", ui.Handler()))
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	mux.HandleFunc("GET /ui/api/health", func(w http.ResponseWriter, r *http.Request) {
		// Like Status: any known caller (it makes this node probe every
		// member, so not for anonymous callers under --auth-file).
		called := false
		err := s.guard.Run(r.Context(), memberHealthRequest{}, "MemberHealth", func(context.Context) error {
			called = true
			s.serveMemberHealth(w, r)
			return nil
		})
		if err != nil && !called {
			http.Error(w, err.Error(), connectHTTPStatus(connect.CodeOf(err)))
		}
	})
}

// memberHealth is one member's answer to /readyz.
type memberHealth struct {
	ID    string `json:"id"`
	Ready bool   `json:"ready"`
	// Reachable is whether the member answered at all (any HTTP status):
	// lockd members shows a member that did not as "unreachable". Absent
	// when it was not asked (its API address is not known yet): unknown.
	Reachable *bool  `json:"reachable,omitempty"`
	Error     string `json:"error,omitempty"`
}

// healthProbeTimeout bounds one member's /readyz probe.
const healthProbeTimeout = time.Second

// serveMemberHealth probes every member's /readyz at once and answers with
// their readiness (the dashboard and lockd members read it).
func (s dashboard) serveMemberHealth(w http.ResponseWriter, r *http.Request) {
	out := s.probeMembers(r.Context(), s.node.Members())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(out)
}

// probeMembers asks every member's /readyz at once, each within
// healthProbeTimeout, and returns their answers in the members' order.
func (s dashboard) probeMembers(ctx context.Context, members []*lockdv1.Member) []memberHealth {
	out := make([]memberHealth, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		out[i].ID = m.Id
		if m.Api == "" {
			out[i].Error = "api address unknown"
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, healthProbeTimeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.Api+"/readyz", nil)
			if err != nil {
				out[i].Error = err.Error()
				return
			}
			resp, err := s.fwd.HTTPClient().Do(req)
			reachable := err == nil
			out[i].Reachable = &reachable
			if err != nil {
				out[i].Error = err.Error()
				return
			}
			resp.Body.Close()
			out[i].Ready = resp.StatusCode == http.StatusOK
			if !out[i].Ready {
				out[i].Error = resp.Status
			}
		})
	}
	wg.Wait()
	return out
}

// memberHealthRequest stands for GET /ui/api/health in guard: no
// permission beyond valid credentials, but rate-limited like any call.
type memberHealthRequest struct{}
