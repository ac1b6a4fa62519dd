// Private: the tile enumeration of the grouped GEMM kernels (lib/nn/cuda/grouped_gemm.cu), plain
// C++17 usable on the host and the device, so a CPU unit test covers it
// (tests/unit/nn_grouped_gemm_tiles_test.cpp).
//
// A grouped GEMM has G groups of consecutive input rows, group g holding rows [o_g, o_{g+1}) of
// the offsets o (read from device memory by the kernel). Its output is cut into tiles of
// tile_m x tile_n, numbered group by group, and inside a group row-tile by row-tile with the
// column tiles fastest (neighbouring CTAs share the rows they read). A persistent CTA takes tile
// indices blockIdx.x, blockIdx.x + gridDim.x, ... and finds each with a TileWalker, which only
// moves forward, so a CTA reads each group's offsets once.
//
// Two kinds of grid:
//   - rows_are_k = false (forward y = x · w_gᵀ and dgrad dx = dy · w_g): group g's output is its
//     own rows, m_g x n, so ceil(m_g / tile_m) * ceil(n / tile_n) tiles (none for an empty group).
//     With zero_tail, the rows [o_G, total_rows) past the last group (padding) follow as one more
//     pseudo-group, index G, whose tiles the kernel fills with zeros.
//   - rows_are_k = true (wgrad dw_g += dy_gᵀ · x_g): group g's output is the whole m x n matrix
//     dw_g, reduced over its rows; an empty group has no tile (dw_g is left as it was).
// Offsets are clamped into [0, total_rows] and a group ending before it starts counts as empty,
// so offsets that break the rules (unchecked on a GPU) never make a tile reach outside the rows.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define QUINTET_GROUPED_HD __host__ __device__
#else
#define QUINTET_GROUPED_HD
#endif

namespace quintet::nn::cuda_ops::grouped {

QUINTET_GROUPED_HD inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

struct TileGrid {
  std::int64_t tile_m = 0, tile_n = 0;  // > 0
  std::int64_t total_rows = 0;          // the input's rows (n)
  std::int64_t m = 0;                   // rows_are_k: the output's rows (each group's)
  std::int64_t n = 0;                   // the output's columns
  bool rows_are_k = false;
  bool zero_tail = false;  // !rows_are_k only: tiles for the padding rows past the last group
};

// Offset g (0 <= g <= G) clamped into [0, total_rows].
QUINTET_GROUPED_HD inline std::int64_t clamped_offset(const std::int64_t* offsets, std::int64_t g,
                                                      std::int64_t total_rows) {
  const std::int64_t o = offsets[g];
  return o < 0 ? 0 : (o > total_rows ? total_rows : o);
}

// The output rows of a group of `rows` input rows (rows >= 0).
QUINTET_GROUPED_HD inline std::int64_t group_output_rows(const TileGrid& grid, std::int64_t rows) {
  if (!grid.rows_are_k) return rows;
  return rows > 0 ? grid.m : 0;
}

// The tiles of a group of `rows` input rows.
QUINTET_GROUPED_HD inline std::int64_t group_tiles(const TileGrid& grid, std::int64_t rows) {
  return ceil_div(group_output_rows(grid, rows), grid.tile_m) * ceil_div(grid.n, grid.tile_n);
}

struct Tile {
  std::int64_t group = 0;       // 0..G-1, or G for a padding tile (zero_tail)
  std::int64_t first_row = 0;   // the group's first input row (o_g)
  std::int64_t rows = 0;        // the group's input rows (m_g; for padding, total_rows - o_G)
  std::int64_t m0 = 0, n0 = 0;  // the tile's first output row (within the group's) and column
  // The tile's output rows and columns inside the group's output (the last tiles are partial).
  std::int64_t tile_rows = 0, tile_cols = 0;
};

// Finds tiles by increasing index (see the top). Not thread-shared: each thread keeps its own.
class TileWalker {
 public:
  QUINTET_GROUPED_HD TileWalker(const std::int64_t* offsets, std::int64_t groups,
                                const TileGrid& grid)
      : offsets_(offsets), groups_(groups), grid_(grid) {}

  // Tile t (t at least the previous call's). Returns false when t is past the last tile.
  QUINTET_GROUPED_HD bool find(std::int64_t t, Tile& tile) {
    const std::int64_t last = grid_.zero_tail && !grid_.rows_are_k ? groups_ : groups_ - 1;
    while (group_ <= last) {
      std::int64_t begin, end;
      if (group_ < groups_) {
        begin = clamped_offset(offsets_, group_, grid_.total_rows);
        end = clamped_offset(offsets_, group_ + 1, grid_.total_rows);
      } else {  // the padding past the last group
        begin = clamped_offset(offsets_, groups_, grid_.total_rows);
        end = grid_.total_rows;
      }
      const std::int64_t rows = end > begin ? end - begin : 0;
      const std::int64_t count = group_tiles(grid_, rows);
      if (t < first_tile_ + count) {
        const std::int64_t local = t - first_tile_;
        const std::int64_t tiles_n = ceil_div(grid_.n, grid_.tile_n);
        const std::int64_t out_rows = group_output_rows(grid_, rows);
        tile.group = group_;
        tile.first_row = begin;
        tile.rows = rows;
        tile.m0 = (local / tiles_n) * grid_.tile_m;
        tile.n0 = (local % tiles_n) * grid_.tile_n;
        tile.tile_rows = out_rows - tile.m0 < grid_.tile_m ? out_rows - tile.m0 : grid_.tile_m;
        tile.tile_cols = grid_.n - tile.n0 < grid_.tile_n ? grid_.n - tile.n0 : grid_.tile_n;
        return true;
      }
      first_tile_ += count;
      ++group_;
    }
    return false;
  }

 private:
  const std::int64_t* offsets_;
  std::int64_t groups_;
  TileGrid grid_;
  std::int64_t group_ = 0;       // the group searched first
  std::int64_t first_tile_ = 0;  // the index of its first tile
};

// An upper bound of the tiles of any valid offsets, which the host sizes the persistent grid with
// without reading them: rows_are_k: every group full; else each group's partial last row-tile and
// the padding's add at most one row-tile each to ceil(total_rows / tile_m). Only the grid's size:
// its CTAs walk until the last tile whatever the bound.
QUINTET_GROUPED_HD inline std::int64_t max_tiles(const TileGrid& grid, std::int64_t groups) {
  const std::int64_t tiles_n = ceil_div(grid.n, grid.tile_n);
  if (grid.rows_are_k) return groups * ceil_div(grid.m, grid.tile_m) * tiles_n;
  return (ceil_div(grid.total_rows, grid.tile_m) + groups + (grid.zero_tail ? 1 : 0)) * tiles_n;
}

}  // namespace quintet::nn::cuda_ops::grouped
