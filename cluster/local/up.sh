#!/usr/bin/env bash
# A real SLURM cluster on this machine, for the system tests (make test-cluster): munge, one slurmctld and one
# slurmd on localhost, two partitions (cpu, the default, and gpu) and two fake GPUs as gres (character devices
# made with mknod, AutoDetect=off). No accounting: Snakemake's SLURM plugin queries squeue.
#
#   cluster/local/up.sh [STATE_DIR]     start it (installs slurm-wlm and munge with apt when missing)
#   cluster/local/down.sh [STATE_DIR]   stop it and remove STATE_DIR
#   export SLURM_CONF=STATE_DIR/slurm.conf   (optional: /etc/slurm/slurm.conf links to it while it runs)
#
# STATE_DIR defaults to /tmp/ue5m3-slurm. Needs root (slurmd runs jobs as the submitting user).
set -euo pipefail

state="${1:-/tmp/ue5m3-slurm}"
if [ "$(id -u)" -ne 0 ]; then
  echo "cluster/local/up.sh: needs root (slurmd and munged run as system daemons)" >&2
  exit 1
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  echo "cluster/local/up.sh: installing slurm-wlm and munge (apt)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi

mkdir -p "$state"/{spool,ctld,log,run}
host="$(hostname -s)"
cpus=8          # declared, not detected: the jobs of the tests oversubscribe a small machine on purpose
memory=16000    # MB

# munge: the key and the daemon (a private socket, so a system munged is left alone)
if [ ! -s "$state/munge.key" ]; then
  dd if=/dev/urandom bs=1 count=1024 of="$state/munge.key" status=none
fi
chmod 0400 "$state/munge.key"
mkdir -p "$state/munge"
munged --key-file="$state/munge.key" --socket="$state/munge/munge.socket" \
  --pid-file="$state/run/munged.pid" --log-file="$state/log/munged.log" --seed-file="$state/munge/seed" --force

# fake GPUs: any character device will do for gres (slurmd only checks that the file exists)
for i in 0 1; do
  [ -e "/dev/ue5m3fakegpu$i" ] || mknod "/dev/ue5m3fakegpu$i" c 1 3
done

cat >"$state/gres.conf" <<GRES
AutoDetect=off
NodeName=$host Name=gpu Type=fake File=/dev/ue5m3fakegpu[0-1]
GRES

cat >"$state/slurm.conf" <<CONF
ClusterName=ue5m3local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$state/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmdPidFile=$state/run/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
GresTypes=gpu
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge=600
KillWait=10
InactiveLimit=0
SlurmdTimeout=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory Gres=gpu:fake:2 State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$host MaxTime=INFINITE State=UP
CONF

# The default location as well: Snakemake's jobstep plugin drops SLURM_* variables (SLURM_CONF too) inside jobs,
# so an srun there finds the cluster only through /etc/slurm. Another cluster's file there is never replaced.
mkdir -p /etc/slurm
for name in slurm.conf gres.conf; do
  target="/etc/slurm/$name"
  if [ -e "$target" ] && [ "$(readlink "$target")" != "$state/$name" ]; then
    echo "cluster/local/up.sh: $target exists and is not this test cluster's; refusing to replace it" >&2
    exit 1
  fi
  ln -sfn "$state/$name" "$target"
done

export SLURM_CONF="$state/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"

for _ in $(seq 1 60); do
  if sinfo --noheader --Node --format=%t 2>/dev/null | grep -Eq '^(idle|mix|alloc)'; then
    echo "SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 1
done
echo "cluster/local/up.sh: the node did not come up; logs in $state/log" >&2
sinfo --Node --long >&2 || true
tail -n 20 "$state/log/slurmctld.log" "$state/log/slurmd.log" >&2 || true
exit 1
