package server

import "github.com/lockd-dev/lockd/internal/node"

// Config is a node's configuration; it is defined with the node
// (internal/node) and read by every layer.
type Config = node.Config

// DefaultConfig returns the configuration of a single node with the
// defaults of every setting.
func DefaultConfig() Config { return node.DefaultConfig() }
