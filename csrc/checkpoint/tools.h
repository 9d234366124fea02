// The checkpoint tools of the train program:
//   ./train CONFIG --export-hf OUT_DIR   the model as a Hugging Face folder (hf.h)
//   ./train CONFIG --export-peft OUT_DIR (LoRA runs) the adapter as a PEFT folder (lora_export.h)
//   ./train CONFIG --dump-logits TOKENS OUT.safetensors
//                                        our logits for given token sequences (scripts/hf_check.py
//                                        compares them with transformers')
// Both take the weights from, in order: the checkpoint training.resume names (a path), the
// newest usable checkpoint of the run (<output_dir>/<name>/checkpoints), model.init_from, or
// the seeded random init; and say which.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "config/config.h"

namespace engine::checkpoint {

struct WeightSource {
  std::string description;  // "checkpoint runs/x/checkpoints/step_6", "Hugging Face folder ...", "init (seed 5)"
  Fetch fetch;              // master weights by parameter
  std::shared_ptr<void> keep_alive;
};
WeightSource weight_source(const Config& c);

// <output_dir>/<name>/checkpoints
std::string checkpoint_root(const Config& c);

// The model a folder holds: a Hugging Face folder's config.json, else a checkpoint's
// metadata.json (distillation.teacher takes either).
ModelConfig folder_model_config(const std::string& folder);

void export_hf_from_config(const Config& c, const std::string& out_dir, const hf::ExportOptions& options);
// A LoRA run's adapter as a PEFT folder (checkpoint/lora_export.h); --export-hf of such a run
// writes the merged model.
void export_peft_from_config(const Config& c, const std::string& out_dir);

// TOKENS: a text file, one sequence per line of whitespace-separated token ids (each line a
// document of its own). OUT: safetensors with, per line i, "tokens.<i>" (T) I32 and "logits.<i>"
// (T, vocab) F32, computed on `device` (bf16 on GPUs, f32 on the CPU). With model.prediction_heads
// = k also "logits_head<j>.<i>" (T, vocab) for each extra head j = 1..k (Model::prediction_logits).
void dump_logits(const Config& c, Device device, const std::string& tokens_path, const std::string& out_path);

}  // namespace engine::checkpoint
