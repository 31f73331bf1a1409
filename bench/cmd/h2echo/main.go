// Command h2echo measures the server CPU of an HTTP/2 transport per call
// on a bidi stream shaped like lockd's session stream, with no lockd logic
// behind it: a StreamRequest in, its StreamResponse (same call_id) out.
// bench/h2echo.sh runs it; see bench/README.md.
//
//	h2echo serve --impl nethttp|nethttp-buf|grpc|upgrade|lean --listen 127.0.0.1:PORT
//	h2echo load  --addr 127.0.0.1:PORT --streams 16 --duration 10s [--upgrade|--lean]
//
// serve answers SessionService.Stream over h2c with Connect's handler on
// net/http's HTTP/2 server (nethttp, what lockd serves with) or with
// grpc-go's own transport (grpc). load opens --streams streams, each on
// its own connection with the Connect client in its gRPC protocol (the
// same bytes on the wire for both servers; the request body read whole
// envelopes at a time, as lockd's client does), one call in flight per stream
// as lockd bench's workers have, and prints calls/s and its own CPU.
//
// upgrade is what lockd serves since: the same Connect handler behind
// net/http, on a connection the client upgraded from HTTP/1.1
// (api.UpgradeStreams, wire.UpgradeHTTPClient), so the envelopes travel
// with no HTTP/2 framing; its load uses the Connect protocol as lockd's
// client does.
//
// lean is the alternative to HTTP/2 measured beside them: the same
// protobuf messages, each prefixed by its length as a uvarint, straight on
// a TCP connection. Its server reads a frame and answers it on one
// goroutine, writing the answer with one write; its client (load --lean)
// writes a request from the calling goroutine and has a reader goroutine
// hand each answer to its caller over a channel, the way a client with
// several calls in flight on one connection must.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"

	"github.com/lockd-dev/lockd/internal/api"
	"github.com/lockd-dev/lockd/internal/loadgen"
	"github.com/lockd-dev/lockd/internal/wire"
	lockdv1 "github.com/lockd-dev/lockd/proto/lockd/v1"
	"github.com/lockd-dev/lockd/proto/lockd/v1/lockdv1connect"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: h2echo serve|load [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "load":
		err = load(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "h2echo:", err)
		os.Exit(1)
	}
}

// echo is the session service: Stream answers each frame with its call
// id; nothing else is served.
type echo struct {
	lockdv1connect.UnimplementedSessionServiceHandler
}

func (echo) Stream(_ context.Context, st *connect.BidiStream[lockdv1.StreamRequest, lockdv1.StreamResponse]) error {
	for {
		req, err := st.Receive()
		if err != nil {
			return nil
		}
		if err := st.Send(&lockdv1.StreamResponse{CallId: req.GetCallId()}); err != nil {
			return err
		}
	}
}

// grpcStream is the same handler for grpc-go's server.
func grpcStream(_ any, st grpc.ServerStream) error {
	for {
		req := new(lockdv1.StreamRequest)
		if err := st.RecvMsg(req); err != nil {
			return nil
		}
		if err := st.SendMsg(&lockdv1.StreamResponse{CallId: req.GetCallId()}); err != nil {
			return err
		}
	}
}

var grpcDesc = grpc.ServiceDesc{
	ServiceName: lockdv1connect.SessionServiceName,
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName: "Stream", Handler: grpcStream, ServerStreams: true, ClientStreams: true,
	}},
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	impl := fs.String("impl", "nethttp", "nethttp (Connect on net/http), nethttp-buf (the same with buffered reads, as lockd serves plaintext) or grpc (grpc-go's transport)")
	listen := fs.String("listen", "127.0.0.1:0", "address (loopback)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	switch *impl {
	case "nethttp", "nethttp-buf", "upgrade":
		if *impl != "nethttp" {
			ln = bufListener{ln}
		}
		mux := http.NewServeMux()
		mux.Handle(lockdv1connect.NewSessionServiceHandler(echo{}))
		srv := &http.Server{Handler: api.UpgradeStreams(mux, new(api.Upgrades)), Protocols: new(http.Protocols)}
		srv.Protocols.SetUnencryptedHTTP2(true)
		srv.Protocols.SetHTTP1(true)
		return srv.Serve(ln)
	case "grpc":
		srv := grpc.NewServer()
		srv.RegisterService(&grpcDesc, nil)
		return srv.Serve(ln)
	case "lean":
		for {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			go leanServe(c)
		}
	}
	return fmt.Errorf("--impl %q: want nethttp, nethttp-buf, grpc, upgrade or lean", *impl)
}

// bufListener gives each connection a read buffer, as lockd's API
// listener does without TLS.
type bufListener struct{ net.Listener }

func (l bufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &bufConn{Conn: c, r: bufio.NewReaderSize(c, 4<<10)}, nil
}

