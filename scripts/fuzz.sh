#!/usr/bin/env bash
# Runs every libFuzzer target of wasm-filter/fuzz (the core) and
# lua-shim/fuzz (the shim's wire transport) for FUZZ_SECONDS each (default
# 600), one after the other, starting from the committed seeds and the
# local working corpus (which it grows). A crash, a panic, an input slower
# than 10 s or an RSS over 2 GiB fails the run and leaves the input in
# <project>/artifacts/<target>/; in the core's targets, so does a stack
# overflow on the hosts' 512 KiB stack or an allocation over 64 MiB.
#
# FUZZ_TARGETS="json wire" limits the run to those targets. FUZZ_CI=1 (the
# short runs in `make test`) starts from the seeds alone with a fixed seed,
# so that a run depends on the commit only, not on what earlier local runs
# found.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-600}"
projects=(wasm-filter/fuzz lua-shim/fuzz)
# One target directory for both projects: the dependencies they share are
# built once.
target_dir="$PWD/wasm-filter/fuzz/target"
# -s none: the code under test is safe Rust, so a sanitizer would only
# slow it down; -a: debug assertions and overflow checks, so that
# arithmetic overflow is a crash too.
flags=(-s none -a --target-dir "$target_dir")
for project in "${projects[@]}"; do
  cargo +nightly fuzz build --fuzz-dir "$project" "${flags[@]}"
done

# The harness must catch what it is for: a panic, a stack overflow and a
# runaway allocation each end its check target with a saved input.
triple="$(rustc -vV | sed -n 's/^host: //p')"
check="$target_dir/$triple/release/harness_check"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for input in panic stack alloc; do
  printf '%s' "$input" >"$scratch/$input"
  if "$check" -artifact_prefix="$scratch/crash-" "$scratch/$input" >"$scratch/log" 2>&1 \
      || ! grep -q 'deadly signal' "$scratch/log"; then
    cat "$scratch/log" >&2
    echo "fuzz harness: a $input did not crash the check target" >&2
    exit 1
  fi
done

# Each project's targets, as "project target" lines; a project that lists
# none fails the run rather than being skipped.
all=()
for project in "${projects[@]}"; do
  listed="$(cargo +nightly fuzz list --fuzz-dir "$project")"
  found=0
  for target in $listed; do
    [[ "$target" == harness_check ]] && continue
    all+=("$project $target")
    found=1
  done
  if [[ "$found" == 0 ]]; then
    echo "fuzz: $project lists no target" >&2
    exit 1
  fi
done
# FUZZ_TARGETS must name targets that exist: a misspelt one fails.
for wanted in ${FUZZ_TARGETS:-}; do
  if ! printf '%s\n' "${all[@]}" | grep -qx ".* $wanted"; then
    echo "fuzz: no target named $wanted" >&2
    exit 1
  fi
done

extra=()
for entry in "${all[@]}"; do
  project="${entry% *}"
  target="${entry#* }"
  if [[ -n "${FUZZ_TARGETS:-}" && " $FUZZ_TARGETS " != *" $target "* ]]; then
    continue
  fi
  if [[ "${FUZZ_CI:-}" == 1 ]]; then
    corpus="$scratch/corpus-$target"
    log="$scratch/$target.log"
    extra=(-seed=1)
  else
    corpus="$project/corpus/$target"
    log="$project/corpus/$target.log"
  fi
  mkdir -p "$corpus" "$project/corpus"
  echo "fuzz $target: ${seconds} s" >&2
  if ! cargo +nightly fuzz run --fuzz-dir "$project" "${flags[@]}" "$target" "$corpus" "$project/seeds/$target" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz $target FAILED: the input is in $project/artifacts/$target/" >&2
    exit 1
  fi
  # The last status line: executions, coverage, corpus size.
  grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 | sed "s/^/fuzz $target: /" >&2
done
