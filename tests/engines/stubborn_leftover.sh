#!/bin/sh
# Reads the prompt, starts a child that leaves the engine's process group (setsid),
# ignores SIGTERM and SIGHUP and writes its pid to $PID_FILE, then answers "left" after
# $ENGINE_SECONDS (default 1) seconds. The child sleeps about 60 s, so that a failed
# test leaves it behind for a bounded time only.
cat > /dev/null
setsid sh -c 'trap "" TERM HUP; echo $$ > "$PID_FILE.tmp"; mv "$PID_FILE.tmp" "$PID_FILE"; exec sleep 60' \
    < /dev/null > /dev/null 2>&1 &
while [ ! -s "$PID_FILE" ]; do sleep 0.01; done
sleep "${ENGINE_SECONDS:-1}"
echo left
