// SPDX-License-Identifier: Apache-2.0
#include "digits_data.h"

#include <sys/wait.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "strata/error.hpp"

namespace strata::examples {
namespace {

// Single-quoted for /bin/sh: a path may hold spaces or quotes.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The whole file, decompressed when it starts with the gzip magic. Strata
// does not link zlib, and one small file does not justify a new dependency:
// gzip(1) is on every Debian system (Essential: yes).
std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    STRATA_THROW(STRATA_ERR_NOT_FOUND, "cannot open the digits file '", path, "': ", std::strerror(errno),
                 "; fetch it with .ci/get-digits DIR (from Debian's python3-sklearn) and pass --data "
                 "DIR/digits.csv.gz or set STRATA_DIGITS");
  char magic[2] = {};
  in.read(magic, 2);
  const bool gz = in.gcount() == 2 && static_cast<unsigned char>(magic[0]) == 0x1f &&
                  static_cast<unsigned char>(magic[1]) == 0x8b;
  in.seekg(0);
  std::string text;
  if (!gz) {
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return text;
  }
  in.close();
  const std::string cmd = "gzip -dc -- " + shell_quote(path) + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr)
    STRATA_THROW(STRATA_ERR_INTERNAL, "cannot run '", cmd, "' to read '", path, "': ", std::strerror(errno));
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
  const int st = ::pclose(p);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) == 127)
    STRATA_THROW(STRATA_ERR_INTERNAL, "cannot run gzip to decompress '", path, "' (", cmd,
                 "); install gzip or pass the decompressed CSV");
  // gzip exits 2 for a warning only (e.g. trailing garbage); 1 is an error.
  if (WEXITSTATUS(st) == 1)
    STRATA_THROW(STRATA_ERR_DATA_LOSS, "'", path, "' is not a valid gzip file (gzip -dc failed after ", text.size(),
                 " bytes); fetch it again with .ci/get-digits");
  return text;
}

[[noreturn]] void bad_row(const std::string& path, std::size_t line, const std::string& why) {
  STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, path, ":", line, ": ", why,
               "; expected 65 comma-separated numbers per line (64 pixels 0..16, then the label 0..9), as in "
               "scikit-learn's digits.csv.gz");
}

}  // namespace

DigitsData load_digits(const std::string& path) {
  const std::string text = read_text(path);
  DigitsData d;
  std::size_t line_no = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank (e.g. a trailing newline)
    std::size_t col = 0;
    const char* s = line.c_str();
    for (;;) {
      ++col;
      if (col > kDigitsPixels + 1) bad_row(path, line_no, "more than 65 values");
      char* stop = nullptr;
      errno = 0;
      const double v = std::strtod(s, &stop);
      while (stop != nullptr && (*stop == ' ' || *stop == '\t')) ++stop;
      if (stop == s || errno != 0 || !std::isfinite(v) || (*stop != ',' && *stop != '\0'))
        bad_row(path, line_no, "column " + std::to_string(col) + " is not a number");
      if (col <= static_cast<std::size_t>(kDigitsPixels)) {
        if (v < 0 || v > 16)
          bad_row(path, line_no, "pixel " + std::to_string(col) + " is " + std::to_string(v) + ", outside 0..16");
        d.x.push_back(static_cast<float>(v / 16.0));
      } else {
        if (v != std::floor(v) || v < 0 || v >= kDigitsClasses)
          bad_row(path, line_no, "the label (column 65) is " + std::to_string(v) + ", not an integer 0..9");
        d.y.push_back(static_cast<std::int64_t>(v));
      }
      if (*stop == '\0') break;
      s = stop + 1;
    }
    if (col != static_cast<std::size_t>(kDigitsPixels) + 1)
      bad_row(path, line_no, "only " + std::to_string(col) + " values");
  }
  if (d.y.empty())
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "the digits file '", path, "' holds no rows");
  return d;
}

DigitsSplit split_digits(const DigitsData& all, std::uint64_t split_seed) {
  const std::int64_t n = all.rows();
  std::vector<std::int64_t> perm(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) perm[static_cast<std::size_t>(i)] = i;
  // Fisher-Yates by hand: std::shuffle's algorithm is unspecified, so its
  // order could differ between standard libraries.
  std::mt19937_64 rng(split_seed);
  for (std::int64_t i = n - 1; i > 0; --i)
    std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(rng() % static_cast<std::uint64_t>(i + 1))]);
  DigitsSplit out;
  const std::int64_t n_test = n / 5;
  for (std::int64_t k = 0; k < n; ++k) {
    const std::size_t r = static_cast<std::size_t>(perm[static_cast<std::size_t>(k)]);
    DigitsData& dst = k < n_test ? out.test : out.train;
    dst.x.insert(dst.x.end(), all.x.begin() + static_cast<std::ptrdiff_t>(r * kDigitsPixels),
                 all.x.begin() + static_cast<std::ptrdiff_t>((r + 1) * kDigitsPixels));
    dst.y.push_back(all.y[r]);
  }
  return out;
}

}  // namespace strata::examples
