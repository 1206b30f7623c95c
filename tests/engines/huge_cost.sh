#!/bin/sh
# A JSON engine that reports an absurd cost ($1e308) for every turn.
cat > /dev/null
printf '{"type":"result","result":"ok","is_error":false,"total_cost_usd":1e308,"usage":{"input_tokens":1}}\n'
