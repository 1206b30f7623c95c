#!/bin/sh
# Reads the prompt, appends a line to $CALLS_FILE (if set), then waits until the file
# $GATE exists, the test's signal that the turn may finish, and answers. The wait is
# bounded (about 60 s) so that a test that failed before opening the gate leaves no
# engine behind.
prompt=$(cat)
if [ -n "$CALLS_FILE" ]; then echo call >> "$CALLS_FILE"; fi
i=0
while [ ! -e "$GATE" ] && [ "$i" -lt 1200 ]; do
  sleep 0.05
  i=$((i + 1))
done
printf 'gated: %s\n' "$prompt"
