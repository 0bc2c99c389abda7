package bench

import (
	"context"
	"os/exec"
	"strconv"
	"time"
)

// --sync-delay slows Tenure's log syncs from inside (a benchsync build
// sleeps after each). etcd is someone else's binary, so its syncs are
// slowed from outside: it runs under strace, which stops it at each
// fdatasync and fsync (and only those, through a seccomp filter) and
// returns from the call the delay later, a disk that syncs that much
// more slowly. Without a working strace etcd's disk is left as it is,
// and the report says so (Report.EtcdSyncDelay).

// etcdSyncTracer is the path of an strace that can delay a child's
// syncs here, or "" when there is none: not installed, or tracing is
// not allowed (a container may forbid ptrace). It tries once on true.
func etcdSyncTracer(ctx context.Context) string {
	path, err := exec.LookPath("strace")
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	probe := exec.CommandContext(ctx, path, append(straceArgs(time.Microsecond), "true")...)
	if probe.Run() != nil {
		return ""
	}
	return path
}

// straceArgs has strace run a command whose syncs each return delay
// later, tracing nothing else and printing nothing.
func straceArgs(delay time.Duration) []string {
	us := max(delay.Microseconds(), 1)
	return []string{
		"-f", "--seccomp-bpf", "-qq", "-o", "/dev/null",
		"-e", "trace=fdatasync,fsync",
		"-e", "inject=fdatasync,fsync:delay_exit=" + strconv.FormatInt(us, 10),
	}
}
