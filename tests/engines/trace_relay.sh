#!/bin/sh
# Engine for the trace tests: hands its prompt to each instance of $RELAY_TO in turn
# with `loopbus talk`, which joins this turn's trace from the environment (with
# ONLY_TRACEPARENT=1 it sees TRACEPARENT alone, as an OpenTelemetry-only tool would
# pass it on), whatever their outcome; then answers as a JSON engine that cost $COST.
# $LOOPBUS_BIN is the binary under test (set via engine.env).
prompt=$(cat)
if [ "$ONLY_TRACEPARENT" = 1 ]; then
    unset LOOPBUS_TRACE_ID LOOPBUS_REQUEST_ID
fi
for target in $RELAY_TO; do
    "$LOOPBUS_BIN" talk "$target" "$prompt" --timeout 30 > /dev/null 2>&1
done
printf '{"type":"result","result":"relayed","is_error":false,"total_cost_usd":%s,"usage":{"input_tokens":10,"output_tokens":2,"cache_read_input_tokens":1}}\n' "$COST"
