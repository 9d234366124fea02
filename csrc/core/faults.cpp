#include "core/faults.h"

namespace engine::faults {
namespace {
std::unique_ptr<Hooks> g_hooks;
}  // namespace

const char* point_name(Point p) {
  switch (p) {
    case Point::StepStart: return "step start";
    case Point::StepEnd: return "step end";
    case Point::CheckpointWrite: return "checkpoint write";
    case Point::TrainData: return "train data";
  }
  return "?";
}

void install(std::unique_ptr<Hooks> hooks) { g_hooks = std::move(hooks); }

void at(Point point, const Site& site) {
  if (g_hooks) g_hooks->at(point, site);
}

}  // namespace engine::faults
