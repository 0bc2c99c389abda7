package etcdapi

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// registerServices registers each service of this package. Services
// not written yet are served by etcd's Unimplemented stubs, which name
// the method.
func registerServices(gs *grpc.Server, b Backend) {
	pb.RegisterKVServer(gs, newKV(b))
	pb.RegisterWatchServer(gs, newWatch(b))
	pb.RegisterLeaseServer(gs, newLease(b))
	pb.RegisterClusterServer(gs, newCluster(b))
	pb.RegisterMaintenanceServer(gs, newMaintenance(b))
	pb.RegisterAuthServer(gs, newAuth(b))
	registerRecipes(gs, b)
}

// header is the header of a response at KV revision rev.
func header(b Backend, rev int64) *pb.ResponseHeader {
	cluster, member, term := b.Ident()
	return &pb.ResponseHeader{ClusterId: cluster, MemberId: member, Revision: rev, RaftTerm: term}
}
