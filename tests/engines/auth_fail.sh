#!/bin/sh
# An engine that is not logged in.
cat > /dev/null
echo "Invalid API key · Please run /login" >&2
exit 1
