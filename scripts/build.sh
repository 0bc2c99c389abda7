#!/usr/bin/env bash
# Builds the tenure binary as releases and the Dockerfile do: static
# (CGO_ENABLED=0, so it runs on distroless, scratch or any Linux), with
# -trimpath (no paths of the build machine in it) and -ldflags "-s -w"
# (no symbol table or DWARF: about a third smaller). GOOS and GOARCH
# come from the environment, as for go build.
#
# `tenure version` reports what the Go toolchain stamped: the git commit,
# its time and whether the tree was dirty, when .git is there. Where it
# is not (a docker build, whose context leaves .git out), set
# TENURE_VERSION, TENURE_COMMIT (a "-dirty" suffix marks a dirty tree)
# and TENURE_COMMIT_TIME to stamp them with -X instead.
#
# Usage: scripts/build.sh OUT    (OUT may be /dev/null to check a build)
set -euo pipefail
usage="usage: scripts/build.sh OUT    (the binary to write; /dev/null checks that it builds)"
case "${1:-}" in
"") echo "$usage" >&2; exit 2 ;;
-h | --help) echo "$usage"; exit 0 ;;
esac
out="$1"
cd "$(dirname "$0")/.."
pkg=github.com/tenurehq/tenure/internal/cli
ldflags="-s -w"
if [ -n "${TENURE_VERSION:-}" ]; then ldflags+=" -X $pkg.buildVersion=${TENURE_VERSION}"; fi
if [ -n "${TENURE_COMMIT:-}" ]; then ldflags+=" -X $pkg.buildCommit=${TENURE_COMMIT}"; fi
if [ -n "${TENURE_COMMIT_TIME:-}" ]; then ldflags+=" -X $pkg.buildCommitTime=${TENURE_COMMIT_TIME}"; fi
# -buildvcs=auto stamps git metadata when .git is there and skips it
# quietly when not, whatever GOFLAGS says.
CGO_ENABLED=0 go build -trimpath -buildvcs=auto -ldflags "$ldflags" -o "$out" ./cmd/tenure
