#!/bin/sh
# Engine for the workflow tests (engine.output "json"): writes the prompt it got to
# $PROMPT_FILE and its trace and request ids to $TRACE_FILE, appends a line per run
# to $CALLS_FILE, then writes its pid to $PID_FILE, waits
# for the file $GATE when set (bounded, about 60 s), then fails with $FAIL on stderr
# (exit 3) when set (with $FAIL_COST also set: as a claude error costing that, exit 1),
# else answers $REPLY costing $0.25.
cat > "$PROMPT_FILE"
echo "$LOOPBUS_TRACE_ID $LOOPBUS_REQUEST_ID" > "$TRACE_FILE"
echo call >> "$CALLS_FILE"
echo $$ > "$PID_FILE"
i=0
while [ -n "$GATE" ] && [ ! -e "$GATE" ] && [ "$i" -lt 1200 ]; do
  sleep 0.05
  i=$((i + 1))
done
if [ -n "$FAIL" ] && [ -n "$FAIL_COST" ]; then
  # A CLI that spent before it failed: claude's error shape, with its cost.
  printf '{"type":"result","result":"%s","is_error":true,"total_cost_usd":%s,"usage":{"input_tokens":10,"output_tokens":2}}\n' "$FAIL" "$FAIL_COST"
  exit 1
fi
if [ -n "$FAIL" ]; then echo "$FAIL" >&2; exit 3; fi
printf '{"type":"result","result":"%s","is_error":false,"total_cost_usd":0.25,"usage":{"input_tokens":10,"output_tokens":2}}\n' "$REPLY"
