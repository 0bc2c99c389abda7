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

type clusterServer struct {
	pb.UnimplementedClusterServer
	b Backend
}

func newCluster(b Backend) *clusterServer { return &clusterServer{b: b} }

type maintenanceServer struct {
	pb.UnimplementedMaintenanceServer
	b Backend
}

func newMaintenance(b Backend) *maintenanceServer { return &maintenanceServer{b: b} }

type authServer struct {
	pb.UnimplementedAuthServer
	b Backend
}

func newAuth(b Backend) *authServer { return &authServer{b: b} }
