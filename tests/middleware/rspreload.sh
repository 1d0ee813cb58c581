#!/usr/bin/env bash
# Runs PROGRAM with librspreload (Debian's librdmacm1: socket calls become rsockets)
# appended to LD_PRELOAD, so that under `uroce run` liburoce stays first and answers the
# rsocket calls librspreload makes:
#   uroce run rspreload.sh LIBRSPRELOAD PROGRAM [ARGS...]
set -euo pipefail
lib=$1
shift
export LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD:}$lib"
exec "$@"
