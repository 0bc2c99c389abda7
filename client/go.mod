module github.com/tenurehq/tenure/client

go 1.26.0

replace github.com/tenurehq/tenure/api => ../api

require (
	connectrpc.com/connect v1.21.1
	github.com/tenurehq/tenure/api v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	google.golang.org/protobuf v1.36.12
)
