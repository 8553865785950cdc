#!/bin/sh
# multihost autodown: deletes this pod's queued resource (every slice) once the pod has been
# idle for a while, with the VM's own credentials. Runs on worker 0 of slice 0, started
# detached (setsid) by `multihost up --autodown` or `multihost autodown`; at most one per host
# (a lock); it reads its settings again on every tick, so a change needs no restart.
#
# Arguments: DIR (its state, e.g. ~/.multihost/autodown), RUNS (multihost's run directories
#   on this host, e.g. ~/.multihost/runs), TICK (seconds between looks).
# Files in DIR: idle (seconds; "off" ends it), since (epoch s the pod was last seen busy; the
#   arm resets it), status (one line: busy|idle|deleted|failed|off, epoch s, then words), pid
#   (this daemon's), owner (the queued resource it was armed for, written by the arm), log.
# Busy: a multihost run in progress (RUNS/NAME/pid written at its start, RUNS/NAME/exit at its
#   end: a pid file, no exit file and the process group alive), an interactive SSH session
#   (a process on a pseudo-terminal whose session leader sshd started), or a process holding
#   the accelerator (/dev/accel*, /dev/vfio/N) that this user may see.
set -u
umask 077  # started by cron after a reboot too, where the arm's umask is not inherited
dir=$1
runs=$2
tick=$3
PATH=$PATH:/usr/local/bin:/usr/bin:/bin:/snap/bin
export PATH
exec 9>>"$dir/lock"
flock -n 9 || exit 0
echo "$$" > "$dir/pid"  # who holds the lock: `multihost pods` asks whether it still runs
date +%s > "$dir/since"  # a start (an arm, a reboot) restarts the idle timer

md() {
  curl -sf -H 'Metadata-Flavor: Google' \
    "http://${GCE_METADATA_HOST:-metadata.google.internal}/computeMetadata/v1/$1"
}

say() {
  printf '%s\n' "$*" > "$dir/status.tmp" && mv -f "$dir/status.tmp" "$dir/status"
}

busy() {
  for p in "$runs"/*/pid; do
    [ -f "$p" ] || continue
    d=${p%/pid}
    [ -e "$d/exit" ] && continue
    g=
    read -r g < "$p" 2>/dev/null || continue
    if [ -n "$g" ] && kill -0 -"$g" 2>/dev/null; then
      echo "multihost run ${d##*/}"
      return 0
    fi
  done
  # shellcheck disable=SC2009 # ps's own columns; pgrep cannot say a process's terminal
  ps -e -o sid=,tty= | grep ' pts/' | while read -r sid tty; do
    parent=$(ps -o ppid= -p "$sid" 2>/dev/null | tr -d ' ')
    case $(ps -o comm= -p "${parent:-0}" 2>/dev/null) in
      sshd*) echo "an SSH session on $tty"; exit 3 ;;
    esac
  done
  [ $? -eq 3 ] && return 0
  for fd in /proc/[0-9]*/fd/*; do
    case $(readlink "$fd" 2>/dev/null) in
      /dev/accel*|/dev/vfio/[0-9]*)
        pid=${fd#/proc/}
        echo "process ${pid%%/*} holds the accelerator"
        return 0 ;;
    esac
  done
  return 1
}

delete() {
  qr=$(md instance/attributes/queued-resource-name) || {
    echo "the metadata server has no queued-resource-name"
    return 1
  }
  # projects/NUMBER/locations/ZONE/queuedResources/NAME; gcloud's --project wants the id
  name=${qr##*/}
  project=$(md project/project-id) || {
    project=${qr#projects/}
    project=${project%%/*}
  }
  zone=${qr#*/locations/}
  zone=${zone%%/*}
  token=$(md instance/service-accounts/default/token |
    sed -n 's/.*"access_token" *: *"\([^"]*\)".*/\1/p') || token=
  echo "$(date -u +%FT%TZ) idle: deleting $qr" >> "$dir/log"
  if [ -n "$token" ]; then
    CLOUDSDK_AUTH_ACCESS_TOKEN=$token gcloud compute tpus queued-resources delete "$name" \
      --zone "$zone" --project "$project" --force --async --quiet >> "$dir/log" 2>&1
  else
    gcloud compute tpus queued-resources delete "$name" \
      --zone "$zone" --project "$project" --force --async --quiet >> "$dir/log" 2>&1
  fi || {
    echo "gcloud could not delete $name: $(tail -n 1 "$dir/log")"
    return 1
  }
}

while :; do
  idle=off
  read -r idle < "$dir/idle" 2>/dev/null
  now=$(date +%s)
  if [ "$idle" = off ]; then
    say "off $now"
    exit 0
  fi
  if why=$(busy); then
    echo "$now" > "$dir/since"
    say "busy $now $why"
  else
    since=$now
    read -r since < "$dir/since" 2>/dev/null
    if [ $((now - since)) -ge "$idle" ]; then
      if why=$(delete); then
        say "deleted $now idle since $since"
        exit 0
      fi
      say "failed $now $why"
      sleep 60
      continue
    fi
    say "idle $now since $since"
  fi
  sleep "$tick"
done
