// Knowledge distillation end to end through the trainer ([distillation], the LM head's
// distillation loss): a student that equals its teacher has zero forward and reverse KL, a zero
// distillation weight gives the plain cross-entropy, a student learns to match a teacher, the
// teacher loads from a Hugging Face folder or a checkpoint, and bad teachers are refused.
#include <doctest/doctest.h>

#include <filesystem>

#include "checkpoint/tools.h"
#include "core/log.h"
#include "tests/common/testing.h"
#include "tests/train/train_fixture.h"
#include "train/trainer.h"

using namespace engine;
using namespace engine::testing;
namespace fs = std::filesystem;

namespace {

// A teacher: the random init of the tiny llama with seed 11 and a large init_std (peaked
// output distributions, far from a fresh student's), exported as a Hugging Face folder (once
// per process).
const std::string& teacher_dir() {
  static const std::string dir = [] {
    const std::string d = (fs::path(learnable_dataset()).parent_path() / "teacher-hf").string();
    Config t = tiny_run_config("llama", {"run.seed=11", "run.name=teacher-src", "model.init_std=0.4"});
    checkpoint::export_hf_from_config(t, d, {});
    return d;
  }();
  return dir;
}

double first_loss(const std::vector<std::string>& overrides) {
  Trainer t(tiny_run_config("llama", overrides), false);
  return t.train_step().loss;
}

}  // namespace

TEST_CASE("distillation: a student equal to its teacher has zero KL; zero weight is plain cross-entropy") {
  const std::string teacher = "distillation.teacher=\"" + teacher_dir() + "\"";
  const std::string same = "model.init_from=\"" + teacher_dir() + "\"";
  for (const char* kind : {"forward_kl", "reverse_kl"}) {
    CAPTURE(kind);
    for (const char* tau : {"1.0", "2.5"})
      CHECK(std::abs(first_loss({teacher, same, std::string("distillation.kind=\"") + kind + "\"",
                                 std::string("distillation.temperature=") + tau})) < 1e-5);
  }
  // Soft cross-entropy against itself: the teacher's entropy, positive and below ln(V).
  const double ent = first_loss({teacher, same, "distillation.kind=\"soft_ce\""});
  CHECK(ent > 0.5);
  CHECK(ent < std::log(37.0) + 0.5);
  // Label term only: the usual loss of the same model (with z-loss inside the label term).
  CHECK(first_loss({teacher, "distillation.weight=0", "distillation.label_weight=1", "model.z_loss=0.01"}) ==
        doctest::Approx(first_loss({"model.z_loss=0.01"})).epsilon(1e-6));
}

TEST_CASE("distillation: the student learns the teacher (forward KL falls), from a folder or a checkpoint") {
  log_set_level(LogLevel::Warn);
  const std::string teacher = "distillation.teacher=\"" + teacher_dir() + "\"";
  Trainer t(tiny_run_config("llama", {teacher, "optimizer.lr=3e-2", "training.steps=60"}), false);
  const double first = t.train_step().loss;
  double last = first;
  for (int i = 0; i < 50; ++i) last = t.train_step().loss;
  INFO("forward KL " << first << " -> " << last);
  CHECK(first > 0.2);
  CHECK(last < 0.6 * first);

  // A checkpoint folder as the teacher: the same weights as its run's.
  Config src = tiny_run_config("llama", {"run.name=teacher-ckpt", "training.steps=4"});
  Trainer s(src, false);
  s.train_step();
  s.train_step();
  const std::string dir = s.save_checkpoint();
  const double kl = first_loss({"distillation.teacher=\"" + dir + "\"", "training.resume=\"" + dir + "\"",
                                "run.name=teacher-ckpt-student"});
  CHECK(std::abs(kl) < 1e-5);
  log_set_level(LogLevel::Info);
}

TEST_CASE("distillation: bad teachers and settings are config errors naming the key") {
  auto message = [](const std::vector<std::string>& o) {
    try {
      Trainer t(tiny_run_config("llama", o), false);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string teacher = "distillation.teacher=\"" + teacher_dir() + "\"";
  CHECK(message({"distillation.teacher=\"/nonexistent\""}).find("distillation.teacher") != std::string::npos);
  CHECK(message({teacher, "model.vocab_size=40"}).find("teacher's vocabulary (37)") != std::string::npos);
  CHECK(message({teacher, "distillation.temperature=0"}).find("distillation.temperature") != std::string::npos);
  CHECK(message({teacher, "model.label_smoothing=0.1"}).find("model.label_smoothing") != std::string::npos);
  CHECK(message({teacher, "distillation.weight=0"}).find("nothing to train on") != std::string::npos);
}
