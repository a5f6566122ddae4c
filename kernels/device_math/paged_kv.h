// The paged KV cache layout shared by the CPU reference and the CUDA kernels: fixed-size blocks
// in one pool per tensor (K, V), a per-sequence block table mapping positions to blocks.
#pragma once

#include <cstdint>

#include "kernels/device_math/hd.h"

namespace fp8rl::kernels::dm {

// K and V pools are [num_blocks, block_size, n_kv, head_dim] elements of `dtype` (row-major), one
// pair per layer. Position p of sequence s lives in block block_table[s * max_blocks + p /
// block_size], slot p % block_size. FP8 elements are e4m3(x / scale) with the layer's k/v scale.
// Non-owning: host or device pointers, as the caller's side requires.
struct PagedKvView {
  void* k_pool = nullptr;
  void* v_pool = nullptr;
  KvDtype dtype = KvDtype::kF32;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t n_kv = 0;
  int64_t head_dim = 0;
  const int32_t* block_table = nullptr;  // [n_seq, max_blocks]
  int64_t max_blocks = 0;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

// Element offset (not bytes) of (sequence s, position p, kv head g, element 0) in a pool.
FP8RL_HD int64_t paged_kv_offset(const PagedKvView& kv, int64_t s, int64_t p, int64_t g) {
  const int64_t block = kv.block_table[s * kv.max_blocks + p / kv.block_size];
  return ((block * kv.block_size + p % kv.block_size) * kv.n_kv + g) * kv.head_dim;
}

FP8RL_HD const void* kv_elem_ptr(const void* pool, KvDtype dtype, int64_t offset) {
  return static_cast<const char*>(pool) + offset * kv_elem_bytes(dtype);
}

FP8RL_HD void* kv_elem_ptr(void* pool, KvDtype dtype, int64_t offset) {
  return static_cast<char*>(pool) + offset * kv_elem_bytes(dtype);
}

}  // namespace fp8rl::kernels::dm
