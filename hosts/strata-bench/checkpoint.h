// SPDX-License-Identifier: Apache-2.0
// strata-bench checkpoint: strata::Checkpoint save and restore throughput
// against plain sequential write(2) and read(2) of the same byte count,
// measured in the same run.
//
// K float32 Variables (--variables, default 8) totalling --size-mb MiB are
// created under the Default strategy and tracked by one Checkpoint. Every
// file goes into a fresh directory made inside --dir (default $TMPDIR) and
// removed afterwards. Then, --repeats times, each pair in alternating order
// (odd repeats run the plain side first):
//   save        Checkpoint::save into a new directory (every fsync and the
//               rename included)           vs  write(2) of the tensor file's
//               byte count in 8 MiB calls from one buffer, then fsync(2);
//   warm read   Checkpoint::restore right after the save (the file is in the
//               page cache)                vs  read(2) of the tensor file in
//               8 MiB calls into one buffer (also shown: into a new buffer
//               of the file's size, which is what keeping the bytes costs:
//               restore must stage them until the whole file is checked);
//   cold read   the same two, each after fsync + posix_fadvise(DONTNEED) of
//               the checkpoint's files (so the bytes come from the disk; the
//               share of the file still resident is measured with mincore(2)
//               and printed).
// Both reads hint POSIX_FADV_SEQUENTIAL; restore also asks the kernel to
// read 64 MiB ahead of it (POSIX_FADV_WILLNEED), which the plain loop does
// not: that is part of what is measured.
// Medians are reported in MB/s (10^6 bytes per second of tensor file) with
// the ratio checkpoint / plain. After every restore the variables' bytes are
// compared (CRC32C) with what was saved; any difference fails the run. The
// load average (as `uptime` prints it) is read before and after: these
// machines are shared, so a figure means little without it.
#pragma once

#include <cstdint>
#include <string>

namespace strata::bench {

struct CheckpointBenchOptions {
  std::int64_t size_mb = 1024;  ///< total bytes of the variables (MiB)
  int variables = 8;            ///< float32 variables sharing them
  std::string dir;              ///< where to write ("" = the temp directory)
  int repeats = 3;
  bool json = false;
};

/// Run the benchmark; prints a table, or with o.json exactly one JSON
/// object. Returns 0, or 1 when a restore gave other bytes than were saved.
/// Throws strata::Error for bad options and I/O failures.
int run_checkpoint_bench(const CheckpointBenchOptions& o);

}  // namespace strata::bench
