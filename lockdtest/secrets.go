package lockdtest

import (
	"context"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Secrets returns a Connect client interceptor for tests that call the
// raw API (lockdv1connect clients) rather than the lockd package: it
// remembers the secret of every session a CreateSession answer returns
// and fills it into later requests on that session that leave their
// secret field empty. Every session-scoped call needs its session's
// secret; with Secrets a test spells out only what it is about.
func Secrets() connect.Interceptor {
	return &secrets{byID: map[string]string{}}
}

type secrets struct {
	mu   sync.Mutex
	byID map[string]string
}

func (s *secrets) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if m, ok := req.Any().(proto.Message); ok {
			s.fill(m.ProtoReflect())
		}
		resp, err := next(ctx, req)
		if err == nil {
			if m, ok := resp.Any().(proto.Message); ok {
				s.remember(m.ProtoReflect())
			}
		}
		return resp, err
	}
}

func (s *secrets) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (s *secrets) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// fields returns m's session_id and secret fields, if it has both.
func fields(m protoreflect.Message) (id, secret protoreflect.FieldDescriptor) {
	fs := m.Descriptor().Fields()
	id, secret = fs.ByName("session_id"), fs.ByName("secret")
	if id == nil || secret == nil || id.Kind() != protoreflect.StringKind || secret.Kind() != protoreflect.StringKind {
		return nil, nil
	}
	return id, secret
}

func (s *secrets) fill(m protoreflect.Message) {
	id, secret := fields(m)
	if id == nil || m.Get(secret).String() != "" {
		return
	}
	s.mu.Lock()
	v, ok := s.byID[m.Get(id).String()]
	s.mu.Unlock()
	if ok {
		m.Set(secret, protoreflect.ValueOfString(v))
	}
}

func (s *secrets) remember(m protoreflect.Message) {
	id, secret := fields(m)
	if id == nil || m.Get(secret).String() == "" {
		return
	}
	s.mu.Lock()
	s.byID[m.Get(id).String()] = m.Get(secret).String()
	s.mu.Unlock()
}
