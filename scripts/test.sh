#!/usr/bin/env bash
# The contributor's test run, what the README gives: formatting, vet,
# every test under the race detector (but those that only drive tenure
# processes, built without it: e2e, e2e/cluster, e2e/etcd, e2e/kube,
# the benchmark harness, internal/bench (CI runs it under -race too),
# the web page's browser tests, e2e/web, and the one-goroutine
# simulator, internal/sim),
# and a short fuzzing pass on each fuzz target. Every stage runs even when an earlier one failed, and the
# failures are listed together at the end. The release build and the
# cross-compiles are scripts/release-check.sh (CI runs both).
# FUZZTIME (default 3s: every seed and a short search) sets how long
# each fuzz target runs; CI runs the default.
set -uo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-3s}"
failed=()

# stage NAME CMD...: runs CMD, and remembers NAME if it fails.
stage() {
  local name=$1 start=$SECONDS; shift
  echo "== ${name}"
  if ! "$@"; then
    echo "-- FAILED: ${name}"
    failed+=("${name}")
  fi
  echo "-- ${name}: $((SECONDS - start))s"
}

gofmt_check() {
  local unformatted
  unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
  if [ -n "$unformatted" ]; then
    echo "gofmt would change:"; echo "$unformatted"; return 1
  fi
}

# api, client and fence are modules of their own, so that a program that
# imports the client does not inherit the server's dependencies; ./...
# stops at their go.mod, so each is vetted and tested in its directory.
# clientgo (client-go's leader election on a Tenure lease) is one too, so
# that neither the core nor the client depends on Kubernetes. e2e/etcd
# (Tenure's etcd API compared with a real etcd through etcdctl, clientv3
# and its concurrency package) is one too, so that what only those tests
# use stays out of the core module's graph, and so is e2e/kube
# (k8s.io/apiserver's storage conformance tests on its etcd3 store,
# against etcd and Tenure), for k8s.io/apiserver and etcd's 3.7 client.
# tools/tracestat (the trace counter behind docs/benchmarks.md's
# breakdowns) is one so that its trace reader stays out of the core's.
submodules="api client fence clientgo e2e/etcd e2e/kube tools/tracestat"
# The light ones run beside the core's tests; e2e/etcd (real processes,
# a failover) beside the benchmark harness's short run and the fuzzing,
# whose timing it does not disturb, nor they its.
light="api client fence clientgo"

vet_all() {
  local rc=0 mod
  go vet ./... || rc=1
  for mod in $submodules; do (cd "$mod" && go vet ./...) || rc=1; done
  return $rc
}

test_modules() {
  local rc=0 mod race
  for mod in "$@"; do
    # e2e/etcd's and e2e/kube's code under test is tenure processes,
    # built without the race detector; their own code is a test harness,
    # and etcd's client (and k8s.io/apiserver's store) under -race
    # doubles their time, and their compile.
    race=-race; case $mod in e2e/etcd|e2e/kube) race= ;; esac
    (cd "$mod" && go test $race -count=1 -timeout 5m ./...) || rc=1
  done
  return $rc
}

# beside NAME CMD...: starts CMD in the background, its output kept for
# later; done_beside NAME shows it and says how it ended.
beside() {
  local name=$1; shift
  ( start=$SECONDS; "$@"; rc=$?; echo "-- ${name} (beside): $((SECONDS - start))s"; exit $rc ) >"/tmp/tenure-test-$$-$name.log" 2>&1 &
  eval "pid_$name=$!"
}
done_beside() {
  local name=$1 pid rc
  eval "pid=\$pid_$name"
  wait "$pid"; rc=$?
  cat "/tmp/tenure-test-$$-$name.log"; rm -f "/tmp/tenure-test-$$-$name.log"
  return $rc
}

