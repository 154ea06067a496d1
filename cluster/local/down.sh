#!/usr/bin/env bash
# Stop the local SLURM cluster of cluster/local/up.sh and remove its state (jobs are cancelled first).
set -uo pipefail

state="${1:-/tmp/ue5m3-slurm}"
export SLURM_CONF="$state/slurm.conf"
if [ -f "$SLURM_CONF" ]; then
  scancel --quiet --user="$(id -un)" 2>/dev/null
fi
for daemon in slurmd slurmctld munged; do
  pidfile="$state/run/$daemon.pid"
  if [ -f "$pidfile" ]; then
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 20); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    kill -9 "$pid" 2>/dev/null
  fi
done
rm -f /dev/ue5m3fakegpu0 /dev/ue5m3fakegpu1
for name in slurm.conf gres.conf; do
  if [ "$(readlink "/etc/slurm/$name")" = "$state/$name" ]; then
    rm -f "/etc/slurm/$name"
  fi
done
rm -rf "$state"
