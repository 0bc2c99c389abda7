// Package client is Tenure's Go client: sessions, locks, semaphores,
// readers-writer locks, leader election and the key/value layer, with
// fencing tokens for the resources the holders call.
//
// A typical owner of a task:
//
//	c, _ := client.New(ctx, []string{"127.0.0.1:7480"})
//	s, _ := c.NewSession(ctx, client.WithTTL(10*time.Second))
//	defer s.Close(ctx)
//	m := s.Mutex("nightly-report")
//	if err := m.Lock(ctx); err != nil { ... }
//	defer m.Unlock(ctx)
//	tok, _ := m.Token()
//	runReport(m.Context(), tok) // stop when the context ends; fence writes with the token
//
// The rules the package keeps (DESIGN.md safety rules 1–6):
//   - Every grant has a fencing token that strictly increases per lease.
//     Pass it to the resources you write to (package fence) so that they
//     reject a holder that has been replaced.
//   - Valid is pessimistic: true only until the last acknowledged
//     heartbeat's send time plus 0.75×TTL on the local monotonic clock,
//     before the server can have expired the session. Lost and Context
//     fire when that passes, when the server says the session is gone, or
//     when an operator revokes the grant.
//   - Waiting happens on the server, in FIFO order, and is woken only
//     when granted.
//   - Errors match sentinels with errors.Is across the network:
//     ErrNotHolder, ErrLocked, ErrCompareFailed, ErrSessionExpired,
//     ErrNotFound, ErrInvalidArgument, and more.
//
// The package imports only the generated API code, connect and protobuf:
// nothing of the server. It is a module of its own,
// github.com/tenurehq/tenure/client, requiring only
// github.com/tenurehq/tenure/api, so that a program importing it inherits
// none of the server's dependencies in its module graph. Its tests
// against a real server live in the server's module (e2e/client).
package client
