// The exports of a LoRA run (lora.rank > 0, layers/lora.h):
//   --export-hf DIR    the MERGED model, W + (alpha / rank) B A for every adapted weight, as the
//                      plain Hugging Face folder of the base model (merged_fetch feeds export_hf)
//   --export-peft DIR  a PEFT adapter folder: adapter_config.json (peft_type LORA, r, lora_alpha,
//                      target_modules as Hugging Face module names, base_model_name_or_path =
//                      model.init_from, bias "none", task_type CAUSAL_LM, lora_dropout 0,
//                      fan_in_fan_out false) and adapter_model.safetensors with PEFT's names:
//                      base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight (r, in)
//                      and ...lora_B.weight (out, r); mlp.gate_proj / up_proj / down_proj alike.
#pragma once
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "config/config.h"

namespace engine::checkpoint {

// `c` with LoRA off: the base model the adapters sit on (its table and Hugging Face names).
ModelConfig lora_base_config(const ModelConfig& c);
// Values of the base model's parameters (a table of lora_base_config(c), one rank) with every
// adapted weight merged: W + s B A, W, A and B read through `fetch` over `lora_table` (the LoRA
// model's one-rank table).
Fetch merged_fetch(const ModelConfig& c, const ParamTable& lora_table, const Fetch& fetch);
// The adapter folder (see the top) from the LoRA parameters `fetch` gives over `lora_table`.
void export_peft(const ModelConfig& c, const ParamTable& lora_table, const Fetch& fetch, const std::string& out_dir);

}  // namespace engine::checkpoint
