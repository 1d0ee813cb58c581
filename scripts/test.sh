#!/usr/bin/env bash
# Sets up and builds (scripts/setup.sh), then runs the whole test suite.
# Extra arguments go to ctest, e.g. scripts/test.sh -R conformance -j2
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh

exec ctest --test-dir build --output-on-failure --timeout 300 "$@"
