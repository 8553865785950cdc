#!/bin/sh
# shellcheck source-path=SCRIPTDIR
# The startup script every TPU VM worker of a job runs (multihost.job.startup sends it as
# instance metadata: a #!/bin/sh line, its values as arguments, each quoted once, then this text).
# Arguments: JOB ATTEMPT BUCKET CODE_HASH COMMAND USER_ENV SECRETS PROJECT LOG_INTERVAL
# FETCH_TRIES COORDINATOR_PORT MEGASCALE_PORT ENV_LOCK ENV_SELECT ENV_REQUIREMENTS
# ENV_REQUIREMENTS_BYTES ENV_WAIT ENV_POLL UV_URL UV_SHA256 UV_VERSION HOOK ENV_PROBE ENV_BUILD
# ENV_INSTALL ENV_UPLOAD CACHE_URL CACHE_MAX (USER_ENV: ``export K=V`` lines, evaluated last;
# SECRETS: KEY=NAME
# words; PROJECT: "" for gcloud's own; ENV_LOCK "": no locked environment, and the ENV_* and
# UV_* arguments unused; ENV_REQUIREMENTS: a requirements file's text, "" to build from uv.lock;
# HOOK: the sitecustomize.py text; ENV_PROBE: env_probe.py's source; ENV_BUILD, ENV_INSTALL,
# ENV_UPLOAD: the run path's env_build.sh, env_install.sh and env_upload.sh as sent; CACHE_URL:
# the job's compile caches in the bucket, "" for none; CACHE_MAX: each one's cap in bytes).
# Per worker, it reads the metadata server, fetches and verifies the code (bounded retries), gets
# the locked environment when the job has one (below), runs the command with the environment
# ``multihost run`` gives, ships its log to the bucket every LOG_INTERVAL seconds, at a
# preemption's notice and at exit, and at exit writes the exit code there (besides the
# command's own: 122 the work directory refused, 125 no code, 121 no environment, 123 a secret
# unreadable; multihost.job.startup names them).
# The locked environment: each worker works out its key as ``run`` does (ENV_PROBE); one that has
# it complete does nothing. Else it looks in the job's bucket
# (``.../multihost/envs/<key>/<sha256>.tar.gz``) and takes the pack from there, sha256-checked,
# with the run path's own ENV_INSTALL (gzip, as every bucket's pack). Process 0 (slice 0, worker
# 0) that finds none builds it with the run path's ENV_BUILD (fetching the job's uv when its host
# has none) and puts the pack there with ENV_UPLOAD; the other workers wait for it, at most
# ENV_WAIT seconds, and stop at once when process 0 leaves a ``failed-<job>-<attempt>`` marker
# beside it. A later attempt after a preemption finds the pack in the bucket: it never touches
# the package index.
# The compile cache: each worker keeps its own (a process's programs are compiled for its
# devices) in CACHE_URL/slice-S-worker-W/; it takes what is there into the job's cache
# directory (the same path in every attempt: jax's keys depend on it) before the command starts, and puts what changed back every LOG_INTERVAL seconds and at exit,
# so an attempt after a preemption compiles nothing an earlier one did. The staged hook points
# jax at it (MULTIHOST_COMPILE_CACHE) unless the job's env has a JAX_COMPILATION_CACHE_DIR.
job=$1
attempt=$2
bucket=$3
code_hash=$4
command=$5
user_env=$6
secrets=$7
project=$8
log_interval=$9
fetch_tries=${10}
coordinator_port=${11}
megascale_port=${12}
env_lock=${13}
env_select=${14}
env_requirements=${15}
env_requirements_bytes=${16}
env_wait=${17}
env_poll=${18}
uv_url=${19}
uv_sha256=${20}
uv_version=${21}
hook=${22}
env_probe=${23}
env_build=${24}
env_install=${25}
env_upload=${26}
cache_url=${27}
cache_max=${28}
set -u
umask 077
PATH=$PATH:/usr/local/bin:/usr/bin:/bin:/snap/bin
export PATH
md_host=${GCE_METADATA_HOST:-metadata.google.internal}

md() {
  curl -sf --retry 5 --retry-delay 1 --retry-connrefused \
    -H 'Metadata-Flavor: Google' "http://$md_host/computeMetadata/v1/instance/$1"
}

tpu_env_value() {
  printf '%s\n' "$tpu_env" | sed -n "s/^$1: *'\{0,1\}\([^']*\)'\{0,1\} *\$/\1/p" | head -n 1
}

worker=$(md attributes/agent-worker-number) || worker=
tpu_env=$(md attributes/tpu-env) || tpu_env=
endpoints=$(md attributes/worker-network-endpoints) || endpoints=
case $worker in
  '' | *[!0-9]*) echo "multihost: no agent-worker-number from the metadata server" >&2; exit 1 ;;
