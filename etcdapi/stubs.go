package etcdapi

// Placeholders until each service is written; each file that implements
// a service deletes its line here.

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

type watchServer struct {
	pb.UnimplementedWatchServer
	b Backend
}

func newWatch(b Backend) *watchServer { return &watchServer{b: b} }
