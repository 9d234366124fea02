#include "core/check.h"

namespace engine {

static int g_error_rank = -1;

void set_error_rank(int rank) { g_error_rank = rank; }
int error_rank() { return g_error_rank; }

void fail_check(const char* file, int line, const char* expr, const std::string& msg) {
  std::ostringstream os;
  if (g_error_rank >= 0) os << "[rank " << g_error_rank << "] ";
  os << msg;
  if (expr) os << (msg.empty() ? "" : " ") << "(check failed: " << expr << ")";
  os << " at " << file << ":" << line;
  throw Error(os.str());
}

}  // namespace engine
