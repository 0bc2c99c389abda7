package etcdapi

import (
	"context"
	"net/http"
	"strings"

	gw "github.com/grpc-ecosystem/grpc-gateway/runtime"
	etcdgw "go.etcd.io/etcd/api/v3/etcdserverpb/gw"
	electiongw "go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb/gw"
	lockgw "go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb/gw"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// GatewayRemoteKey is the metadata in which the gateway tells the gRPC
// server the address of the HTTP client a call comes from. The server
// believes it only from the gateway's own in-process connection; the
// gateway drops it from what a client sends (Grpc-Metadata-...).
const GatewayRemoteKey = "tenure-gateway-remote"

// NewGateway is etcd's HTTP/JSON gateway, the handler of the paths
// under /v3/, over conn, a connection to the gRPC server that serves
// this package's services. It is etcd 3.5's own: the code
// go.etcd.io/etcd/api/v3/etcdserverpb/gw (and the Lock and Election
// services' gw packages) generated with grpc-gateway v1, on a mux built
// as go.etcd.io/etcd/server/v3/embed/serve.go registerGateway builds it,
// with grpc-gateway's defaults: JSON with the protos' own field names,
// int64 as strings, bytes as base64, defaults left out; errors as
// {"error","code","message"} with the HTTP status of the gRPC code; a
// stream (Watch, LeaseKeepAlive) as one {"result":...} object a line.
// As etcd's accessController does, /v3beta/ is taken for /v3/.
//
// Each call goes through conn, so the gRPC server's interceptors
// (metrics, sizes, authentication, forwarding to the leader) see it as
// they see any client's. The Authorization header travels as the
// "authorization" metadata, as grpc-gateway passes it and etcd's
// gateway clients send the token of /v3/auth/authenticate.
//
// maxBody bounds a request body, which grpc-gateway reads whole before
// decoding it; past it the request is refused as invalid, changing
// nothing.
func NewGateway(ctx context.Context, conn *grpc.ClientConn, maxBody int64) (http.Handler, error) {
	mux := gw.NewServeMux(
		gw.WithIncomingHeaderMatcher(func(key string) (string, bool) {
			if strings.EqualFold(key, gw.MetadataHeaderPrefix+GatewayRemoteKey) {
				return "", false
			}
			return gw.DefaultHeaderMatcher(key)
		}),
		gw.WithMetadata(func(_ context.Context, r *http.Request) metadata.MD {
			return metadata.Pairs(GatewayRemoteKey, r.RemoteAddr)
		}),
	)
	for _, register := range []func(context.Context, *gw.ServeMux, *grpc.ClientConn) error{
		etcdgw.RegisterKVHandler,
		etcdgw.RegisterWatchHandler,
		etcdgw.RegisterLeaseHandler,
		etcdgw.RegisterClusterHandler,
		etcdgw.RegisterMaintenanceHandler,
		etcdgw.RegisterAuthHandler,
		lockgw.RegisterLockHandler,
		electiongw.RegisterElectionHandler,
	} {
		if err := register(ctx, mux, conn); err != nil {
			return nil, err
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rest, ok := strings.CutPrefix(r.URL.Path, "/v3beta/"); ok {
			r.URL.Path = "/v3/" + rest
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		// Not full duplex, as etcd's is not: a stream takes the requests
		// of its body, then answers. (With full duplex on, every
		// keep-alive python3-etcd3gw sent got an empty answer; e2e/etcd
		// TestEtcdGatewayClients runs it.)
		mux.ServeHTTP(w, r)
	}), nil
}

// GatewayMaxBody is the largest request body the gateway reads for a
// gRPC server that takes requests of up to maxRequest bytes: the
// request as JSON, its bytes in base64 (4/3 of them) with the names of
// its fields, and room for the part of a message gRPC reads past the
// limit so that a request a little too large gets etcd's error for it.
func GatewayMaxBody(maxRequest int) int64 {
	return int64(maxRequest+grpcOverheadBytes)*2 + 64<<10
}
