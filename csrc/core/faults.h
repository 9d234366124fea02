// Fault injection for the failure tests, behind one small interface. Production code names the
// places where a test may inject a fault (`faults::at(Point, ...)`); with no hooks installed (every
// real run) a call is one load of a null pointer. The failure tests' hooks (csrc/train/test_faults.cpp)
// read their requests from ENGINE_TEST_* variables and are installed by the train program's main.
#pragma once
#include <memory>
#include <string>

namespace engine::faults {

enum class Point {
  StepStart,        // a training step is about to start (step: the step it will be)
  StepEnd,          // a step's backward is done, before its update (step: that step)
  CheckpointWrite,  // a checkpoint of `step` is about to be written
  TrainData,        // the training data is about to be opened (path: its first file, may change)
};
const char* point_name(Point p);

struct Site {
  int rank = 0;                  // this process's rank in the world
  int step = 0;
  std::string* path = nullptr;   // TrainData: the file a hook may redirect
};

class Hooks {
 public:
  virtual ~Hooks() = default;
  virtual void at(Point point, const Site& site) = 0;
};

// Installs the process's hooks (nullptr removes them). Not thread-safe: call before any work.
void install(std::unique_ptr<Hooks> hooks);
void at(Point point, const Site& site);

}  // namespace engine::faults
