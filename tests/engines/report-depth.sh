#!/bin/sh
# Engine for the chain tests: replies with who called at which depth, and the prompt.
prompt=$(cat)
printf '%s saw depth %s from %s: %s' "$LOOPBUS_INSTANCE" "$LOOPBUS_DEPTH" "$LOOPBUS_FROM" "$prompt"
