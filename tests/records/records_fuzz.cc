// SPDX-License-Identifier: Apache-2.0
// libFuzzer target for the record file reader: any bytes, read both strictly
// and with skip_corrupt, with a small buffer so records span refills. Strict
// reading must return records until the end or throw DATA_LOSS naming an
// offset inside the file; skip mode must never throw; both must agree on the
// records before the first corruption. Anything else aborts.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "strata/error.hpp"
#include "strata/sdk/records.hpp"

namespace {

std::string scratch_file() {
  static const std::string path = [] {
    char tmpl[] = "/tmp/records_fuzz_XXXXXX";
    const int fd = ::mkstemp(tmpl);
    if (fd < 0) std::abort();
    ::close(fd);
    return std::string(tmpl);
  }();
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = scratch_file();
  {
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size)) std::abort();
    std::fclose(f);
  }
  std::vector<std::vector<uint8_t>> strict;
  for (const bool read_ahead : {false, true}) {
    strata::sdk::RecordReaderOptions o;
    o.buffer_bytes = 4096;
    o.read_ahead = read_ahead;
    std::vector<std::vector<uint8_t>> got;
    try {
      strata::sdk::RecordReader r(path, o);
      std::vector<uint8_t> rec;
      while (r.next(rec)) {
        if (r.record_offset() + 16 + rec.size() > size) std::abort();  // a record past the end of the file
        got.push_back(rec);
      }
    } catch (const strata::Error& e) {
      if (e.code() != STRATA_ERR_DATA_LOSS) std::abort();
      if (std::string(e.what()).find("offset") == std::string::npos) std::abort();
    }
    if (!read_ahead) strict = got;
    else if (got != strict) std::abort();  // both reading modes agree
  }
  strata::sdk::RecordReaderOptions skip;
  skip.skip_corrupt = true;
  skip.buffer_bytes = 4096;
  try {
    strata::sdk::RecordReader r(path, skip);
    std::vector<uint8_t> rec;
    std::size_t n = 0;
    while (r.next(rec)) {
      if (n < strict.size() && rec != strict[n]) std::abort();  // skipping changes nothing before the damage
      ++n;
    }
    if (n < strict.size()) std::abort();
  } catch (const strata::Error&) {
    std::abort();  // skip mode never throws for damaged data
  }
  return 0;
}
