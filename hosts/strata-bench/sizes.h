// SPDX-License-Identifier: Apache-2.0
// Size lists for benchmarks: "4K:64M" (a doubling range) or "4096,16M,1G"
// (a comma list). Suffixes K, M, G are powers of 1024.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::bench {

/// Parse one size ("4096", "4K", "16M", "1G"). Throws InvalidArgumentError
/// naming the text and the accepted forms.
std::uint64_t parse_size(const std::string& text);
/// Parse a doubling range "A:B" or a comma list. Throws InvalidArgumentError.
std::vector<std::uint64_t> parse_sizes(const std::string& text);
/// "4K", "16M", "1000" — the shortest exact form.
std::string format_size(std::uint64_t bytes);

}  // namespace strata::bench
