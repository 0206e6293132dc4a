#!/usr/bin/env bash
# Runs the tests that pass under Miri (docs/TESTING.md, "Miri"). Not part
# of .ci/run: interpreting them takes several minutes.
#
# Needs a nightly toolchain with Miri:
#   rustup toolchain install nightly --profile minimal --component miri
#
# Isolation stays on (no host files, clock or randomness). The proptest
# suites are skipped: each case is hundreds of operations, and even four
# cases run past several minutes under Miri; they also need isolation off
# (proptest calls getcwd to find its regression files).
set -euo pipefail
cd "$(dirname "$0")/.."

miri() {
  echo "+ cargo +nightly miri test $*"
  cargo +nightly miri test "$@"
}

miri -p epoch --lib
miri -p buddy --lib
miri -p buddy --test bad_frees
miri -p radix --test model -- --skip small_tree_matches_model --skip real_fanout_matches_model
miri -p refcache --test model -- --skip matches_true_counts
