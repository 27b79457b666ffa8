#!/usr/bin/env bash
# A launcher of ranks that is not torchrun, as DeepSpeed's, Accelerate's or mpirun start theirs: runs the
# command once per rank with $RANK, $LOCAL_RANK and $WORLD_SIZE set, and exits with the first failure.
#   launch_ranks.sh N COMMAND...
set -u
ranks=$1
shift
pids=()
for ((rank = 0; rank < ranks; rank++)); do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$ranks "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid"
    code=$?
    if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then status=$code; fi
done
exit "$status"
