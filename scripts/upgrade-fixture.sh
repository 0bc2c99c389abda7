#!/usr/bin/env bash
# Writes e2e/testdata/upgrade again: a data dir written by the build
# before the binary log (cluster version 5, a JSON log and snapshots),
# and the state that build answered, which
# e2e TestADataDirOfTheBuildBeforeTheBinaryLogKeepsEverything starts this
# build on and compares. The old build comes from git: the commit before
# the binary log, or the one given.
set -euo pipefail
cd "$(dirname "$0")/.."
commit="${1:-3ce64be}"
work="$(mktemp -d)"
trap 'git worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/src" "$commit" >/dev/null
(cd "$work/src" && go build -o "$work/tenure-old" ./cmd/tenure)
WRITE_UPGRADE_FIXTURE_WITH="$work/tenure-old" go test -count=1 -run '^TestWriteUpgradeFixture$' -v ./e2e
ls -l e2e/testdata/upgrade
