package server_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/lockd-dev/lockd/lockdtest"
)

// TestRefusedRequestsAreCounted: requests Connect refuses before decoding
// them (malformed, oversized, unknown content type) are counted in
// lockd_api_requests_total with the code they got, like decoded ones.
func TestRefusedRequestsAreCounted(t *testing.T) {
	srv := lockdtest.New(t)
	const acquire = "/lockd.v1.LockService/Acquire"
	series := func(code string) string {
		return `lockd_api_requests_total{code="` + code + `",method="` + acquire + `"}`
	}
	value := func(code string) float64 {
		t.Helper()
		resp, err := http.Get(srv.URL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		for _, line := range strings.Split(b.String(), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == series(code) {
				var v float64
				if _, err := fmt.Sscan(f[1], &v); err != nil {
					t.Fatal(err)
				}
				return v
			}
		}
		return 0
	}
	post := func(ct string, body []byte) int {
		t.Helper()
		resp, err := http.Post(srv.URL()+acquire, ct, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name, ct string
		body     []byte
		code     string
	}{
		{"malformed JSON", "application/json", []byte("{not json"), "invalid_argument"},
		{"malformed protobuf", "application/proto", []byte("\x12\xff\xff\xff\xff\x0f"), "invalid_argument"},
		{"oversized", "application/json", append(append([]byte(`{"name":"`), bytes.Repeat([]byte("x"), 1<<20)...), `"}`...), "resource_exhausted"},
	} {
		before := value(tc.code)
		status := post(tc.ct, tc.body)
		if got := value(tc.code); got != before+1 {
			t.Errorf("%s (HTTP %d): %s went from %v to %v, want +1", tc.name, status, series(tc.code), before, got)
		}
	}
}

// TestGRPCHealthAndReflection: the standard gRPC health service answers
// SERVING on a ready node, and reflection lists the lockd services, so
// grpcurl works without the proto files.
func TestGRPCHealthAndReflection(t *testing.T) {
	srv := lockdtest.New(t)
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	health := grpchealth.NewClient(hc, srv.URL())
	for _, svc := range []string{"", "lockd.v1.LockService"} {
		resp, err := health.Check(ctx, &grpchealth.CheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("health check %q: %v", svc, err)
		}
		if resp.Status != grpchealth.StatusServing {
			t.Fatalf("health check %q: %v, want SERVING", svc, resp.Status)
		}
	}
	if _, err := health.Check(ctx, &grpchealth.CheckRequest{Service: "no.such.Service"}); err == nil {
		t.Fatal("health check of an unknown service: no error")
	}

	stream := grpcreflect.NewClient(hc, srv.URL()).NewStream(ctx)
	defer stream.Close()
	names, err := stream.ListServices()
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	for _, want := range []protoreflect.FullName{"lockd.v1.LockService", "lockd.v1.ClusterService", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, without %s", names, want)
		}
	}
	fds, err := stream.FileContainingSymbol("lockd.v1.LockService")
	if err != nil || len(fds) == 0 {
		t.Fatalf("reflection: file of lockd.v1.LockService: %v", err)
	}
}
