#!/bin/sh
# Instructions per record on the ring's hot paths (see hot_path.rs), under callgrind.
# Usage: ringbuf/examples/hot_path.sh [callgrind output file]
set -eu
out=${1:-/tmp/weir-hot-path.callgrind}
cargo build --release -q -p weir-ring --example hot_path
target=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
valgrind --tool=callgrind --callgrind-out-file="$out" "$target/release/examples/hot_path" 2>/dev/null
records=$("$target/release/examples/hot_path" | sed -n '1s/.*batched \([0-9]*\) records.*/\1/p')
callgrind_annotate --threshold=100 --inclusive=yes "$out" 2>/dev/null \
  | grep -E '^ *[0-9,]+ .*hot_path::(produce|consume)_(batch|read_batch|single|frame|frame_read_batch|frame_read_runs|frame_run|frame_runs_typed|rtrb|lone)_[0-9]+ \[' \
  | sed -E 's/^ *([0-9,]+) .*hot_path::([a-z_0-9]+) .*/\2 \1/' | tr -d , | sort -u \
  | awk -v n="$records" '{ d = ($1 ~ /^(produce_batch|consume_single)/) ? 2 * n : ($1 ~ /^produce_frame_[0-9]/) ? 3 * n : n; printf "%-28s %6.1f instructions/record\n", $1, $2 / d }'
