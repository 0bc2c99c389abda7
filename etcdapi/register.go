package etcdapi

import (
	"google.golang.org/grpc"
)

// Register adds every etcd service to gs, served by b.
func Register(gs *grpc.Server, b Backend) {
	registerServices(gs, b)
}
