#!/bin/sh
# Fails quoting its prompt, as a confused engine might.
prompt=$(cat)
echo "error: cannot handle request: $prompt" >&2
exit 3
