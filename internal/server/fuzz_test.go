package server_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/lockd-dev/lockd/lockdtest"
)

// FuzzRequestDecoding posts arbitrary bodies, as JSON and as binary
// protobuf, to every mutating method of a real server: each gets a 200 or a
// 4xx answer (never a 5xx, a panic or a hang) and the server keeps serving.
func FuzzRequestDecoding(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"ttl":"10s"}`, `{"ttl":"-1s"}`, `{"ttl":"99999999999s"}`,
		`{"sessionId":"x","seq":"1","name":"a"}`, `{"sessionId":"x","seq":"0","name":""}`,
		`{"sessionId":"x","seq":"1","name":"a","mode":99,"limit":4294967295}`,
		`{"name":"\u0000"}`, `{"pollTimeout":"-5s","wait":true}`, `[1,2,3]`, `{not json`, "\x00\x01\x02",
		"\x0a\x01x\x10\x01\x22\x01a", "\x12\xff\xff\xff\xff\x0f",
	} {
		for m := range 5 {
			f.Add(uint8(m), true, []byte(seed))
			f.Add(uint8(m), false, []byte(seed))
		}
	}
	srv := lockdtest.New(f)
	methods := []string{"CreateSession", "Acquire", "Release", "Cancel", "KeepAlive"}
	f.Fuzz(func(t *testing.T, method uint8, asJSON bool, body []byte) {
		ct := "application/proto"
		if asJSON {
			ct = "application/json"
		}
		url := srv.URL() + "/lockd.v1.LockService/" + methods[int(method)%len(methods)]
		resp, err := http.Post(url, ct, bytes.NewReader(body))
		if err != nil {
			t.Fatalf("post: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s %q: status %d", url, body, resp.StatusCode)
		}
		h, err := http.Get(srv.URL() + "/readyz")
		if err != nil || h.StatusCode != 200 {
			t.Fatalf("server stopped serving: %v", err)
		}
		h.Body.Close()
	})
}
