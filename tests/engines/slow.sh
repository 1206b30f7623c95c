#!/bin/sh
# Answers after SLOW_SECS seconds (default 2).
prompt=$(cat)
sleep "${SLOW_SECS:-2}"
printf 'slow: %s\n' "$prompt"
