#!/bin/sh
# Starts a grandchild in its own group's process tree, records its pid, then waits
# far longer than the test's timeoutSecs.
cat > /dev/null
sleep 300 &
echo $! > "$PID_FILE"
wait
