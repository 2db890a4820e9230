// SPDX-License-Identifier: Apache-2.0
// The 8x8 handwritten digits set (UCI "optdigits" test part, 1,797 images)
// as scikit-learn ships it: sklearn/datasets/data/digits.csv.gz, one image
// per line, 64 pixel values 0..16 (row-major 8x8) and then the label 0..9,
// comma-separated. Nothing here depends on libtorch or Strata's strategies.
//
// load_digits reads the file (gzip-compressed or plain: the gzip magic
// decides) and scales the pixels to [0, 1]. Every error is a strata::Error
// naming the file and, for a bad row, its line and column: NotFoundError
// for a file that cannot be opened, InvalidArgumentError for a malformed
// row or an empty file, DataLossError for a corrupt gzip stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::examples {

constexpr std::int64_t kDigitsPixels = 64;
constexpr std::int64_t kDigitsClasses = 10;

struct DigitsData {
  std::vector<float> x;         // rows * kDigitsPixels, in [0, 1]
  std::vector<std::int64_t> y;  // rows, in [0, kDigitsClasses)
  std::int64_t rows() const { return static_cast<std::int64_t>(y.size()); }
};

/// Read `path` (see above). Blocking; decompresses through `gzip -dc`.
DigitsData load_digits(const std::string& path);

/// A fixed train/test split: the rows are permuted by a Fisher-Yates shuffle
/// driven by std::mt19937_64(split_seed) (the same on every platform and
/// process), the first rows()/5 of the permutation are the test set, the
/// rest the training set (both keep the permutation's order).
struct DigitsSplit {
  DigitsData train, test;
};
DigitsSplit split_digits(const DigitsData& all, std::uint64_t split_seed);

}  // namespace strata::examples
