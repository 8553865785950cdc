# shellcheck shell=sh
# A warm set's server (warm_server.py, from stdin) into the run's directory, claimed already,
# where its command finds it ($MULTIHOST_RUN_DIR/warm_server.py).
# Arguments: RUN.
r=$1
set -e
umask 077
cat > "$r"/warm_server.py.tmp
mv -f "$r"/warm_server.py.tmp "$r"/warm_server.py
