// Package proto holds lockd's protobuf definitions and the Go code generated
// from them (committed, so builds never need buf).
//
// Regenerate after editing a .proto file:
//
//	go install github.com/bufbuild/buf/cmd/buf@v1.75.0
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
//	go install github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto@v0.6.0
//	go generate ./proto
package proto

//go:generate sh -c "cd .. && buf lint && buf generate"