esac
slice=$(tpu_env_value MEGASCALE_SLICE_ID)
slice=${slice:-0}
num_slices=$(tpu_env_value MEGASCALE_NUM_SLICES)
num_slices=${num_slices:-1}
workers=$(printf '%s\n' "$endpoints" | tr ',' '\n' | grep -c .)
coordinator=$(printf '%s\n' "$endpoints" | cut -d, -f1 | awk -F: '{print $NF}')
if [ "$num_slices" -gt 1 ]; then
  coordinator=$(tpu_env_value MEGASCALE_COORDINATOR_ADDRESS)
  coordinator=${coordinator%:*}
fi
case $coordinator in
  *:*) coordinator="[$coordinator]" ;;
esac

base=${MULTIHOST_WORK_DIR:-/var/tmp/multihost-$(id -u)}
dir=$base/jobs/$job/attempt-$attempt/slice-$slice-worker-$worker
code=$base/code/$code_hash
remote=$bucket/multihost/jobs/$job/attempt-$attempt/slice-$slice-worker-$worker
# The work directory is created private, or used only if it is a directory (not a link) of
# this user's, which this user then makes private: never trusted because it exists.
mkdir -m 700 "$base" 2>/dev/null
refused=
if [ -L "$base" ] || [ ! -d "$base" ]; then
  refused="$base is not a directory"
elif [ "$(stat -c %u "$base")" != "$(id -u)" ]; then
  refused="$base belongs to uid $(stat -c %u "$base"), not to $(id -u)"
else
  chmod 700 "$base" && [ "$(stat -c %a "$base")" = 700 ] || refused="$base cannot be made 0700"
fi
if [ -n "$refused" ]; then
  dir=$(mktemp -d) || exit 1  # only to report the refusal from
fi
rm -rf "$dir"  # a job of the same name that ran here before left its files
mkdir -p "$dir" || exit 1
[ -n "$refused" ] || mkdir -p "$base/code" || exit 1
log=$dir/log
: > "$log"

note() {
  echo "[multihost] $*" >> "$log"
}

put() {
  gcloud storage cp "$1" "$2" >> "$dir/gcloud.log" 2>&1
}

# The final log and the exit code go up in one gcloud call (each call costs ~1 s of CPU).
report_exit() {
  out=$dir/out
  rm -rf "$out" && mkdir -p "$out" || exit "$1"
  cp "$log" "$out/slice-$slice-worker-$worker.log"
  echo "$1" > "$out/slice-$slice-worker-$worker.exit"
  gcloud storage cp "$out/slice-$slice-worker-$worker.log" \
    "$out/slice-$slice-worker-$worker.exit" "${remote%/*}/" >> "$dir/gcloud.log" 2>&1
  exit "$1"
}

fetch() {
  test -e "$code/.multihost-complete" && return 0
  tries=0
  while [ "$tries" -lt "$fetch_tries" ]; do
    tries=$((tries + 1))
    rm -f "$dir/code.tar.gz"
    if gcloud storage cp "$bucket/multihost/code/$code_hash.tar.gz" "$dir/code.tar.gz" \
      >> "$dir/gcloud.log" 2>&1; then
      got=$(sha256sum "$dir/code.tar.gz" | cut -d' ' -f1)
      if [ "$got" = "$code_hash" ]; then
        incoming=$base/code/.incoming.$$
        rm -rf "$incoming"
        mkdir -p "$incoming" && tar -xzf "$dir/code.tar.gz" -C "$incoming" || return 1
        : > "$incoming/.multihost-complete"
        mv "$incoming" "$code" 2>/dev/null || rm -rf "$incoming"
        rm -f "$dir/code.tar.gz"
        return 0
      fi
      note "code fetch $tries/$fetch_tries: sha256 $got, expected $code_hash"
    else
      note "code fetch $tries/$fetch_tries failed: $(tail -n 1 "$dir/gcloud.log")"
    fi
    [ "$tries" -lt "$fetch_tries" ] && sleep $((tries * 2))
  done
  return 1
}

. ./_gs.sh

