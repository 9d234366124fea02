// The failure tests' fault hooks (core/faults.h), from the environment of the train program:
//   ENGINE_TEST_KILL="<rank>:<step>:step"        SIGKILL that rank (as kill -9) after that step's
//                                                backward, before its update
//   ENGINE_TEST_KILL="<rank>:<step>:checkpoint"  SIGKILL it 4 KiB into writing its file of that
//                                                step's checkpoint
//   ENGINE_TEST_STALL="<rank>:<step>"            that rank stops responding (sleeps forever) at
//                                                the start of that step, as a stuck rank would
//   ENGINE_TEST_MISSING_DATA="<rank>"            that rank cannot open its training data
//   ENGINE_TEST_FULL_DISK="<rank>:<bytes>"       that rank's checked writes (checkpoint::OutFile:
//                                                run directory files, checkpoints, exports) fail
//                                                with ENOSPC after that many bytes
// Installed by main_train.cpp only when one of them is set.
#pragma once

namespace engine {
void install_test_faults_from_env();
}  // namespace engine
