// What threads read after main() returns: the CM's and the engines' threads are
// never joined, so while the exiting thread runs atexit handlers and static
// destructors they may still look up the device list or the configuration. Those
// must outlive every destructor. The check runs in a fresh process (a death test,
// "threadsafe" style: the binary re-executed), whose atexit handler is registered
// before the statics are built and so runs after their destructors would have.
// Under AddressSanitizer a destroyed list is a heap-use-after-free and a non-zero
// exit; without it, the freed storage's contents are checked.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "core/config.h"
#include "core/device.h"

namespace uroce::core {
namespace {

void read_statics_after_destructors() {
  std::span<Device* const> list = devices();
  const bool ok = list.size() == 1 && std::strcmp(list[0]->ibdev.name, config().device_name.c_str()) == 0;
  std::_Exit(ok ? 0 : 3);
}

TEST(ExitOrder, DeviceListAndConfigOutliveStaticDestructors) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::atexit(read_statics_after_destructors);
        (void)devices();  // built after the handler's registration: destroyed, if at all, before it runs
        std::exit(0);
      },
      testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace uroce::core
