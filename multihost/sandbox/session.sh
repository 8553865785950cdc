#!/bin/sh
# One SSH session on a sandbox host: sshd's ForceCommand (multihost/sandbox/hosts.py writes the
# sshd_config). Every host is the same Unix user, so what makes it a machine of its own is set
# here: its HOME (where runs keep ~/.multihost), its TMPDIR, and, while it is a pod's worker,
# what a TPU VM's session has (the metadata server, gcloud pointed at the stand-in cloud). Then
# what the client asked for, run from HOME by bash as on a TPU VM, or a login shell.
# $1: the host's dir (its env file, and vm.env while it is a pod's worker)
host=$1
# shellcheck source=/dev/null  # export lines the sandbox writes (multihost/sandbox/hosts.py)
. "$host/env" || exit 255
if [ -f "$host/vm.env" ]; then
  # shellcheck source=/dev/null
  . "$host/vm.env" || exit 255
fi
cd "$HOME" || exit 255
shell=/bin/bash
[ -x "$shell" ] || shell=/bin/sh
command=${SSH_ORIGINAL_COMMAND-}
unset SSH_ORIGINAL_COMMAND
if [ -z "$command" ]; then
  exec "$shell" -l
fi
exec "$shell" -c "$command"
