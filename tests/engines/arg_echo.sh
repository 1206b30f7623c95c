#!/bin/sh
# Replies with its last argument (prompt: "arg") and the LOOPBUS_* variables.
for last; do :; done
printf '%s|%s|%s|%s|%s\n' "$last" "$LOOPBUS_INSTANCE" "$LOOPBUS_FROM" "$LOOPBUS_DEPTH" "$(basename "$LOOPBUS_STATE_DIR")"
