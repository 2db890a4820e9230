#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Exit 0 when every failed test in a CTest LastTest.log failed only because
the sanitizer runtime could not map its own memory, so .ci/test may run
those tests once more. Any other failure exits 1. Seen with GCC 12's
libtsan: "ThreadSanitizer failed to allocate 0x1ed3000085000 bytes at
address 100001092000 (errno: 12)", a shadow range past the end of the
address space, in about 1 of 30 runs of one ring test and once per full
TSan run; with ASLR off (setarch -R) just as often. The test never got to
run its code, so this is a runtime fault, not a result.
  runtime-could-not-map.py BUILD/Testing/Temporary/LastTest.log"""
import re
import sys

RUNTIME = re.compile(
    r"(Thread|Address|Leak|Memory)Sanitizer(: | )(failed to allocate 0x[0-9a-f]+ "
    r"\(\d+\) bytes|unexpected memory mapping)")
MAX_RETRIED = 3

text = open(sys.argv[1], errors="replace").read()
blocks = re.split(r"\n(?=\d+/\d+ Testing: )", text)
failed = [b for b in blocks if "\nTest Failed." in b or "\nTest Failed" in b]
if not failed:
    sys.exit(1)
for block in failed:
    name = block.split("\n", 1)[0]
    if not RUNTIME.search(block):
        print(f"not a sanitizer runtime mapping failure: {name}")
        sys.exit(1)
    print(f"sanitizer runtime could not map memory: {name}")
sys.exit(0 if len(failed) <= MAX_RETRIED else 1)
