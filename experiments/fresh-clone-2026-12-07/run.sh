#!/usr/bin/env bash
# Fresh-machine timing of the README's main command (issue 41): clean clone of main, empty kitune
# cache and pip cache, no ../shared beside it, compilers shimmed to log any invocation.
set -u
PIDS=$(pgrep -x llama-server || true)
resume() { for p in $PIDS; do kill -CONT "$p" 2>/dev/null && echo "resumed $p at $(date -u +%T)"; done; }
trap resume EXIT INT TERM
( sleep 1740; for p in $PIDS; do kill -CONT "$p" 2>/dev/null; done; echo "watchdog resumed $PIDS at $(date -u +%T)" ) &
WATCHDOG=$!
for p in $PIDS; do kill -STOP "$p" && echo "paused $p at $(date -u +%T)"; done
rm -rf /tmp/fresh/kitune /tmp/fresh/cache /tmp/fresh/pipcache /tmp/fresh/compiler.log
echo "clone start $(date -u +%T)"
git clone -q /work/main /tmp/fresh/kitune
echo "clone done $(date -u +%T) at $(git -C /tmp/fresh/kitune log --oneline -1)"
ls -d /tmp/fresh/shared 2>/dev/null && echo "UNEXPECTED ../shared"
cd /tmp/fresh/kitune
export KITUNE_CACHE=/tmp/fresh/cache PIP_CACHE_DIR=/tmp/fresh/pipcache PATH="/tmp/fresh/shims:$PATH"
START=$(date +%s)
bash scripts/demo.sh 2>&1
echo "demo.sh exit $? after $(( $(date +%s) - START )) s"
kill "$WATCHDOG" 2>/dev/null
