#include "core/check.h"

namespace engine {

void fail_check(const char* file, int line, const char* expr, const std::string& msg) {
  std::ostringstream os;
  os << msg;
  if (expr) os << (msg.empty() ? "" : " ") << "(check failed: " << expr << ")";
  os << " at " << file << ":" << line;
  throw Error(os.str());
}

}  // namespace engine
