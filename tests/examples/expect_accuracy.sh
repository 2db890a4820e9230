#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Run "$@" (with its own deadline), print its output, and pass when it
# exited 0 and printed "test accuracy: " with a value of at least 0.9.
out=$("$@" 2>&1)
st=$?
printf '%s\n' "$out"
if [ "$st" -ne 0 ]; then
  echo "expect_accuracy: '$*' exited with status $st" >&2
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq 'test accuracy: (0\.9|1\.0)'; then
  echo "expect_accuracy: no 'test accuracy: ' of at least 0.9 in the output" >&2
  exit 1
fi
