// Magic numbers and header sizes of the token file formats, shared by readers and writers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace quintet::data::detail {

inline constexpr char kQuintetMagic[8] = {'Q', 'T', 'S', 'H', 'A', 'R', 'D', '\0'};
inline constexpr std::uint32_t kQuintetVersion = 1;
inline constexpr std::size_t kQuintetHeaderBytes = 64;

inline constexpr std::int32_t kLlmcMagicGpt2 = 20240520;  // version 1, uint16 tokens
inline constexpr std::int32_t kLlmcVersionGpt2 = 1;
inline constexpr std::int32_t kLlmcMagicLlama3 = 20240801;  // version 7, uint32 tokens
inline constexpr std::int32_t kLlmcVersionLlama3 = 7;
inline constexpr std::size_t kLlmcHeaderBytes = 256 * 4;

inline constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr std::uint64_t kMegatronVersion = 1;
inline constexpr std::size_t kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;  // 34

inline std::uint64_t align8(std::uint64_t n) { return (n + 7) / 8 * 8; }

}  // namespace quintet::data::detail
