#!/bin/sh
# Engine for the chain tests (engine.command = ["/bin/sh", ".../relay.sh"]): forwards
# its prompt to the instance $RELAY_TO with `loopbus talk`, which inherits
# LOOPBUS_STATE_DIR, LOOPBUS_INSTANCE and LOOPBUS_DEPTH from this turn, and replies
# with what came back. $LOOPBUS_BIN is the binary under test (set via engine.env).
prompt=$(cat)
reply=$("$LOOPBUS_BIN" talk "$RELAY_TO" "$prompt" --timeout 30 --json)
status=$?
printf '%s at depth %s relayed (exit %s): %s' "$LOOPBUS_INSTANCE" "$LOOPBUS_DEPTH" "$status" "$reply"
