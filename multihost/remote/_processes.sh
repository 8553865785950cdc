# shellcheck shell=sh disable=SC2154,SC2034
# (a fragment: its variables come from, and go to, the scripts that source it; those are checked
# with it in place)
# Finding and stopping a run's processes (functions; the scripts that need them source this).
#
# Containment by ancestry. The wrapper is a child subreaper (PR_SET_CHILD_SUBREAPER, set by
# _reaper.sh before it execs sh), so a process that leaves the job's group (setsid,
# a double fork) is re-parented to the wrapper, not to init: its descendants are the whole job.
# ``kids PID`` sets $all to " pid:pgrp ..." for every live descendant of PID, walking
# /proc/PID/task/*/children with builtins only (a fork here would find itself; no other
# process's environment is read). ``stop_own GROUP`` (GROUP: the wrapper's pid and process
# group) TERMs every descendant, KILLs what is left after about 2 s (JAX, for one, catches
# SIGTERM) and sets $out to how many had left the group. Called as is, never in $( ).
#
# The fallback where the wrapper is no subreaper (no python3 on the host) or is gone (its whole
# group SIGKILLed: what it adopted went to init), and for ``multihost kill`` of a run whose
# directory is gone. ``marked DIR`` prints "pid pgrp" for every live process of the run whose
# directory is DIR, found by the MULTIHOST_RUN_DIR in its environment (the wrapper itself has
# none). ``stop_run DIR GROUP`` TERMs them all, KILLs what is left after about 2 s, and prints
# how many had escaped the process group GROUP (setsid daemons).
kids() {
  all=
  _kids "$1"
}
_kids() {
  for t in /proc/"$1"/task/*; do
    l=; { read -r l < "$t"/children; } 2>/dev/null || :
    for k in $l; do
      s=; { read -r s < /proc/"$k"/stat; } 2>/dev/null || continue
      s=${s##*) }; z=${s%% *}; s=${s#* }; s=${s#* }
      [ "$z" = Z ] || all="$all $k:${s%% *}"
      _kids "$k"
    done
  done
}
stop_own() {
  kids "$1"
  out=0
  for e in $all; do
    kill -TERM "${e%%:*}" 2>/dev/null || continue
    [ "${e#*:}" = "$1" ] || out=$((out+1))
  done
  if [ -n "$all" ]; then
    i=0
    while [ $i -lt 20 ]; do kids "$1"; [ -n "$all" ] || break; sleep 0.1; i=$((i+1)); done
    for e in $all; do kill -KILL "${e%%:*}" 2>/dev/null; done
  fi
}
marked() {
  grep -lsxzF "MULTIHOST_RUN_DIR=$1" /proc/[0-9]*/environ | while read -r e; do
    p=${e#/proc/}; p=${p%/environ}
    s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    s=${s##*) }
    # shellcheck disable=SC2086 # the stat fields, split on purpose: state ppid pgrp
    set -- $s
    [ "$1" = Z ] || echo "$p $3"
  done
}
stop_run() {
  out=0 found=
  for e in $(marked "$1" | tr ' ' :); do
    found=1
    kill -TERM "${e%%:*}" 2>/dev/null || continue
    [ "${e#*:}" = "$2" ] || out=$((out+1))
  done
  # nothing found: no second and third scan of /proc (the common end of a job)
  if [ -n "$found" ]; then
    i=0
    while [ $i -lt 20 ] && [ -n "$(marked "$1")" ]; do sleep 0.1; i=$((i+1)); done
    for e in $(marked "$1" | tr ' ' :); do kill -KILL "${e%%:*}" 2>/dev/null; done
  fi
  echo $out
}
