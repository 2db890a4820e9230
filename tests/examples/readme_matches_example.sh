#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The README shows examples/trainer/main.cc as its Model.fit program; this
# fails when the two drift apart, so the README's program is one that
# compiles and runs (the trainer_example tests build and run main.cc).
# Usage: readme_matches_example.sh README.md examples/trainer/main.cc
set -eu
readme=$1 example=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The README's ```cpp block that starts with the example's first comment line.
first=$(grep -v '^// SPDX' "$example" | head -n 1)
awk -v first="$first" '
  /^```cpp$/ { inblock = 1; started = 0; n = 0; next }
  inblock && /^```$/ { if (found) exit; inblock = 0; next }
  inblock { if (!started) { started = 1; if ($0 == first) found = 1 } if (found) print }
' "$readme" > "$tmp/readme.cc"
grep -v '^// SPDX' "$example" > "$tmp/example.cc"
if [ ! -s "$tmp/readme.cc" ]; then
  echo "README: no \`\`\`cpp block starting with: $first" >&2
  exit 1
fi
if ! diff -u "$tmp/example.cc" "$tmp/readme.cc"; then
  echo "README's Model.fit program differs from $example (diff above: - example, + README); copy one into the other" >&2
  exit 1
fi
echo "README's program is $example"
