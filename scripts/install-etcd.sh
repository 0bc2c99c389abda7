#!/usr/bin/env bash
# Installs etcd from Debian's packages (etcd-server, etcd-client: etcd
# 3.4 on bookworm) and strace for `tenure bench --against etcd`, which
# starts and stops etcd by itself. Does nothing when both are already on
# PATH, so it is safe to run on every CI run. Debian's package also installs a
# systemd unit; nothing here starts it, and the benchmark never talks to
# it: it runs its own etcd on free loopback ports.
set -euo pipefail

# strace slows etcd's syncs for `tenure bench --sync-delay`, as a
# benchsync build of tenure slows its own (internal/bench/etcdsync.go).
need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server etcd-client)
command -v strace >/dev/null 2>&1 || need+=(strace)
if [ ${#need[@]} -eq 0 ]; then
  echo "etcd and strace are already installed: $(command -v etcd)"
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
# The package may start the daemon where systemd runs (on 127.0.0.1:2379);
# the benchmark does not need it, and it would only take CPU.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
  "${sudo[@]}" systemctl stop etcd || true
fi
etcd --version
