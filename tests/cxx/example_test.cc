// The docs/cxx-api.md example, server and client in two threads (port kPortBase + 4).
#include <thread>

#include "hello_write_example.hpp"
#include "test_util.hpp"

namespace uroce::test {
namespace {

TEST(Example, HelloWrite) {
  constexpr std::uint16_t kPort = kPortBase + 4;
  Result<std::string> received = Error(EINPROGRESS, "the server did not run");
  std::thread server([&] { received = example::hello_write("", kPort); });
  Result<std::string> client = example::hello_write("127.0.0.1", kPort);
  server.join();
  ASSERT_OK(client);
  ASSERT_OK(received);
  EXPECT_EQ(*received, "hello over RDMA WRITE");
}

}  // namespace
}  // namespace uroce::test
