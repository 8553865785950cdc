# shellcheck shell=sh source-path=SCRIPTDIR
# Cleaning. Removes this finished run's
# directory, then staged code dirs older than age that no remaining run's job.sh uses (and
# interrupted uploads older than incoming); prints each removed code hash. Kits (kit.sh) other
# than KIT older than incoming go too: a run needs its kit only while it is launched.
# Arguments: RUN BASE AGE INCOMING KIT (AGE, INCOMING: minutes; KIT: the kit's folder name).
r=$1
b=$2
age=$3
incoming=$4
kit=$5
if [ -e "$r" ]; then
  test -e "$r"/exit || { echo "$r is still running" >&2; exit 1; }
  rm -rf "$r"
fi
find "$b"/code -mindepth 1 -maxdepth 1 -type d \( ! -name ".*" -mmin +"$age" \
  -o -name ".incoming.*" -mmin +"$incoming" \) 2>/dev/null | while read -r d; do
  h=${d##*/}
  grep -rqsF --include=job.sh "/code/$h" "$b"/runs || { rm -rf "$d" && echo "$h"; }
done
find "$b"/kit -mindepth 1 -maxdepth 1 ! -name "$kit" -mmin +"$incoming" -exec rm -rf {} + \
  2>/dev/null
exit 0
