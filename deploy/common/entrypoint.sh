#!/bin/sh
# Entry point of the moss-gateway images.
#
# The admin token arrives as a file (a compose secret under /run/secrets), not as a variable in
# the container's configuration: when MOSS_GATEWAY_SERVER__ADMIN_TOKEN_FILE names a readable file,
# its first line becomes MOSS_GATEWAY_SERVER__ADMIN_TOKEN for the command (the gateway reads it
# through service.settings; `moss-gateway qualify` sends it to the gateway's admin routes).
set -eu
token_file=${MOSS_GATEWAY_SERVER__ADMIN_TOKEN_FILE:-}
if [ -n "$token_file" ]; then
  if [ ! -r "$token_file" ]; then
    echo "entrypoint: MOSS_GATEWAY_SERVER__ADMIN_TOKEN_FILE=$token_file is not readable by uid $(id -u)" >&2
    exit 64
  fi
  IFS= read -r token < "$token_file" || true
  if [ -z "${token:-}" ]; then
    echo "entrypoint: $token_file is empty" >&2
    exit 64
  fi
  MOSS_GATEWAY_SERVER__ADMIN_TOKEN=$token
  export MOSS_GATEWAY_SERVER__ADMIN_TOKEN
  unset token
fi
unset MOSS_GATEWAY_SERVER__ADMIN_TOKEN_FILE
exec "$@"
