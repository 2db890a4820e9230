#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# expect_accuracy.sh for a program that says where its replicas run
# ("... replica(s): gpu:0 ..."): skipped (status 77) when it ran on the host
# because no GPU is visible, failed when it ran on a GPU but did not learn.
here=$(dirname "$0")
out=$(sh "$here/expect_accuracy.sh" "$@" 2>&1)
st=$?
printf '%s\n' "$out"
if printf '%s\n' "$out" | grep -q 'replica(s): cpu:'; then
  echo "expect_gpu: skipped: the program ran on the host (no GPU visible)"
  exit 77
fi
if ! printf '%s\n' "$out" | grep -q 'replica(s): gpu:0'; then
  echo "expect_gpu: the program did not say it ran on gpu:0" >&2
  exit 1
fi
exit $st
