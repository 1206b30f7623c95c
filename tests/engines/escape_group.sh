#!/bin/sh
# Starts a child that leaves the engine's process group (setsid) and appends its pid to
# $PID_FILE. With HOLD_PIPES=1 the child keeps the engine's stdout and stderr open;
# otherwise it lets go of them. Replies "escaped".
cat > /dev/null
lines() { if [ -f "$PID_FILE" ]; then wc -l < "$PID_FILE"; else echo 0; fi; }
before=$(lines)
if [ "$HOLD_PIPES" = 1 ]; then
    setsid sh -c 'echo $$ >> "$PID_FILE"; exec sleep 60' &
else
    setsid sh -c 'echo $$ >> "$PID_FILE"; exec sleep 60' > /dev/null 2>&1 < /dev/null &
fi
# Exit only once the child is on its own, so that it is there to be left behind.
while [ "$(lines)" -le "$before" ]; do sleep 0.01; done
echo escaped
