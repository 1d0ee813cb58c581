#!/bin/sh
# Open MPI's rsh agent for the interop guest (interop.py mpi): mpirun on the host calls it
# as it would call ssh. A guest tool too: the guest's orted checks that the agent's path
# exists.
exec python3 "$UROCE_INTEROP_PY" rsh "$@"
