#!/usr/bin/env bash
# `make reproduce`: the whole pipeline, resumable with the same command after any interruption.
#   workflow/reproduce.sh [snakemake arguments...]      (default: --cores 2)
# One reproduce per checkout at a time (flock on .snakemake/reproduce.lock). Holding that lock, a Snakemake lock
# left by a killed run is stale by construction and is removed; outputs a killed run left incomplete are rerun
# (--rerun-incomplete), and training jobs resume from their newest verified checkpoint.
set -euo pipefail

args=("$@")
if [ ${#args[@]} -eq 0 ]; then
  args=(--cores 2)
fi
directory=.
for ((i = 0; i < ${#args[@]}; i++)); do
  if [ "${args[i]}" = "--directory" ] || [ "${args[i]}" = "-d" ]; then
    directory="${args[i + 1]}"
  fi
done
mkdir -p "$directory/.snakemake"
exec 9>"$directory/.snakemake/reproduce.lock"
if ! flock --nonblock 9; then
  echo "reproduce: another run holds $directory/.snakemake/reproduce.lock (wait for it, or stop it)" >&2
  exit 75
fi
if [ -d "$directory/.snakemake/locks" ] && [ -n "$(ls -A "$directory/.snakemake/locks")" ]; then
  echo "reproduce: removing the stale Snakemake lock of an interrupted run" >&2
  snakemake --unlock "${args[@]}" >/dev/null
fi
exec snakemake --rerun-incomplete "${args[@]}"
