// model.prediction_heads and model.prediction_loss_weights (multi-token prediction,
// models/transformer.h): the weights default to 1 for the next-token head and every extra head;
// a list of another length, a negative weight, or a combination the heads do not support is
// refused naming the key.
#include <string>

#include "config/config.h"
#include "config/config_fields.h"
#include "core/check.h"

namespace engine {
namespace config_detail {

void check_prediction_heads(Config& c) {
  ModelConfig& m = c.model;
  const int k = m.prediction_heads;
  const char* heads = "model.prediction_heads";
  const char* weights = "model.prediction_loss_weights";
  if (k < 0) RAISE(c.where(heads), "must be >= 0, got ", k);
  if (k == 0) {
    // (an empty list is what the effective config writes for no extra heads)
    if (!m.prediction_loss_weights.empty())
      RAISE(c.where(weights), "weighs the heads of multi-token prediction: set model.prediction_heads > 0, or "
                              "leave it unset");
    return;
  }
  if (m.num_layers < 2)
    RAISE(c.where(heads), "needs model.num_layers >= 2 (the trunk is every block but the last, which is the "
                          "next-token head's own), got ", m.num_layers);
  if (!c.is_set(weights)) m.prediction_loss_weights.assign(static_cast<size_t>(k) + 1, 1.0);
  const std::vector<double>& w = m.prediction_loss_weights;
  if (w.size() != static_cast<size_t>(k) + 1)
    RAISE(c.where(weights), "needs prediction_heads + 1 = ", k + 1,
          " weights (the next-token head's, then each extra head's), got ", w.size());
  double total = 0;
  for (size_t j = 0; j < w.size(); ++j) {
    if (!(w[j] >= 0)) RAISE(c.where(weights), "weight ", j, " must be >= 0, got ", w[j]);
    total += w[j];
  }
  if (total == 0) RAISE(c.where(weights), "are all 0: nothing to train on");
  if (!c.distillation.teacher.empty())
    RAISE(c.where(heads), "is not combined with distillation (the teacher gives next-token logits only); set "
                          "distillation.teacher = \"\" or prediction_heads = 0");
  // The extra heads' blocks would take adapters no PEFT folder has a name for.
  if (m.lora.rank > 0)
    RAISE(c.where(heads), "is not combined with LoRA (lora.rank > 0): set lora.rank = 0 or prediction_heads = 0");
}

}  // namespace config_detail
}  // namespace engine
