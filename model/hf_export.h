// Writes a trained policy as a checkpoint folder that other tools load unchanged: a Hugging Face
// BF16 checkpoint (transformers, vLLM, SGLang) or the block-FP8 checkpoint vLLM and SGLang serve
// with their "fp8" quantization method (docs/design/training.md "Export").
//
// Folder layout (both formats):
//   config.json               model_config_to_json + "torch_dtype": "bfloat16" (and for fp8 the
//                             quantization_config {quant_method: fp8, fmt: e4m3,
//                             activation_scheme: dynamic, weight_block_size: [128, 128]})
//   model.safetensors         when everything fits in one shard, else
//   model-0000i-of-0000n.safetensors + model.safetensors.index.json
//                             ({"metadata": {"total_size": bytes}, "weight_map": {name: shard}})
//   generation_config.json    copied from the source folder when it has one, else written from
//                             config's bos/eos ids
//   tokenizer files           copied from the source folder when present (kTokenizerFiles)
// Tensors:
//   hf   every parameter BF16 (round to nearest even from the fp32 master), HF names; no k/v
//        scales (transformers would report them as unexpected keys).
//   fp8  linear weights F8_E4M3 [N, K] with "<name>_scale_inv" F32 [ceil(N/128), ceil(K/128)]
//        (dequantized w = code * scale_inv of its 128x128 block: the layout vLLM's and SGLang's
//        Fp8LinearMethod load as `weight_scale_inv`); embeddings, norms, biases and lm_head BF16;
//        "model.layers.{i}.self_attn.k_scale" / "v_scale" F32 scalars (FP8 KV-cache scales).
//        vLLM fuses q/k/v and gate/up and then needs every such output size to be a multiple of
//        128; real checkpoints are, toy test models need not be.
// Shards are filled in parameter order; a shard is closed when the next tensor would take it past
// max_shard_bytes (a tensor larger than that gets a shard of its own), as transformers'
// save_pretrained does.
//
// Atomic: everything is written into "<out>.tmp.<pid>" beside `out` and renamed at the end; on
// any failure that folder is removed and `out` is untouched.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model.h"
#include "model/weight_set.h"

namespace fp8rl::model {

enum class ExportFormat { kHf, kFp8 };
absl::StatusOr<ExportFormat> parse_export_format(std::string_view name);  // hf|fp8

// The files beside the weights that make a checkpoint usable on its own (tokenizer, chat template,
// generation defaults), copied when the source folder has them.
inline const std::vector<std::string> kTokenizerFiles = {"tokenizer.json",
                                                         "tokenizer_config.json",
                                                         "special_tokens_map.json",
                                                         "added_tokens.json",
                                                         "vocab.json",
                                                         "merges.txt",
                                                         "tokenizer.model",
                                                         "chat_template.jinja",
                                                         "chat_template.json",
                                                         "generation_config.json"};

// transformers' default shard limit ("5GB" = 5 * 10^9 bytes).
inline constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;

struct HfExportOptions {
  ExportFormat format = ExportFormat::kHf;
  int64_t max_shard_bytes = kDefaultMaxShardBytes;  // > 0
  // Folder to copy kTokenizerFiles from ("" = none).
  std::string side_files_dir;
};

struct HfExportSummary {
  int64_t tensors = 0;
  int64_t shards = 0;
  int64_t total_bytes = 0;                // tensor bytes (the index's metadata.total_size)
  std::vector<std::string> copied_files;  // file names, sorted
};

// Which shard each tensor goes to: shards[i] lists indices into `tensors`, in order.
std::vector<std::vector<size_t>> plan_shards(const std::vector<NamedTensor>& tensors,
                                             int64_t max_shard_bytes);
// "model-00002-of-00005.safetensors" (1-based index).
std::string shard_file_name(int64_t index, int64_t count);

// The tensors of `model` in the export format, with the config.json text.
absl::StatusOr<WeightSet> export_tensors(const Model& model, ExportFormat format);

// Writes `model` to `out_dir` (see the header comment). Errors name the option or the file.
absl::StatusOr<HfExportSummary> export_hf_checkpoint(const Model& model, const std::string& out_dir,
                                                     const HfExportOptions& options);

}  // namespace fp8rl::model
