// The tile enumeration of the grouped GEMM kernels (lib/nn/cuda/grouped_gemm_tiles.hpp), on the
// host: persistent CTAs walking their tile indices cover every output element exactly once
// (forward/dgrad grids with the padding rows, wgrad grids skipping empty groups), tile counts
// and partial tiles, the bound the grid is sized with, and offsets that break the rules.
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "nn/cuda/grouped_gemm_tiles.hpp"
#include "support/catch.hpp"

using namespace quintet::nn::cuda_ops::grouped;

namespace {

// (group, output row within the group, column) -> times covered, over every tile that `ctas`
// persistent CTAs find; also returns the number of tiles.
std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, int> cover(
    const std::vector<std::int64_t>& offsets, const TileGrid& grid, int ctas, std::int64_t& tiles) {
  const auto groups = static_cast<std::int64_t>(offsets.size()) - 1;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, int> seen;
  tiles = 0;
  for (int cta = 0; cta < ctas; ++cta) {
    TileWalker walker(offsets.data(), groups, grid);
    Tile t;
    for (std::int64_t index = cta; walker.find(index, t); index += ctas) {
      ++tiles;
      REQUIRE(t.tile_rows > 0);
      REQUIRE(t.tile_rows <= grid.tile_m);
      REQUIRE(t.tile_cols > 0);
      REQUIRE(t.tile_cols <= grid.tile_n);
      REQUIRE(t.m0 % grid.tile_m == 0);
      REQUIRE(t.n0 % grid.tile_n == 0);
      // The group's input rows lie inside the tensor.
      REQUIRE(t.first_row >= 0);
      REQUIRE(t.first_row + t.rows <= grid.total_rows);
      for (std::int64_t r = 0; r < t.tile_rows; ++r) {
        for (std::int64_t c = 0; c < t.tile_cols; ++c) ++seen[{t.group, t.m0 + r, t.n0 + c}];
      }
    }
  }
  return seen;
}

}  // namespace

TEST_CASE("forward/dgrad tiles cover each group's rows and the padding once", "[nn][grouped]") {
  struct Case {
    const char* name;
    std::vector<std::int64_t> offsets;
    std::int64_t rows, n;
  };
  const std::vector<Case> cases = {
      {"even", {0, 8, 16, 24}, 24, 16},
      {"empty groups and partial tiles", {0, 0, 5, 5, 13, 13}, 13, 11},
      {"one row", {0, 1}, 1, 3},
      {"skewed: every row in one group", {0, 0, 37, 37}, 37, 20},
      {"padding past the last group", {0, 3, 9}, 15, 7},
      {"no rows", {0, 0, 0}, 0, 5},
  };
  for (const Case& k : cases) {
    for (const int ctas : {1, 3, 64}) {
      DYNAMIC_SECTION(k.name << ", " << ctas << " CTAs") {
        TileGrid grid;
        grid.tile_m = 4;
        grid.tile_n = 8;
        grid.total_rows = k.rows;
        grid.n = k.n;
        grid.zero_tail = true;
        std::int64_t tiles = 0;
        const auto seen = cover(k.offsets, grid, ctas, tiles);
        const auto groups = static_cast<std::int64_t>(k.offsets.size()) - 1;
        // Expected: every (row, column) of every group, and of the padding as group G.
        std::int64_t expected_tiles = 0, elements = 0;
        for (std::int64_t g = 0; g <= groups; ++g) {
          const std::int64_t begin = k.offsets[g];
          const std::int64_t end = g < groups ? k.offsets[g + 1] : k.rows;
          const std::int64_t m = end - begin;
          expected_tiles += ceil_div(m, grid.tile_m) * ceil_div(k.n, grid.tile_n);
          for (std::int64_t r = 0; r < m; ++r) {
            for (std::int64_t c = 0; c < k.n; ++c) {
              INFO("group " << g << " row " << r << " col " << c);
              REQUIRE(seen.count({g, r, c}) == 1);
              REQUIRE(seen.at({g, r, c}) == 1);
              ++elements;
            }
          }
        }
        REQUIRE(static_cast<std::int64_t>(seen.size()) == elements);  // nothing else
        REQUIRE(tiles == expected_tiles);
        REQUIRE(tiles <= max_tiles(grid, groups));
        // Without zero_tail the padding has no tile.
        grid.zero_tail = false;
        std::int64_t tiles_no_tail = 0;
        for (const auto& [key, count] : cover(k.offsets, grid, ctas, tiles_no_tail)) {
          REQUIRE(std::get<0>(key) < groups);
        }
        REQUIRE(tiles_no_tail ==
                expected_tiles - ceil_div(k.rows - k.offsets.back(), 4) * ceil_div(k.n, 8));
      }
    }
  }
}

TEST_CASE("wgrad tiles cover each non-empty group's whole output once", "[nn][grouped]") {
  const std::vector<std::int64_t> offsets = {0, 0, 7, 7, 20, 21};  // groups 0 and 2 empty
  TileGrid grid;
  grid.tile_m = 8;
  grid.tile_n = 16;
  grid.total_rows = 25;  // 4 padding rows: no effect on wgrad
  grid.rows_are_k = true;
  grid.m = 10;  // out: two row-tiles, the second partial (2 rows)
  grid.n = 17;  // in: two column tiles, the second partial (1 column)
  for (const int ctas : {1, 5}) {
    std::int64_t tiles = 0;
    const auto seen = cover(offsets, grid, ctas, tiles);
    REQUIRE(tiles == 3 * 2 * 2);  // groups 1, 3 and 4
    REQUIRE(tiles <= max_tiles(grid, 5));
    REQUIRE(static_cast<std::int64_t>(seen.size()) == 3 * 10 * 17);
    for (const auto& [key, count] : seen) {
      const std::int64_t g = std::get<0>(key);
      REQUIRE((g == 1 || g == 3 || g == 4));
      REQUIRE(count == 1);
    }
  }
  // The tile's input rows are its group's (the reduction range).
  TileWalker walker(offsets.data(), 5, grid);
  Tile t;
  REQUIRE(walker.find(0, t));
  REQUIRE((t.group == 1 && t.first_row == 0 && t.rows == 7));
  REQUIRE(walker.find(4, t));
  REQUIRE((t.group == 3 && t.first_row == 7 && t.rows == 13));
  REQUIRE(walker.find(11, t));
  REQUIRE(
      (t.group == 4 && t.first_row == 20 && t.rows == 1 && t.tile_rows == 2 && t.tile_cols == 1));
  REQUIRE_FALSE(walker.find(12, t));
}

TEST_CASE("tiles stay inside the rows for offsets that break the rules", "[nn][grouped]") {
  // Negative, decreasing and past-the-end offsets (unchecked on a GPU) are clamped: every tile
  // reads and writes rows of the tensor only (checked inside cover()).
  TileGrid grid;
  grid.tile_m = 4;
  grid.tile_n = 4;
  grid.total_rows = 10;
  grid.n = 6;
  grid.zero_tail = true;
  for (const std::vector<std::int64_t>& offsets : std::vector<std::vector<std::int64_t>>{
           {-3, 4, 2, 30}, {5, 1, 12}, {0, 0, 0, 99}, {7, 7, -1}}) {
    std::int64_t tiles = 0;
    cover(offsets, grid, 3, tiles);
  }
}
