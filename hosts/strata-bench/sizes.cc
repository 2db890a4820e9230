// SPDX-License-Identifier: Apache-2.0
#include "sizes.h"

#include <cctype>
#include <sstream>

#include "strata/error.hpp"

namespace strata::bench {

std::uint64_t parse_size(const std::string& text) {
  std::size_t pos = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  std::string digits = text.substr(0, pos);
  const std::string suffix = text.substr(pos);
  std::uint64_t mult = 1;
  if (suffix == "K" || suffix == "k") mult = 1ull << 10;
  else if (suffix == "M" || suffix == "m") mult = 1ull << 20;
  else if (suffix == "G" || suffix == "g") mult = 1ull << 30;
  else if (!suffix.empty()) digits.clear();
  if (digits.empty() || digits.size() > 12)
    STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "bad size '", text,
                 "': use a number of bytes with an optional K, M or G suffix, e.g. 4096, 4K or 64M");
  return std::stoull(digits) * mult;
}

std::vector<std::uint64_t> parse_sizes(const std::string& text) {
  std::vector<std::uint64_t> out;
  const auto colon = text.find(':');
  if (colon != std::string::npos) {
    const std::uint64_t lo = parse_size(text.substr(0, colon)), hi = parse_size(text.substr(colon + 1));
    if (lo == 0 || lo > hi)
      STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "bad size range '", text,
                   "': use LOW:HIGH with 0 < LOW <= HIGH, e.g. 4K:64M (sizes double from LOW)");
    for (std::uint64_t s = lo; s <= hi; s *= 2) out.push_back(s);
    return out;
  }
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(parse_size(item));
  if (out.empty()) STRATA_THROW(STRATA_ERR_INVALID_ARGUMENT, "empty size list: pass e.g. --sizes 4K:64M or 4096,16M");
  return out;
}

std::string format_size(std::uint64_t bytes) {
  static const char* const kSuffix[] = {"", "K", "M", "G"};
  int i = 0;
  while (i < 3 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++i;
  }
  return std::to_string(bytes) + kSuffix[i];
}

}  // namespace strata::bench