# The locked environment (see the module's docstring). Sets env_dir; says why not in the log.
env_dir=
sync_env() {
  envs=$base/envs
  uv=$(command -v uv 2>/dev/null) || uv=
  if [ -z "$uv" ] && [ -x "$base/bin/uv" ]; then uv=$base/bin/uv; fi
  said=$(python3 -c "$env_probe" "$envs" "$env_lock" "$uv_version" "$uv" 2>> "$log") || {
    note "environment: the check failed (no python3?)"
    return 1
  }
  key='' state='' exe=''
  for w in $said; do
    case $w in
      key=*) key=${w#key=} ;;
      state=*) state=${w#state=} ;;
      exe=*) exe=${w#exe=} ;;
    esac
  done
  env_dir=$envs/$key
  if [ "$state" = present ]; then
    note "environment $key: present"
    return 0
  fi
  prefix=$bucket/multihost/envs/$key/
  waited=0
  while :; do
    listed=$(gcloud storage ls "$prefix" 2>/dev/null) || listed=
    pack=$(printf '%s\n' "$listed" | grep '/[0-9a-f]*\.tar\.gz$' | head -n 1)
    if [ -n "$pack" ]; then
      digest=${pack##*/}
      digest=${digest%.tar.gz}
      if sh -c "$env_install" env_install "$base" "$key" gz "$digest" gs "$pack" '' 0 \
        > /dev/null 2>> "$log"; then
        note "environment $key: taken from $pack"
        return 0
      fi
      note "environment $key: could not take $pack (above)"
      return 1
    fi
    case $listed in
      *"/failed-$job-$attempt"*)
        note "environment $key: process 0 could not build it (see its log)"
        return 1
        ;;
    esac
    if [ "$slice" = 0 ] && [ "$worker" = 0 ]; then
      build_env && return 0
      echo "$job $attempt" > "$dir/env.failed"
      gs_cp "$dir/env.failed" "${prefix}failed-$job-$attempt" 2>> "$log" || :
      return 1
    fi
    if [ "$waited" -ge "$env_wait" ]; then
      note "environment $key: not in $prefix after ${waited}s of waiting for process 0 to" \
        "build it (a worker whose Python or platform differs from process 0's has another key)"
      return 1
    fi
    sleep "$env_poll"
    waited=$((waited + env_poll))
  done
}

