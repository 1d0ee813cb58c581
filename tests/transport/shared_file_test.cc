// The shared-file helper: liveness, stale cleanup, creation.
#include "transport/shared_file.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <string>

namespace uroce::transport {
namespace {

// A pid that names no process: a child that exited and was reaped.
uint32_t dead_pid() {
  pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return uint32_t(child);
}

class SharedFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/uroce-shared-file-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  bool exists(const std::string& name) const {
    struct stat st;
    return stat((dir_ + "/" + name).c_str(), &st) == 0;
  }
  void touch(const std::string& name) const { std::ofstream(dir_ + "/" + name) << "x"; }
  std::string dir_;
};

TEST(ProcessAlive, SelfIsAliveZeroAndAReapedChildAreNot) {
  EXPECT_TRUE(process_alive(uint32_t(getpid())));
  EXPECT_FALSE(process_alive(0));
  EXPECT_FALSE(process_alive(dead_pid()));
}

TEST_F(SharedFileTest, StaleCleanupRemovesOnlyTheDeadProcessesFilesOfThePrefix) {
  std::string dead = std::to_string(dead_pid());
  std::string self = std::to_string(getpid());
  touch("seg-" + dead + "-1");
  touch("seg-" + self + "-1");
  touch("other-" + dead + "-1");
  touch("seg-notapid");
  remove_stale_files(dir_, "seg-");
  EXPECT_FALSE(exists("seg-" + dead + "-1"));
  EXPECT_TRUE(exists("seg-" + self + "-1"));
  EXPECT_TRUE(exists("other-" + dead + "-1"));
  EXPECT_TRUE(exists("seg-notapid"));
}

TEST_F(SharedFileTest, CreatesAZeroedPrivateMappingAndExclusiveRefusesAnExistingFile) {
  std::string path = dir_ + "/seg";
  constexpr size_t kBytes = 1 << 16;
  ByteRange head{0, 4096};
  auto* map = static_cast<uint8_t*>(create_shared_file(path, kBytes, true, {&head, 1}));
  ASSERT_NE(map, nullptr);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(size_t(st.st_size), kBytes);
  EXPECT_EQ(map[0], 0);
  EXPECT_EQ(map[kBytes - 1], 0);
  map[0] = 7;
  errno = 0;
  EXPECT_EQ(create_shared_file(path, kBytes, true), nullptr);
  EXPECT_EQ(errno, EEXIST);
  EXPECT_TRUE(exists("seg"));  // another's file is left alone
  EXPECT_EQ(map[0], 7);
  auto* again = static_cast<uint8_t*>(create_shared_file(path, kBytes, false));  // truncated afresh
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again[0], 0);
  munmap(again, kBytes);
  munmap(map, kBytes);
}

TEST_F(SharedFileTest, AFailureRemovesTheFileItMade) {
  std::string path = dir_ + "/seg";
  ByteRange past{0, size_t(1) << 62};  // more than any file system can allocate
  errno = 0;
  EXPECT_EQ(create_shared_file(path, 4096, true, {&past, 1}), nullptr);
  EXPECT_NE(errno, 0);
  EXPECT_FALSE(exists("seg"));
}

}  // namespace
}  // namespace uroce::transport
