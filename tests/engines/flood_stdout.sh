#!/bin/sh
# Prints about 10 MB to stdout.
cat > /dev/null
head -c 10000000 /dev/zero | tr '\0' 'x'
