# shellcheck shell=sh
# multihost top: what a run's processes are doing, every INTERVAL s, COUNT times (0: until the
# runner goes away and a write fails). Says once "top HZ PAGE CPUS" and "acc gpu|tpu|none";
# then each time "tick UPTIME", "run STATE" (running, exit CODE or missing), "mem TOTAL_KB
# AVAILABLE_KB", one "p PID STATE CPU_TICKS RSS_PAGES WATCH" line per live Python process of
# the run (its hook's <pid>.ready; WATCH: its <pid>.watch line, or -), "last LINE" (the log's
# last line, from its last 400 bytes) and "end". Builtins only in the loop, but for the sleep
# and the tail; a process is checked to be the run's (its environment names the run's hook
# dir) once. A GPU's figures come as nvidia-smi's own "INDEX, BUSY%, USED_MIB, TOTAL_MIB"
# lines, a TPU's as "tpu ..." lines from the Python text TPU (tpu-info's library), each from
# one process in the background (killed with the script) writing whole lines between ticks.
# Arguments: RUN (the run's dir; a leading ~ is expanded here) INTERVAL COUNT TPU.
r=$1
interval=$2
count=$3
tpu=$4
# shellcheck disable=SC2088 # a literal ~ from the runner, expanded here on purpose
case $r in "~") r=$HOME ;; "~/"*) r=$HOME/${r#"~/"} ;; esac
d=$r/hook
hz=$(getconf CLK_TCK 2>/dev/null) || hz=100
page=$(getconf PAGESIZE 2>/dev/null) || page=4096
cpus=$(getconf _NPROCESSORS_ONLN 2>/dev/null) || cpus=0
echo "top $hz $page $cpus"
acc=none
if command -v nvidia-smi >/dev/null 2>&1; then
  acc=gpu
else
  for f in /dev/accel[0-9]* /dev/vfio/[0-9]*; do [ -e "$f" ] && acc=tpu; done
fi
echo "acc $acc"
bg=
quit() { [ -z "$bg" ] || kill "$bg" 2>/dev/null; exit 0; }
trap quit PIPE HUP INT TERM
q=index,utilization.gpu,memory.used,memory.total
every=${interval%.*}
[ "${every:-0}" -ge 1 ] 2>/dev/null || every=1
if [ "$acc" = gpu ]; then
  if [ "$count" = 1 ]; then
    nvidia-smi --query-gpu=$q --format=csv,noheader,nounits 2>/dev/null
  else
    nvidia-smi --query-gpu=$q --format=csv,noheader,nounits -l "$every" 2>/dev/null &
    bg=$!
  fi
elif [ "$acc" = tpu ] && command -v python3 >/dev/null 2>&1; then
  if [ "$count" = 1 ]; then
    python3 -c "$tpu" "$every" 1 2>/dev/null
  else
    python3 -c "$tpu" "$every" 0 2>/dev/null &
    bg=$!
  fi
fi
nl='
'
mine='' others='' i=0
while :; do
  up=; read -r up _ < /proc/uptime
  echo "tick $up"
  if [ ! -d "$r" ]; then
    echo "run missing"
  elif [ -e "$r"/exit ]; then
    c=; { read -r c < "$r"/exit; } 2>/dev/null
    echo "run exit ${c:--}"
  else
    echo "run running"
  fi
  mt=- ma=-
  while read -r k v _; do
    case $k in MemTotal:) mt=$v ;; MemAvailable:) ma=$v; break ;; esac
  done < /proc/meminfo
  echo "mem $mt $ma"
  for m in "$d"/*.ready; do
    [ -e "$m" ] || continue
    p=${m##*/}; p=${p%.ready}
    s=; { read -r s < "/proc/$p/stat"; } 2>/dev/null || continue
    # the fields after the command's name (which may hold spaces): 3 (state) onwards
    # shellcheck disable=SC2086 # split into fields on purpose
    set -- ${s##*") "}
    key="$p:${20}"
    case " $mine " in
      *" $key "*) ;;
      *)
        case " $others " in *" $key "*) continue ;; esac
        if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qxF "MULTIHOST_STACK_DIR=$d"; then
          mine="$mine $key"
        else
          others="$others $key"; continue
        fi ;;
    esac
    w=-; { read -r w < "$d/$p.watch"; } 2>/dev/null
    printf 'p %s %s %s %s %s\n' "$p" "$1" $((${12} + ${13})) "${22}" "${w:--}"
  done
  l=
  [ ! -f "$r"/log ] || l=$(tail -c 400 "$r"/log 2>/dev/null)
  printf 'last %s\n' "${l##*"$nl"}"
  echo "end"
  i=$((i + 1))
  [ "$count" -gt 0 ] && [ "$i" -ge "$count" ] && break
  sleep "$interval"
done
quit
