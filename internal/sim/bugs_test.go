package sim

import (
	"slices"
	"testing"
	"time"
)

// The simulator must be able to fail. Each case below builds a
// deliberately wrong node, client or server behind a Bugs knob and runs
// seeds until a violation shows, asserting that one does within a bound
// and that it is the invariant the bug breaks. The bound is generous;
// the seeds that catch each bug today are in docs/testing.md.
func TestSimulatorCatchesBugs(t *testing.T) {
	heavy := DefaultFaults
	heavy.Crash = 2 * time.Second
	slowDisk := heavy
	slowDisk.MaxDiskLatency = 300 * time.Millisecond
	slowDisk.Crash = time.Second
	// A forgotten vote shows only when a second candidate's request for
	// the same term reaches the voter after it restarted: long delays,
	// and crashes right after voting.
	lateVotes := DefaultFaults
	lateVotes.MaxDelay, lateVotes.Crash, lateVotes.CrashAfterVote, lateVotes.Loss = 800*time.Millisecond, time.Second, 0.5, 0.1
	damage := DefaultFaults
	damage.Damage = 3 * time.Second
	damage.Crash = 4 * time.Second
	cases := []struct {
		name   string
		bugs   Bugs
		faults Faults
		want   []string
	}{
		{"a vote that is not written durably lets a node vote twice in a term", Bugs{ForgetVote: true}, lateVotes, []string{invOneLeader}},
		{"acknowledging appends before the sync loses committed entries", Bugs{AckBeforeSync: true}, slowDisk, []string{invCommitted, invOneLeader, invAckedWrites, invLinearizable}},
		{"granting votes whatever the candidate's log loses committed entries", Bugs{VoteIgnoresLog: true}, DefaultFaults, []string{invCommitted}},
		{"a member that cut a damaged log and votes at once loses committed entries", Bugs{SkipCatchUp: true}, damage, []string{invCommitted}},
		{"applying a batch out of order is seen", Bugs{ApplyOutOfOrder: true}, DefaultFaults, []string{invSameSequence}},
		{"a lessor that expires sessions early is seen", Bugs{EarlyExpiry: true}, DefaultFaults, []string{invSessionTTL}},
		{"a client that trusts its grant for 2 TTL meets another holder", Bugs{TrustPastTTL: true}, heavy, []string{invOneHolder}},
		{"a leader that answers heartbeats without its lease renews sessions its successor expires", Bugs{NoLeaderLease: true}, DefaultFaults, []string{invSessionTTL, invOneHolder}},
		{"answering an acquire with the session ID as token is seen", Bugs{TokenFromSession: true}, DefaultFaults, []string{invTokens}},
		{"reads served from a node's own state are not linearizable", Bugs{StaleRead: true}, DefaultFaults, []string{invLinearizable}},
		{"acknowledging a put when it is proposed loses acknowledged writes", Bugs{AckOnPropose: true}, heavy, []string{invAckedWrites, invLinearizable}},
		{"a watch that resumes from its last revision, not the one after, delivers it twice", Bugs{WatchResumeAtLast: true}, DefaultFaults, []string{invWatch}},
		{"a watch that resumes a revision too far misses one", Bugs{WatchResumePastNext: true}, DefaultFaults, []string{invWatch}},
	}
	const maxSeeds = 300
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= maxSeeds; seed++ {
				res := Run(Options{Seed: seed, Faults: tc.faults, Bugs: tc.bugs, SnapshotEvery: 300, Duration: 10 * time.Second})
				if res.Violation == nil {
					continue
				}
				if !slices.Contains(tc.want, res.Violation.Invariant) {
					t.Fatalf("seed %d: caught, but as %v; expected one of %q", seed, res.Violation, tc.want)
				}
				t.Logf("caught at seed %d: %v", seed, res.Violation)
				// The control: the same seed and faults, without the bug,
				// break nothing, so it was the bug that was caught.
				if ok := Run(Options{Seed: seed, Faults: tc.faults, SnapshotEvery: 300, Duration: 10 * time.Second}); ok.Violation != nil {
					t.Fatalf("seed %d breaks an invariant without the bug too: %v", seed, ok.Violation)
				}
				return
			}
			t.Fatalf("not caught in %d seeds", maxSeeds)
		})
	}
}
