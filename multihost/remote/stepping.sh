# shellcheck shell=sh
# multihost run --trace: how far the run's JAX processes on this host are. Prints "now T" (the
# host's clock), then "p PID STEPPING STEPPED BACKEND" for every live process of the run that
# imported jax ("-" for a mark not yet there); "finished" when its job has ended. Builtins
# only, but for the environ check of each process.
# Arguments: RUN (the run's dir; a leading ~ is expanded here).
r=$1
# shellcheck disable=SC2088 # a literal ~ from the runner, expanded here on purpose
case $r in "~") r=$HOME ;; "~/"*) r=$HOME/${r#"~/"} ;; esac
d=$r/hook
echo "now $(date +%s.%N)"
if [ -e "$r/exit" ]; then echo finished; exit 0; fi
for m in "$d"/*.trace-ready; do
  [ -e "$m" ] || continue
  p=${m##*/}; p=${p%.trace-ready}
  [ -d "/proc/$p" ] || continue
  tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qxF "MULTIHOST_STACK_DIR=$d" || continue
  s=; e=; b=
  { read -r s < "$d/$p.stepping"; } 2>/dev/null
  { read -r e < "$d/$p.stepped"; } 2>/dev/null
  { read -r b < "$d/$p.backend"; } 2>/dev/null
  echo "p $p ${s:--} ${e:--} ${b:--}"
done
