// SPDX-License-Identifier: Apache-2.0
// strata-bench input: records read and verified per second through the
// "records" input pipeline plugin, against plain sequential read speed of
// the same file, measured in the same run.
//
// The file is written with strata::RecordWriter into a fresh temporary
// directory (removed afterwards) unless --file names one to reuse (written
// there if it does not exist, kept either way). Then, --repeats times, in
// alternation: (1) read() the file in 1 MiB blocks into one buffer, (2)
// `cat FILE > /dev/null` as a child process, (3) open the pipeline and pull
// every element through its next() (the real path: large reads, both CRCs,
// one fresh tensor per record). Medians are reported. The element count and
// the payload bytes must equal what the file holds, or the run fails.
// Both reads come from the page cache once the file has been read once, so
// the comparison is of CPU work (syscall + copy vs. syscall + copy + CRC +
// per-record tensor); a cold-cache comparison needs the caches dropped
// between runs, which needs root.
#pragma once

#include <cstdint>
#include <string>

namespace strata::bench {

struct InputBenchOptions {
  std::int64_t size_mb = 1024;       ///< file size to write (MiB)
  std::int64_t record_bytes = 4096;  ///< payload bytes per record
  std::string file;                  ///< reuse / keep this file ("" = temporary)
  int repeats = 3;
  std::int64_t buffer_bytes = 4 << 20;  ///< the pipeline's buffer_bytes option
  bool json = false;
};

/// Run the benchmark; prints a table, or with o.json exactly one JSON
/// object. Returns 0, or 1 when the records read differ from those written.
/// Throws strata::Error for bad options and I/O failures.
int run_input_bench(const InputBenchOptions& o);

}  // namespace strata::bench
