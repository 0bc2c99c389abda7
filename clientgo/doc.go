// Package clientgo lets Kubernetes' client-go leader election run on a
// Tenure lease: Lock is a resourcelock.Interface that a
// leaderelection.LeaderElector uses in place of a LeaseLock. Programs
// keep their LeaderElectionConfig and callbacks; only the Lock changes:
//
//	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, name,
//		kube.CoreV1(), kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
//
// becomes
//
//	s, err := tenure.NewSession(ctx, client.WithIdentity(id), client.WithTTL(15*time.Second)) // tenure is a *client.Client
//	lock := clientgo.New(s, ns, name)
//
// It is a module of its own, so that Tenure's other modules never depend
// on Kubernetes; it imports only Tenure's client.
//
// # What the adapter adds
//
// Tenure decides who leads, not a comparison of timestamps. A LeaseLock
// candidate takes over a record whose renew time it has seen stand still
// for LeaseDuration, on its own clock, and writes itself in with an
// optimistic update. Here the elector still makes that judgement, but
// its Update is only a request: Tenure grants the lease to one session
// at a time, and refuses while the holder's session lives, whatever the
// candidate's clock made of the record. Sessions live by heartbeats:
// the server ends one a TTL after the last heartbeat reached it,
// measuring on its own clock only, so no two machines' clocks are ever
// compared. The only timing assumption left is the session's own: that
// the holder's clock does not run slower than the server's by more than
// the margin its pessimistic Valid keeps (a quarter of the TTL by
// default; see client.Session).
//
// The leader gets a fencing token. Lock embeds the grant (client.Grant):
// Token returns the token, which strictly increases with each new
// leader, and whether the grant is still certainly held. Send it with
// every write the leader makes — fence.Transport(base, lock) does that
// for HTTP — and let the resources check it (fence.Middleware,
// fence.Validate). A client-go leader can believe it leads after it no
// longer does; the token is what makes that belief harmless.
//
// Release on cancel is honoured at once. With ReleaseOnCancel the
// elector's last Update names no holder, and Lock gives the grant back:
// the next candidate takes over on its next try (RetryPeriod), not after
// a LeaseDuration. Without ReleaseOnCancel the grant stays with the
// session until it is closed or expires, as a LeaseLock's record is left
// to expire; closing the session gives it back at once.
//
// Observers see the record move. Get reports the holder's last
// heartbeat as the record's renew time, so followers see the leader
// renew although nothing is written, and report LeaseDurationSeconds as
// the holder session's TTL. When the leader's session ends, Get reports
// no holder and a follower takes over on its next try, without waiting
// out its own LeaseDuration.
//
// # What client-go's timing still governs
//
// Followers poll: a candidate asks every RetryPeriod plus up to 1.2
// RetryPeriods of jitter, so a takeover comes up to 2.2 RetryPeriods
// after the lease is free. Tenure's own client.Election waits on the
// server instead and is woken at once.
//
// The leader gives up on client-go's schedule. The elector renews every
// RetryPeriod and stops leading only when renewals have failed for
// RenewDeadline; Update fails with ErrLost from the moment the grant may
// be lost, but OnStartedLeading's context is cancelled, and
// OnStoppedLeading called, only when the elector gives up, up to
// RenewDeadline later. Until then the elector's leader still believes it
// leads, although its session may have expired and another candidate
// may lead: a process that was paused (SIGSTOP, a long GC, a frozen VM)
// resumes in exactly that state. Lock's Lost and Context fire the moment
// the grant may be lost, so leader code should select on lock.Lost() or
// run under lock.Context() as well as the elector's context, and should
// fence its writes with the token, which the resources refuse once
// another candidate has been granted the lease.
//
// client-go does not wait for OnStartedLeading to return before it
// releases the lease on cancel: stop the protected work first, then
// cancel the elector's context (as client-go's ReleaseOnCancel
// documentation asks). A write still in flight after the release is
// refused by a resource that checks the token.
//
// The elector's LeaseDuration only decides when a follower asks (Tenure
// answers); the session's TTL decides when a dead leader is replaced:
// a TTL after its last heartbeat reached the server, plus a follower's
// next try.
//
// Coordinated leader election (LeaderElectionConfig.Coordinated) is not
// supported: it needs a Kubernetes coordinator to pick the holder.
//
// A preferred holder (client.Client.SetPreferredHolder, tenure lease
// prefer) asks a Lock's leader to step down only for a candidate that
// waits on the server — tenure elect, client.Election — since a Lock's
// candidates ask without waiting. When asked, the leader's grant ends
// locally at once (Lost, and Context with cause client.ErrStepDown), and
// its next renewal gives the lease back and fails with ErrLost.
//
// # When leadership is lost
//
// Once a grant a Lock held has ended without a release — its session
// expired or was lost, an operator revoked the grant, or its holder was
// asked to step down — the Lock never
// leads again: every Create and Update fails with ErrLost, so that the
// elector stops leading and the program restarts its leader work from
// scratch rather than carrying on under a new token it never saw. A
// program that campaigns again after OnStoppedLeading makes a new Lock,
// on a new session if the old one was lost.
package clientgo
