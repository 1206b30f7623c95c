#!/bin/sh
# A claude-shaped JSON engine: replies with the prompt, costs $0.40 a turn, and
# appends one line to $CALLS_FILE per call so tests can count calls.
prompt=$(cat)
[ -n "$CALLS_FILE" ] && echo call >> "$CALLS_FILE"
printf '{"type":"result","result":"ok: %s","is_error":false,"total_cost_usd":0.4,"usage":{"input_tokens":100,"output_tokens":20,"cache_read_input_tokens":7}}\n' "$prompt"
