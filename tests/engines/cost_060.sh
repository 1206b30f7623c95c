#!/bin/sh
# A claude-shaped JSON engine that takes a moment and costs $0.60 a turn.
cat > /dev/null
sleep 0.5
printf '{"type":"result","result":"ok","is_error":false,"total_cost_usd":0.6}\n'
