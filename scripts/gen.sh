#!/usr/bin/env bash
# Regenerates the Go code for api/tenure/v1/*.proto with pinned, locally
# installed tools: buf (as the compiler driver), protoc-gen-go and
# protoc-gen-connect-go. No remote plugin registry is used.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$(go env GOPATH)/bin"
export PATH="$bin:$PATH"
GOFLAGS= go install github.com/bufbuild/buf/cmd/buf@v1.50.0
GOFLAGS= go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
GOFLAGS= go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
buf generate
gofmt -w api
