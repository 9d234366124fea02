// core/device.h for a build without CUDA (make CUDA=0, or no nvcc): no device is visible, and
// anything that would touch one says why it cannot.
#include "core/device.h"

#include "core/check.h"

namespace engine::device {
namespace {
[[noreturn]] void no_cuda() { RAISE("this build has no CUDA support (built without nvcc)"); }
}  // namespace

bool in_build() { return false; }
int count() { return 0; }
std::string description(int) { no_cuda(); }
void select(int) { no_cuda(); }
MemoryInfo memory_info() { no_cuda(); }
void* alloc(size_t) { no_cuda(); }
void release(void*) { no_cuda(); }
void copy(void*, bool, const void*, bool, size_t) { no_cuda(); }
void upload(void*, const void*, size_t) { no_cuda(); }
void zero(void*, size_t) { no_cuda(); }

}  // namespace engine::device
