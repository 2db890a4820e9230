#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs this build of Strata into a temporary prefix, builds
# sdk/examples as a separate CMake project with find_package(Strata), and
# checks that the installed strata-info loads the results (and finds the
# installed in-tree plugins next to the installed libstrata_core).
#   sdk_install_test.sh BUILD_DIR SOURCE_DIR [SANITIZE_FLAGS]
set -euo pipefail
build=$1 src=$2 sanitize=${3:-}
work=$(mktemp -d /tmp/strata_sdk_install.XXXXXX)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
extra=()
if [[ -n $sanitize ]]; then
  extra+=("-DCMAKE_C_FLAGS=-fsanitize=$sanitize" "-DCMAKE_CXX_FLAGS=-fsanitize=$sanitize"
          "-DCMAKE_MODULE_LINKER_FLAGS=-fsanitize=$sanitize")
fi
cmake -S "$src/sdk/examples" -B "$work/examples" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" "${extra[@]}" >"$work/configure.log" \
  || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/examples" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

info="$work/prefix/bin/strata-info"
STRATA_PLUGIN_PATH="$work/examples/plugins" "$info" --json >"$work/info.json"
python3 - "$work/info.json" "$work/prefix" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
prefix = sys.argv[2]
rows = {(p["kind"], p["name"]): p for p in doc["plugins"]}
def need(kind, name, where):
    row = rows.get((kind, name))
    assert row is not None, f"{kind} '{name}' not listed by the installed strata-info: {doc}"
    assert row["status"] == "ok", f"{kind} '{name}' rejected: {row}"
    assert where in row["path"], f"{kind} '{name}' loaded from {row['path']}, expected under {where}"
need("cluster_resolver", "env_example", "/examples/plugins/")
need("strategy", "example_threads", "/examples/plugins/")
need("strategy", "mirrored", prefix + "/lib")
bad = [p for p in doc["plugins"] if p["status"] != "ok"]
assert not bad, f"rejected plugins in a clean install: {bad}"
print("sdk install test: ok,", len(doc["plugins"]), "components")
PY
# Only the entry symbol is exported by the out-of-tree plugins too.
for so in "$work"/examples/plugins/*.so; do
  syms=$(nm -D --defined-only "$so" | awk '{print $3}' | grep -vE '^(_init|_fini|_edata|_end|__bss_start)$' || true)
  [[ "$syms" == "strata_plugin_entry_v1" ]] || { echo "$so exports: $syms"; exit 1; }
done
# The out-of-tree strategy runs the unchanged training loop of the installed strata-train.
cat >"$work/job.json" <<'JSON'
{"strategy": {"name": "example_threads", "options": {"replicas": 3}}}
JSON
out=$(STRATA_PLUGIN_PATH="$work/examples/plugins" timeout 300 "$work/prefix/bin/strata-train" \
        --config "$work/job.json" --steps 5 --quiet 2>&1) || { echo "$out"; exit 1; }
grep -q "with example_threads on 3 replica(s)" <<<"$out" || { echo "unexpected output: $out"; exit 1; }
echo "sdk install test: strata-train ran with the out-of-tree strategy"
