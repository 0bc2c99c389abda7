module github.com/tenurehq/tenure/e2e/etcd

go 1.26.0

// The core and the client modules come from this checkout: replace lines
// in the core's go.mod do not apply here.
replace (
	github.com/tenurehq/tenure => ../../
	github.com/tenurehq/tenure/api => ../../api
	github.com/tenurehq/tenure/client => ../../client
	github.com/tenurehq/tenure/fence => ../../fence
)

require (
	github.com/tenurehq/tenure v0.0.0-00010101000000-000000000000
	go.etcd.io/etcd/api/v3 v3.5.35
	go.etcd.io/etcd/client/v3 v3.5.35
	go.uber.org/zap v1.17.0
	google.golang.org/grpc v1.83.2
)

require (
	connectrpc.com/connect v1.21.1 // indirect
	github.com/coreos/go-semver v0.3.1 // indirect
	github.com/coreos/go-systemd/v22 v22.7.0 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	github.com/tenurehq/tenure/api v0.0.0-00010101000000-000000000000 // indirect
	go.etcd.io/etcd/client/pkg/v3 v3.5.35 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.uber.org/atomic v1.7.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
