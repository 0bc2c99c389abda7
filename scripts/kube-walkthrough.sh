#!/usr/bin/env bash
# Runs docs/kubernetes.md's walkthrough verbatim and checks what it
# promises: the ```sh blocks that follow a `<!-- walkthrough: NAME -->`
# line, in order, in one `bash -euo pipefail`, from an empty /tmp/k (the
# doc's fixed paths; whatever is there is removed). A `# => TEXT` comment
# in a block is a line that block must print: TEXT is the whole line,
# and each `…` in it stands for any run of characters. A block that
# fails, or prints no line for one of its `# =>`, fails the run, named.
#
# Binaries: tenure is built from this checkout; kube-apiserver and
# kubectl are $KUBE_APISERVER and $KUBECTL (default /tmp/kube-apiserver
# and /tmp/kubectl), built by the doc's `<!-- kube-build -->` block when
# the defaults are missing (about 6 minutes on 2 cores). The blocks run
# with these paths in place of /tmp/tenure, /tmp/kube-apiserver and
# /tmp/kubectl; nothing else in them is changed.
#
# Every process the blocks start is in one process group, stopped on
# exit; the run gives up after $KUBE_WALKTHROUGH_TIMEOUT seconds (300).
# /tmp/k stays afterwards, with the servers' logs, and what the blocks
# printed is in /tmp/k-walkthrough.log.
set -euo pipefail
cd "$(dirname "$0")/.."
doc=docs/kubernetes.md
limit="${KUBE_WALKTHROUGH_TIMEOUT:-300}"
apiserver_bin="${KUBE_APISERVER:-/tmp/kube-apiserver}"
kubectl_bin="${KUBECTL:-/tmp/kubectl}"
ports="2379 2479 6443 7480 7481 7580 7581"

say() { echo "kube-walkthrough: $*" >&2; }
fail() { say "$*"; exit 1; }

