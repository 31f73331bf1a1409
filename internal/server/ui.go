package server

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/lockd-dev/lockd/internal/ui"
)

// This file mounts the web dashboard (internal/ui) and the one JSON
// endpoint it needs beyond the public API: the members' health, probed by
// the node because a browser may not reach the other members (nor read
// their answers across origins).

// uiRoutes adds the dashboard's routes to mux.
func (s *Server) uiRoutes(mux *http.ServeMux) {
	mux.Handle("/ui/", http.StripPrefix("/ui/", ui.Handler()))
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	mux.HandleFunc("GET /ui/api/health", func(w http.ResponseWriter, r *http.Request) {
		// Like Status: any known caller (it makes this node probe every
		// member, so not for anonymous callers under --auth-file).
		called := false
		err := s.guard(r.Context(), memberHealthRequest{}, "MemberHealth", func(context.Context) error {
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
	Error string `json:"error,omitempty"`
}

// healthProbeTimeout bounds one member's /readyz probe.
const healthProbeTimeout = time.Second

// serveMemberHealth probes every member's /readyz at once and answers with
// their readiness.
func (s *Server) serveMemberHealth(w http.ResponseWriter, r *http.Request) {
	members := s.members()
	out := make([]memberHealth, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		out[i].ID = m.Id
		if m.Api == "" {
			out[i].Error = "api address unknown"
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.Context(), healthProbeTimeout)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.Api+"/readyz", nil)
			if err != nil {
				out[i].Error = err.Error()
				return
			}
			resp, err := s.fwd.hc.Do(req)
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
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(out)
}

// memberHealthRequest stands for GET /ui/api/health in guard: no
// permission beyond valid credentials, but rate-limited like any call.
type memberHealthRequest struct{}