fuzz_all() {
  local rc=0 target pkg mod rel t0
  for target in $(grep -rhoE '^func (Fuzz[A-Za-z0-9_]+)' --include='*_test.go' . | sed 's/func //' | sort -u); do
    pkg=$(dirname "$(grep -rlE "^func ${target}\(" --include='*_test.go' . | head -1)")
    echo "-- ${target} in ${pkg}"
    t0=$SECONDS
    # A package of a nested module (api/framing) is fuzzed from its module.
    mod=$pkg; until [ -f "$mod/go.mod" ]; do mod=$(dirname "$mod"); done
    rel=".${pkg#"$mod"}"
    # Go 1.26's fuzzer can end a clean run with a bare "context deadline
    # exceeded" (golang/go#75804). A real finding is written to testdata and
    # fails the second run too, so one retry only forgives that flake.
    if ! (cd "$mod" && go test -run '^$' -fuzz "^${target}\$" -fuzztime "${fuzztime}" "$rel"); then
      echo "-- ${target} failed; running it once more to tell a finding from the fuzzer's own flake"
      (cd "$mod" && go test -run '^$' -fuzz "^${target}\$" -fuzztime "${fuzztime}" "$rel") || rc=1
    fi
    echo "-- ${target}: $((SECONDS - t0))s, its build included"
  done
  return $rc
}

# build_tenure builds cmd/tenure once, for every package whose tests
# start tenure processes (proccluster.Binary, through $PROCCLUSTER_BINARY):
# each would otherwise link its own, about 4 s of CPU apiece, at the
# moment the core's tests start. Should it fail, each package builds and
# reports the failure itself.
bindir=$(mktemp -d "${TMPDIR:-/tmp}/tenure-test-bin.XXXXXX")
trap 'rm -rf "$bindir"' EXIT
build_tenure() {
  go build -o "$bindir/tenure" ./cmd/tenure && export PROCCLUSTER_BINARY="$bindir/tenure"
}

stage gofmt gofmt_check
# go vet runs beside the core's tests: on two cores the run was
# CPU-bound end to end (418 s, 80 % of both cores), and vet had been a
# stage of its own before them. (The fuzzing beside them too made their
# timing tests flaky, so it stays after them.)
beside vet vet_all
stage "build cmd/tenure for the tests" build_tenure
# The other modules' tests run beside the core's and the fuzzing: most
# of those stages' time is spent waiting, and together they keep both
# cores busy. Their output is shown after.
beside light test_modules $light
# e2e/etcd is real processes, mostly waiting; its timing tests compare
# Tenure with an etcd beside it on the same busy machine. e2e/kube, the
# same (about a minute, 10 s of it CPU), runs after it in the same slot.
# Both run the tenure built above ($TENURE_BINARY), not a build of their
# own.
etcd_modules() {
  if [ -x "$bindir/tenure" ]; then
    TENURE_BINARY="$bindir/tenure" test_modules e2e/etcd e2e/kube
  else
    test_modules e2e/etcd e2e/kube
  fi
}
beside etcd etcd_modules
# e2e and e2e/cluster drive tenure processes, built above without the
# race detector: their own code is a harness (as e2e/etcd's is), which
# the race detector would only slow, so they run without it, beside the
# core's tests, and mostly wait. Under -race they cost the core's stage
# their compile and half its CPU.
# internal/sim (the cluster simulator) is one goroutine by design: the
# race detector has nothing to find in it and made it six times slower,
# so it runs here too; its budget of seeds is about a minute of one core
# (docs/testing.md), spent while the others wait. So does e2e/web: its own code
# drives a browser, and the server it drives runs the same paths as
# server's tests, which run under the race detector; under it, e2e/web
# was the second heaviest package of the core's stage (151 s).
procs="./e2e ./e2e/cluster ./e2e/web ./internal/sim"
beside procs go test -count=1 -p 2 -timeout 15m $procs
# go test starts the packages' test binaries in the order it is given
# them, and with a few slow packages among many quick ones, alphabetical
# order started server, the slowest under -race (170 s in a measured
# core stage of 354 s), 195 s in, and the stage's last 90 s were server
# alone. The slowest go first, those that mostly compute (in-process
# servers under the race detector) beside those that mostly wait
# (processes, browsers); the quick ones fill in after. A package
# named here that no longer exists is left out; one not named runs with
# the quick ones.
slow="server internal/cluster e2e/client raftnode internal/cli"
core_packages() {
  local all p mod
  mod=$(go list -m)
  all=$(go list ./... | grep -v -e '/internal/bench$' -e '/e2e$' -e '/e2e/cluster$' -e '/e2e/web$' -e '/internal/sim$')
  for p in $slow; do grep -qx "$mod/$p" <<<"$all" && echo "$mod/$p"; done
  for p in $slow; do all=$(grep -vx "$mod/$p" <<<"$all"); done
  echo "$all"
}
# Four packages at a time, not go test's one per core: most of the
# suite's time is spent waiting (for TTLs, elections, processes to start),
# and at one per core the two cores stood half idle.
# The benchmark harness's short run loads both cores with servers and
# clients for most of a minute; run beside the fault tests it would make
# their timing its own. It runs afterwards, beside the fuzzing and
# e2e/etcd, which mind no one's timing.
# The benchmark harness's test binary is built beside the core's tests,
# which mostly wait once compiled, so that only its run is left after
# them: its go test took 81 s after the core's, its tests 62 s of it.
# It is built without the race detector, as e2e's are: what it measures
# runs in tenure processes, and under -race its build and run cost about
# 70 s of CPU on a machine the whole command keeps busy (a 389 s run).
# CI runs it under -race too, after this command (.ci/run).
beside benchbuild go test -c -o "$bindir/bench.test" ./internal/bench
stage "go test -race" go test -race -count=1 -p 4 -timeout 15m $(core_packages)
stage "go vet (beside the core's)" done_beside vet
stage "api, client, fence and clientgo modules (go test -race, beside the core's)" done_beside light
stage "e2e, e2e/cluster, e2e/web and internal/sim (processes, the browser, the simulator; go test, beside the core's)" done_beside procs
stage "build internal/bench's tests (go test -c, beside the core's)" done_beside benchbuild
bench_tests() {
  if [ -x "$bindir/bench.test" ]; then
    (cd internal/bench && "$bindir/bench.test" -test.count=1 -test.timeout=10m)
  else
    go test -count=1 -timeout 10m ./internal/bench
  fi
}
beside bench bench_tests
stage "fuzz (${fuzztime} each)" fuzz_all
stage "go test ./internal/bench (after the core's fault tests, beside the fuzzing)" done_beside bench
stage "e2e/etcd and e2e/kube modules (go test, beside the core's)" done_beside etcd

echo "== the run took ${SECONDS}s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "== FAILED stages:"
  printf '   - %s\n' "${failed[@]}"
  exit 1
fi
echo "== all tests passed"
