#!/bin/sh
# Writes about 4 MB to stderr before answering, then exits 0.
prompt=$(cat)
head -c 4000000 /dev/zero | tr '\0' 'e' >&2
printf 'quiet answer to %s\n' "$prompt"
