package server

import "context"

// identityKey is the context key of the caller's identity.
type identityKey struct{}

// withIdentity returns ctx carrying the caller's identity, decided once per
// request where the request enters this node (see auth.go).
func withIdentity(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// identityOf returns the caller's identity, "" when authentication is off.
func identityOf(ctx context.Context) string {
	id, _ := ctx.Value(identityKey{}).(string)
	return id
}