# Process 0 builds the environment with uv (the job's own when the host has none) and puts
# the pack in the bucket, under its content name.
build_env() {
  if [ -z "$uv" ]; then
    if [ -z "$uv_url" ]; then
      note "environment $key: no uv on this host and none in the job (install uv here)"
      return 1
    fi
    mkdir -p "$base/bin" || return 1
    gs_cp "$uv_url" "$base/bin/uv.part" 2>> "$log" || {
      note "environment $key: could not fetch uv from $uv_url"
      return 1
    }
    got=$(sha256sum "$base/bin/uv.part" | cut -d' ' -f1)
    if [ "$got" != "$uv_sha256" ]; then
      rm -f "$base/bin/uv.part"
      note "environment $key: uv from $uv_url has sha256 $got, expected $uv_sha256"
      return 1
    fi
    chmod 755 "$base/bin/uv.part" && mv -f "$base/bin/uv.part" "$base/bin/uv" || return 1
  fi
  note "environment $key: building it with uv (process 0; nothing in $prefix)"
  packed=$(printf '%s' "$env_requirements" | HOME=${HOME:-$base} sh -c "$env_build" env_build \
    "$base" "$key" gz "$code" "$exe" "$env_select" "$env_requirements_bytes" 0 '' '' \
    2>> "$log") || {
    note "environment $key: the build failed (uv's error above)"
    return 1
  }
  digest=${packed##* }
  sh -c "$env_upload" env_upload "$base" "$key" "$prefix$digest.tar.gz" > /dev/null 2>> "$log" || {
    note "environment $key: could not put it in $prefix (above)"
    return 1
  }
  note "environment $key: built, and put in $prefix$digest.tar.gz"
}

note "job $job attempt $attempt: slice $slice worker $worker of $num_slices x $workers"
if [ -n "$refused" ]; then
  note "refusing the work directory: $refused (set MULTIHOST_WORK_DIR, or remove it)"
  report_exit 122
fi
if ! fetch; then
  note "could not fetch $bucket/multihost/code/$code_hash.tar.gz: giving up"
  report_exit 125
fi
if [ -n "$env_lock" ]; then
  sync_env || report_exit 121
  VIRTUAL_ENV=$env_dir
  MULTIHOST_ENV=$env_dir
  PATH=$env_dir/bin:$PATH
  export VIRTUAL_ENV MULTIHOST_ENV PATH
fi

JAX_COORDINATOR_ADDRESS=$coordinator:$coordinator_port
JAX_PROCESS_ID=$((slice * workers + worker))
JAX_PROCESS_COUNT=$((num_slices * workers))
MULTIHOST_RUN=$job
MULTIHOST_SLICE_ID=$slice
MULTIHOST_WORKER_ID=$worker
MULTIHOST_NUM_SLICES=$num_slices
MULTIHOST_JOB=$job
MULTIHOST_ATTEMPT=$attempt
export JAX_COORDINATOR_ADDRESS JAX_PROCESS_ID JAX_PROCESS_COUNT MULTIHOST_RUN \
  MULTIHOST_SLICE_ID MULTIHOST_WORKER_ID MULTIHOST_NUM_SLICES MULTIHOST_JOB MULTIHOST_ATTEMPT
if [ "$num_slices" -gt 1 ]; then
  MEGASCALE_COORDINATOR_ADDRESS=$coordinator:$megascale_port
  MEGASCALE_PORT=$megascale_port
  MEGASCALE_NUM_SLICES=$num_slices
  MEGASCALE_SLICE_ID=$slice
  export MEGASCALE_COORDINATOR_ADDRESS MEGASCALE_PORT MEGASCALE_NUM_SLICES MEGASCALE_SLICE_ID
fi
# The compile cache: this worker's, from the bucket (none there on a first attempt)
cache=
if [ -n "$cache_url" ]; then
  # one path for every attempt (jax's keys depend on it), filled from the bucket alone
  cache=$base/jobs/$job/compile-cache
  cache_url=$cache_url/slice-$slice-worker-$worker
  rm -rf "$cache" && mkdir -m 700 "$cache" && : > "$dir/cache.synced"
  if gcloud storage rsync -r "$cache_url" "$cache" >> "$dir/gcloud.log" 2>&1; then
    note "compile cache: $(find "$cache" -type f | grep -c .) file(s) from $cache_url"
  else
    note "compile cache: none yet in $cache_url"
  fi
  MULTIHOST_COMPILE_CACHE=$cache
  MULTIHOST_COMPILE_CACHE_MAX=$cache_max
  export MULTIHOST_COMPILE_CACHE MULTIHOST_COMPILE_CACHE_MAX
fi

# What the command added to the compile cache goes to the bucket (one gcloud call, only when a
# file is newer than the last sync): mirrored, so the hook's size cap holds there too.
sync_cache() {
  [ -n "$cache" ] || return 0
  [ -n "$(find "$cache" -type f -newer "$dir/cache.synced" -print -quit 2>/dev/null)" ] || return 0
  : > "$dir/cache.syncing"
  gcloud storage rsync -r --delete-unmatched-destination-objects "$cache" "$cache_url" \
    >> "$dir/gcloud.log" 2>&1 && mv -f "$dir/cache.syncing" "$dir/cache.synced"
}

# multihost's hook first on the path, as with run: a bare jax.distributed.initialize() finds
# the job from the JAX_* variables above; SIGUSR2 dumps every thread's stack into hook/
mkdir -p "$dir/hook" && printf '%s' "$hook" > "$dir/hook/sitecustomize.py"
MULTIHOST_STACK_DIR=$dir/hook
export MULTIHOST_STACK_DIR
eval "$user_env"
# after the job's --env, as run's job.sh does: a PYTHONPATH given there is kept, behind the hook
PYTHONPATH=$MULTIHOST_STACK_DIR${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH

# --secret KEY=NAME: each value read from Secret Manager into the job's shell only (a pipe
# into a variable: no file, no command line, no log); the job's processes alone inherit it.
read_secrets() {
  for s in $secrets; do
    v=$(gcloud secrets versions access latest --secret "${s#*=}" \
      ${project:+--project "$project"}) || {
      note "could not read secret ${s#*=} from Secret Manager (for ${s%%=*})"
      return 1
    }
    export "${s%%=*}=$v"
  done
}

(cd "$code" && { read_secrets || exit 123; } && exec sh -c "$command") \
  < /dev/null >> "$log" 2>&1 &
pid=$!
echo "$workers $num_slices $(date +%s)" > "$dir/started"
put "$dir/started" "$remote.started"

# A preemption's notice (the metadata server's instance/preempted turns TRUE seconds before
# the VM stops) sends the log at once: an attempt preempted before its first LOG_INTERVAL keeps
# its log. One quick look a second, never retried: a metadata server that does not answer is
# not a notice.
noticed() {
  [ "$(curl -sf --max-time 1 -H 'Metadata-Flavor: Google' \
    "http://$md_host/computeMetadata/v1/instance/preempted" 2> /dev/null)" = TRUE ]
}

upload_loop() {
  last=-1
  notice=
  while [ ! -e "$dir/stop-uploads" ]; do
    i=0
    while [ "$i" -lt "$log_interval" ] && [ ! -e "$dir/stop-uploads" ]; do
      sleep 1
      i=$((i + 1))
      if [ -z "$notice" ] && noticed; then
        notice=1
        note "preemption notice: the log so far sent"
        break
      fi
    done
    size=$(wc -c < "$log")
    if [ "$size" != "$last" ]; then
      put "$log" "$remote.log" && last=$size
    fi
    sync_cache
  done
}
rm -f "$dir/stop-uploads"
upload_loop &
uploader=$!
wait "$pid"
rc=$?
: > "$dir/stop-uploads"
wait "$uploader"
sync_cache
report_exit "$rc"
