// Command h2echo measures the server CPU of an HTTP/2 transport per call
// on a bidi stream shaped like lockd's session stream, with no lockd logic
// behind it: a StreamRequest in, its StreamResponse (same call_id) out.
// bench/h2echo.sh runs it; see bench/README.md.
//
//	h2echo serve --impl nethttp|grpc --listen 127.0.0.1:PORT
//	h2echo load  --addr 127.0.0.1:PORT --streams 16 --duration 10s
//
// serve answers SessionService.Stream over h2c with Connect's handler on
// net/http's HTTP/2 server (nethttp, what lockd serves with) or with
// grpc-go's own transport (grpc). load opens --streams streams, each on
// its own connection with the Connect client in its gRPC protocol (the
// same bytes on the wire for both servers; the request body read whole
// envelopes at a time, as lockd's client does), one call in flight per stream
// as lockd bench's workers have, and prints calls/s and its own CPU.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"

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
	case "nethttp", "nethttp-buf":
		if *impl == "nethttp-buf" {
			ln = bufListener{ln}
		}
		mux := http.NewServeMux()
		mux.Handle(lockdv1connect.NewSessionServiceHandler(echo{}))
		srv := &http.Server{Handler: mux, Protocols: new(http.Protocols)}
		srv.Protocols.SetUnencryptedHTTP2(true)
		return srv.Serve(ln)
	case "grpc":
		srv := grpc.NewServer()
		srv.RegisterService(&grpcDesc, nil)
		return srv.Serve(ln)
	}
	return fmt.Errorf("--impl %q: want nethttp, nethttp-buf or grpc", *impl)
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
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *duration)
	defer cancel()
	var calls atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, *streams)
	var ru0 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	for range *streams {
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		// The body read whole envelopes at a time, as lockd's client does.
		cl := lockdv1connect.NewSessionServiceClient(wire.StreamHTTPClient(&http.Client{Transport: tr}), "http://"+*addr, connect.WithGRPC())
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
	var ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	close(errs)
	for err := range errs {
		return err
	}
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	n := calls.Load()
	fmt.Printf("{\"calls\": %d, \"calls_per_second\": %.1f, \"client_us_per_call\": %.1f}\n", n, float64(n)/secs, float64(cpu.Microseconds())/float64(n))
	return nil
}
