#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for tfdist's tests and for trying the recipe by hand.
#
#   tests/engines/slurm_cluster.sh start DIR   installs Slurm and munge when missing (root, apt-get),
#                                              writes DIR/slurm.conf, starts munged, slurmctld, slurmd
#   tests/engines/slurm_cluster.sh stop DIR    stops slurmctld and slurmd of DIR (munged, shared, stays)
#
# Then: export SLURM_CONF=DIR/slurm.conf, and sbatch / srun / squeue / scontrol use that cluster.
# The node declares 8 CPUs whatever the machine has (SlurmdParameters=config_overrides), so that a
# step of 4 tasks fits a 2-core machine. A requeued job may start again after 5 s (cred_expire;
# Slurm's default of 120 s would make the requeue test wait two minutes).
# On failure the last line on stderr says why, starting with "cannot start Slurm:".
set -euo pipefail

die() { echo "cannot start Slurm: $*" >&2; exit 1; }

command="${1:-}"
dir="${2:-}"
[ -n "$command" ] && [ -n "$dir" ] || die "usage: $0 start|stop DIR"

stop() {
  for name in slurmd slurmctld; do
    if [ -f "$dir/$name.pid" ]; then
      pid="$(cat "$dir/$name.pid")"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/$name.pid"
    fi
  done
  # munged stays: another cluster started from another DIR may use it.
}

if [ "$command" = stop ]; then stop; exit 0; fi
[ "$command" = start ] || die "unknown command '$command'; use start or stop"

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  [ "$(id -u)" = 0 ] || die "slurmctld or munged is missing and installing them needs root (apt-get install slurm-wlm munge)"
  command -v apt-get >/dev/null || die "slurmctld or munged is missing and there is no apt-get to install them"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >"$dir.apt.log" 2>&1 \
    || { apt-get update -q >>"$dir.apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge \
           >>"$dir.apt.log" 2>&1; } || die "apt-get install slurm-wlm munge failed (see $dir.apt.log)"
fi
[ "$(id -u)" = 0 ] || die "the daemons run as root here (SlurmUser=root); run as root"

mkdir -p "$dir/ctld" "$dir/spool"
host="$(hostname -s)"
# tfdist's tasks reach each other by the node's name, as Slurm lists it.
getent hosts "$host" >/dev/null || die "this machine's name $host does not resolve (add it to /etc/hosts)"

# munge: the system's key and socket (created by the package), a daemon of its own user.
if ! pgrep -x munged >/dev/null; then
  [ -f /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || create-munge-key -f; } >/dev/null 2>&1 \
    || die "no /etc/munge/munge.key and it could not be made"
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- munged || pgrep -x munged >/dev/null || die "munged did not start"
fi

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

cat >"$dir/slurm.conf" <<CONF
ClusterName=tfdist
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=5
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
KillWait=10
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

export SLURM_CONF="$dir/slurm.conf"
slurmctld -i -f "$SLURM_CONF" || die "slurmctld did not start (see $dir/slurmctld.log)"
slurmd -f "$SLURM_CONF" || { stop; die "slurmd did not start (see $dir/slurmd.log)"; }
for _ in $(seq 100); do
  if sinfo -h -N -o %t 2>/dev/null | grep -qx idle; then echo "Slurm is up: export SLURM_CONF=$SLURM_CONF"; exit 0; fi
  sleep 0.2
done
state="$(sinfo -h -N -o '%t %E' 2>&1 || true)"
stop
die "the node did not become idle within 20 s (sinfo: $state; see $dir/slurmctld.log)"
