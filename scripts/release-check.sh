#!/usr/bin/env bash
# The release build (scripts/build.sh, the Dockerfile's build) for every
# platform we ship, checked for what `tenure version` reports. CI runs it
# beside scripts/test.sh; a contributor runs it before touching the build.
# Each target compiles the standard library and every dependency afresh,
# about a minute on two cores; CROSS_TARGETS="linux/arm64" picks fewer.
set -euo pipefail
cd "$(dirname "$0")/.."
build_out=$(mktemp -d)
trap 'rm -rf "${build_out}"' EXIT
for target in ${CROSS_TARGETS:-linux/amd64 linux/arm64 darwin/amd64 darwin/arm64}; do
  echo "-- ${target}"
  GOOS=${target%/*} GOARCH=${target#*/} ./scripts/build.sh "${build_out}/tenure"
  # The binary is static and carries what tenure version reports (git
  # stamps the commit only where .git is a directory: not in a worktree).
  info=$(go version -m "${build_out}/tenure")
  for want in "CGO_ENABLED=0" "-trimpath=true" "GOOS=${target%/*}" "GOARCH=${target#*/}" \
      $([ -d .git ] && echo "vcs.revision=$(git rev-parse HEAD)"); do
    if ! grep -qF -- "${want}" <<<"${info}"; then
      echo "scripts/build.sh for ${target}: the binary's build info lacks ${want}:"; echo "${info}" | grep -v '^	dep'; exit 1
    fi
  done
  # A benchsync build sleeps after every log sync when
  # TENURE_BENCH_SYNC_DELAY is set (raftnode/syncdelay_benchsync.go):
  # for measurements only, never in what we ship.
  if grep -E -- '^[[:space:]]*build[[:space:]]+-tags=(.*,)?benchsync(,|$)' <<<"${info}"; then
    echo "scripts/build.sh for ${target}: the binary was built with -tags benchsync, whose log syncs can be slowed"; exit 1
  fi
done
echo "== release build and cross-compiles passed"