work="$(mktemp -d)"
watchdog=
cleanup() {
  if [ -n "$watchdog" ]; then kill "$watchdog" 2>/dev/null || true; fi
  if [ -s "$work/pgid" ]; then
    local pg
    pg="$(cat "$work/pgid")"
    if kill -TERM -- "-$pg" 2>/dev/null; then
      for _ in $(seq 1 50); do
        kill -0 -- "-$pg" 2>/dev/null || break
        sleep 0.2
      done
      kill -KILL -- "-$pg" 2>/dev/null || true
    fi
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# blocks MARK: the ```sh blocks after a line "<!-- MARK... -->", each
# preceded by a line "@@block NAME" (NAME: the marker's text after
# "MARK: ").
blocks() {
  awk -v mark="$1" '
    index($0, "<!-- " mark) == 1 {
      name = $0; sub("^<!-- " mark ":? *", "", name); sub(" *-->$", "", name)
      want = 1; next
    }
    want && /^```sh$/ { print "@@block " name; inblock = 1; want = 0; next }
    want { want = 0 }
    inblock && /^```$/ { inblock = 0; next }
    inblock { print }
  ' "$doc"
}

# Binaries.
for tool in etcdctl openssl curl ss setsid; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (etcdctl: scripts/install-etcd.sh)"
done
if [ ! -x "$apiserver_bin" ] || [ ! -x "$kubectl_bin" ]; then
  if [ -n "${KUBE_APISERVER:-}${KUBECTL:-}" ]; then
    fail "KUBE_APISERVER=$apiserver_bin or KUBECTL=$kubectl_bin is not an executable"
  fi
  say "building kube-apiserver and kubectl into /tmp, as $doc says (about 6 minutes)"
  blocks kube-build | grep -v '^@@block' > "$work/build.sh"
  [ -s "$work/build.sh" ] || fail "no <!-- kube-build --> block in $doc"
  bash -euo pipefail "$work/build.sh"
fi
say "building tenure from $(pwd)"
go build -o "$work/tenure" ./cmd/tenure

# The script: each block opened by a line naming it in the output.
blocks walkthrough > "$work/blocks"
grep -q '^@@block' "$work/blocks" || fail "no <!-- walkthrough: … --> blocks in $doc"
{
  # The process group of everything the blocks start, for cleanup.
  echo 'echo $$ > '"'$work/pgid'"
  awk '/^@@block / { sub(/^@@block /, ""); printf "echo \"@@block %d %s\"\n", ++n, $0; next } { print }' "$work/blocks" |
    sed -e "s#/tmp/tenure\\b#$work/tenure#g" \
      -e "s#/tmp/kube-apiserver\\b#$apiserver_bin#g" \
      -e "s#/tmp/kubectl\\b#$kubectl_bin#g"
} > "$work/walk.sh"
# The promises: "N<TAB>TEXT" for each "# => TEXT" of block N.
awk '/^@@block / { n++; next } { if (match($0, /(^|[ \t])# => /)) { t = substr($0, RSTART + RLENGTH); sub(/[ \t]+$/, "", t); print n "\t" t } }' \
  "$work/blocks" > "$work/promises"

# A clean start.
for p in $ports; do
  if ss -Hltn "sport = :$p" | grep -q .; then
    fail "port $p is in use: the walkthrough's servers listen on $ports"
  fi
done
rm -rf /tmp/k

nblocks="$(grep -c '^@@block' "$work/blocks")"
say "running $nblocks blocks of $doc (log: /tmp/k-walkthrough.log)"
start="$(date +%s)"
setsid -w bash -euo pipefail "$work/walk.sh" > /tmp/k-walkthrough.log 2>&1 < /dev/null &
runner=$!
(
  for _ in $(seq 1 "$limit"); do sleep 1; done
  touch "$work/timedout"
  [ -s "$work/pgid" ] && kill -TERM -- "-$(cat "$work/pgid")" 2>/dev/null
) &
watchdog=$!
rc=0
wait "$runner" || rc=$?
kill "$watchdog" 2>/dev/null || true
watchdog=
elapsed=$(($(date +%s) - start))

# output N: what block N printed.
output() { awk -v n="$1" '/^@@block / { cur = $2; next } cur == n' /tmp/k-walkthrough.log; }
name() { sed -n "s/^@@block $1 //p" /tmp/k-walkthrough.log | head -1; }
last="$(grep -c '^@@block' /tmp/k-walkthrough.log || true)"
if [ -e "$work/timedout" ] || [ "$rc" -ne 0 ]; then
  why="failed (exit $rc)"
  [ -e "$work/timedout" ] && why="did not finish in ${limit}s"
  say "step \"$(name "$last")\" $why after ${elapsed}s; its output, last 40 lines:"
  output "$last" | tail -n 40 >&2
  fail "step \"$(name "$last")\" $why; servers' logs are in /tmp/k"
fi
[ "$last" -eq "$nblocks" ] || fail "only $last of $nblocks blocks ran"

# Each promise is a whole line of its block's output: the text between
# the "…" in order, the first at the start, the last at the end.
bad=0
while IFS=$'\t' read -r n text; do
  # (The text comes through the environment: awk -v would read its
  # backslashes, as in od's "\0", as escapes.)
  if ! output "$n" | PROMISE="$text" awk '
      BEGIN { k = split(ENVIRON["PROMISE"], part, "…") }
      {
        line = $0; sub(/[ \t]+$/, "", line)
        if (k == 1) { if (line == part[1]) found = 1; next }
        if (substr(line, 1, length(part[1])) != part[1]) next
        rest = substr(line, length(part[1]) + 1); ok = 1
        for (i = 2; i < k; i++) {
          j = index(rest, part[i]); if (!j) { ok = 0; break }
          rest = substr(rest, j + length(part[i]))
        }
        if (ok && length(rest) >= length(part[k]) && substr(rest, length(rest) - length(part[k]) + 1) == part[k]) found = 1
      }
      END { exit !found }'; then
    say "step \"$(name "$n")\" printed no line \"$text\"; it printed:"
    output "$n" | tail -n 40 >&2
    bad=$((bad + 1))
  fi
done < "$work/promises"
[ "$bad" -eq 0 ] || fail "$bad of $(wc -l < "$work/promises") promised lines not printed"
say "ok: $nblocks blocks ran and printed all $(wc -l < "$work/promises") promised lines in ${elapsed}s"
