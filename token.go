package lockd

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"

	"connectrpc.com/connect"

	"github.com/lockd-dev/lockd/internal/codec"
)

// WithToken makes every call present token as its credentials
// (Authorization: Bearer), for a server run with --auth-file. The token
// names an identity whose grants decide what the Client may do; see
// docs/security.md.
func WithToken(token string) Option {
	return func(c *config) error {
		token = strings.TrimSpace(token)
		if token == "" || strings.ContainsAny(token, "\r\n") {
			return fmt.Errorf("%w: empty or multi-line token", ErrInvalidArgument)
		}
		c.token = token
		return nil
	}
}

// WithTokenFile is WithToken with the token read from a file (its first
// line; surrounding whitespace is ignored), so it stays out of the command
// line and the environment.
func WithTokenFile(path string) Option {
	return func(c *config) error {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("%w: token file: %w", ErrInvalidArgument, err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		return WithToken(line)(c)
	}
}

// tokenInterceptor sets the Authorization header of every unary call and
// stream.
type tokenInterceptor struct{ header string }

func (t tokenInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", t.header)
		return next(ctx, req)
	}
}

func (t tokenInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", t.header)
		return conn
	}
}

func (t tokenInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// clientOptions are the Connect options of every API client of c: the
// generated-code codec (internal/codec), and the token when one is set.
func (c *Client) clientOptions() []connect.ClientOption {
	opts := []connect.ClientOption{connect.WithCodec(codec.Codec{})}
	if c.cfg.token == "" {
		return opts
	}
	return append(opts, connect.WithInterceptors(tokenInterceptor{header: "Bearer " + c.cfg.token}))
}

// authorize sets the token on a plain HTTP request (the backup download).
func (c *Client) authorize(req *http.Request) {
	if c.cfg.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.token)
	}
}