type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func load(args []string) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	addr := fs.String("addr", "", "server address")
	streams := fs.Int("streams", 16, "streams, each on its own connection")
	duration := fs.Duration("duration", 10*time.Second, "how long")
	lean := fs.Bool("lean", false, "speak the lean framing (serve --impl lean)")
	upgrade := fs.Bool("upgrade", false, "the Connect protocol on upgraded HTTP/1.1 connections (serve --impl upgrade)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()
	var calls atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, *streams)
	cpu0 := loadgen.CPUTime()
	start := time.Now()
	for range *streams {
		if *lean {
			wg.Go(func() {
				if err := leanLoad(ctx, *addr, &calls); err != nil {
					errs <- err
				}
			})
			continue
		}
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		// The body read whole envelopes at a time, as lockd's client does.
		cl := lockdv1connect.NewSessionServiceClient(wire.StreamHTTPClient(&http.Client{Transport: tr}), "http://"+*addr, connect.WithGRPC())
		if *upgrade {
			h1 := &http.Transport{}
			cl = lockdv1connect.NewSessionServiceClient(wire.UpgradeHTTPClient(&http.Client{Transport: h1}, &http.Client{Transport: tr}), "http://"+*addr)
		}
		wg.Go(func() {
			defer tr.CloseIdleConnections()
			sctx, scancel := context.WithCancel(context.Background())
			defer scancel()
			st := cl.Stream(sctx)
			for id := uint64(1); ctx.Err() == nil; id++ {
				if err := st.Send(&lockdv1.StreamRequest{CallId: id, Body: &lockdv1.StreamRequest_Release{
					Release: &lockdv1.ReleaseRequest{SessionId: "0123456789abcdef0123456789abcdef", Seq: id, Name: "bench/own/7", Token: id}}}); err != nil {
					errs <- err
					return
				}
				r, err := st.Receive()
				if err != nil {
					errs <- err
					return
				}
				if r.GetCallId() != id {
					errs <- errors.New("answer to another call")
					return
				}
				calls.Add(1)
			}
			_ = st.CloseRequest()
		})
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	cpu1 := loadgen.CPUTime()
	close(errs)
	for err := range errs {
		return err
	}
	cpu := cpu1 - cpu0
	n := calls.Load()
	fmt.Printf("{\"calls\": %d, \"calls_per_second\": %.1f, \"client_us_per_call\": %.1f}\n", n, float64(n)/secs, float64(cpu.Microseconds())/float64(n))
	return nil
}

// leanServe answers a lean connection's frames until it ends.
func leanServe(c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 4<<10)
	var in, out []byte
	for {
		n, err := binary.ReadUvarint(r)
		if err != nil || n > 64<<10 {
			return
		}
		in = slices.Grow(in[:0], int(n))[:n]
		if _, err := io.ReadFull(r, in); err != nil {
			return
		}
		req := new(lockdv1.StreamRequest)
		if err := req.UnmarshalVT(in); err != nil {
			return
		}
		out = leanAppend(out[:0], &lockdv1.StreamResponse{CallId: req.GetCallId()})
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// leanAppend appends m with its length prefix.
func leanAppend(b []byte, m interface {
	SizeVT() int
	MarshalToSizedBufferVT([]byte) (int, error)
}) []byte {
	n := m.SizeVT()
	b = binary.AppendUvarint(b, uint64(n))
	start := len(b)
	b = slices.Grow(b, n)[:start+n]
	_, _ = m.MarshalToSizedBufferVT(b[start:])
	return b
}

// leanLoad is one stream of load on its own lean connection.
func leanLoad(ctx context.Context, addr string, calls *atomic.Int64) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	answers := make(chan *lockdv1.StreamResponse, 1)
	readErr := make(chan error, 1)
	go func() {
		r := bufio.NewReaderSize(c, 4<<10)
		var in []byte
		for {
			n, err := binary.ReadUvarint(r)
			if err == nil && n > 64<<10 {
				err = errors.New("frame too large")
			}
			if err == nil {
				in = slices.Grow(in[:0], int(n))[:n]
				_, err = io.ReadFull(r, in)
			}
			resp := new(lockdv1.StreamResponse)
			if err == nil {
				err = resp.UnmarshalVT(in)
			}
			if err != nil {
				readErr <- err
				return
			}
			answers <- resp
		}
	}()
	var mu sync.Mutex
	var out []byte
	for id := uint64(1); ctx.Err() == nil; id++ {
		mu.Lock()
		out = leanAppend(out[:0], &lockdv1.StreamRequest{CallId: id, Body: &lockdv1.StreamRequest_Release{
			Release: &lockdv1.ReleaseRequest{SessionId: "0123456789abcdef0123456789abcdef", Seq: id, Name: "bench/own/7", Token: id}}})
		_, err := c.Write(out)
		mu.Unlock()
		if err != nil {
			return err
		}
		select {
		case r := <-answers:
			if r.GetCallId() != id {
				return errors.New("answer to another call")
			}
		case err := <-readErr:
			return err
		}
		calls.Add(1)
	}
	return nil
}
