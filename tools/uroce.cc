// uroce — the command-line launcher.
//
//   uroce run [--] PROGRAM [ARGS...]   run PROGRAM with liburoce.so preloaded
//   uroce devices                      list uroce devices, their GIDs and UDP port (LID)
//   uroce stats [PID]                  live counters of running uroce processes (stats.cc)
//   uroce help [env]                   usage / every UROCE_* environment variable
//
// `run` execs PROGRAM with LD_PRELOAD=<absolute path of liburoce.so>, so the program's
// ibv_* / rdma_* calls resolve to uroce instead of rdma-core; its exit status is the
// program's. `devices` uses only the public libibverbs C API (the launcher is linked
// against liburoce, which exports it).
//
// Sanitizer builds (-DUROCE_SANITIZE=..., cmake/Sanitizers.cmake): liburoce.so then needs
// the sanitizer runtime (libasan/libubsan/libtsan), which must be the first object of the
// process. `run` reads liburoce's DT_NEEDED entries and puts those runtimes at the front of
// LD_PRELOAD, so that unmodified, uninstrumented programs (Debian's ibv_rc_pingpong,
// perftest) run on an instrumented liburoce. Leaks of such programs are not uroce's: when
// PROGRAM itself is not built with ASan, `run` adds detect_leaks=0 to ASAN_OPTIONS (unless
// ASAN_OPTIONS already says detect_leaks); uroce's own instrumented test programs keep
// leak detection.

#include <arpa/inet.h>
#include <elf.h>
#include <endian.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"
#include "stats_command.h"

namespace {

constexpr int kExitUsage = 2;
constexpr int kExitCannotRun = 126;  // shell convention: found but not executable
constexpr int kExitNotFound = 127;   // shell convention: command not found

void usage(std::FILE* out) {
  std::fputs(
      "uroce - RDMA verbs (RoCEv2 over UDP) without RDMA hardware\n"
      "\n"
      "Usage:\n"
      "  uroce run [--] PROGRAM [ARGS...]  run PROGRAM with the uroce library preloaded,\n"
      "                                    so its libibverbs/librdmacm calls use uroce;\n"
      "                                    exits with PROGRAM's status\n"
      "  uroce devices                     list uroce devices with their GIDs and UDP port\n"
      "  uroce stats [PID]                 live port and QP counters of running uroce\n"
      "                                    processes (of this user; PID: that one only)\n"
      "  uroce help env                    list every UROCE_* environment variable\n"
      "  uroce help                        this text\n"
      "\n"
      "Example:\n"
      "  uroce run ibv_rc_pingpong -g 0 &  uroce run ibv_rc_pingpong -g 0 127.0.0.1\n",
      out);
}

// Directory of the running executable (symlinks resolved), from /proc/self/exe.
std::string self_dir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

// Absolute path of liburoce.so: $UROCE_LIB, else ../lib/liburoce.so next to this binary
// (the build tree), else the installed library directory. Empty, after saying why, if
// there is none.
std::string library_path() {
  std::vector<std::string> candidates;
  const char* env = std::getenv("UROCE_LIB");
  if (env && *env) {
    candidates.push_back(env);
  } else {
    candidates.push_back(self_dir() + "/../lib/liburoce.so");
#ifdef UROCE_INSTALL_LIBDIR
    candidates.push_back(self_dir() + "/../" UROCE_INSTALL_LIBDIR "/liburoce.so");
#endif
  }
  for (const auto& candidate : candidates) {
    char resolved[PATH_MAX];
    if (realpath(candidate.c_str(), resolved)) return resolved;
  }
  std::fprintf(stderr, "uroce: cannot find the uroce library at %s%s\n", candidates.front().c_str(),
               env && *env ? " (from UROCE_LIB)" : "; set UROCE_LIB to its path");
  return {};
}

// A read-only mapping of a whole file; empty if it cannot be opened or mapped.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st {};
    if (fstat(fd, &st) == 0 && st.st_size > 0) {
      void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (p != MAP_FAILED) {
        data_ = static_cast<const unsigned char*>(p);
        size_ = static_cast<size_t>(st.st_size);
      }
    }
    close(fd);
  }
  ~MappedFile() {
    if (data_) munmap(const_cast<unsigned char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The `count` objects of type T at byte offset `off`, or nullopt if they do not fit.
  template <typename T>
  std::optional<std::span<const T>> array_at(uint64_t off, uint64_t count) const {
    if (off > size_ || count > (size_ - off) / sizeof(T) || off % alignof(T) != 0) return std::nullopt;
    return std::span<const T>(reinterpret_cast<const T*>(data_ + off), static_cast<size_t>(count));
  }
  // The NUL-terminated string at byte `off` of the range [begin, begin + len), if terminated there.
  std::optional<std::string> string_at(uint64_t begin, uint64_t len, uint64_t off) const {
    if (begin > size_ || len > size_ - begin || off >= len) return std::nullopt;
    const char* s = reinterpret_cast<const char*>(data_ + begin + off);
    size_t n = strnlen(s, static_cast<size_t>(len - off));
    if (n == len - off) return std::nullopt;
    return std::string(s, n);
  }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// The DT_NEEDED entries (sonames) of the 64-bit ELF file at `path`, in order; empty if it
// is not one (a script, another class) or has no dynamic section. Every offset is checked
// against the file's size.
std::vector<std::string> needed_libraries(const std::string& path) {
  MappedFile file(path);
  std::vector<std::string> needed;
  auto ehdr = file.array_at<Elf64_Ehdr>(0, 1);
  if (!ehdr) return needed;
  const Elf64_Ehdr& eh = (*ehdr)[0];
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_shentsize != sizeof(Elf64_Shdr))
    return needed;
  auto sections = file.array_at<Elf64_Shdr>(eh.e_shoff, eh.e_shnum);
  if (!sections) return needed;
  for (const Elf64_Shdr& sh : *sections) {
    if (sh.sh_type != SHT_DYNAMIC || sh.sh_link >= sections->size()) continue;
    const Elf64_Shdr& strtab = (*sections)[sh.sh_link];
    auto dyn = file.array_at<Elf64_Dyn>(sh.sh_offset, sh.sh_size / sizeof(Elf64_Dyn));
    if (!dyn) continue;
    for (const Elf64_Dyn& d : *dyn) {
      if (d.d_tag == DT_NULL) break;
      if (d.d_tag != DT_NEEDED) continue;
      if (auto name = file.string_at(strtab.sh_offset, strtab.sh_size, d.d_un.d_val)) needed.push_back(*name);
    }
  }
  return needed;
}

// Is `soname` a GCC/Clang sanitizer runtime (libasan.so.8, libubsan.so.1, libtsan.so.2...)?
bool is_sanitizer_runtime(std::string_view soname) {
  for (std::string_view rt : {"libasan.so", "libhwasan.so", "libtsan.so", "liblsan.so", "libubsan.so"}) {
    if (soname.starts_with(rt)) return true;
  }
  return false;
}

// The sanitizer runtimes `lib` needs, in the order they must be preloaded: ASan's first
// (it insists on being the first object of the process), then the others as DT_NEEDED
// lists them. Bare sonames: ld.so looks them up like any DT_NEEDED entry.
std::vector<std::string> sanitizer_runtimes(const std::string& lib) {
  std::vector<std::string> runtimes;
  for (auto& soname : needed_libraries(lib)) {
    if (!is_sanitizer_runtime(soname)) continue;
    if (soname.starts_with("libasan.so")) {
      runtimes.insert(runtimes.begin(), soname);
    } else {
      runtimes.push_back(soname);
    }
  }
  return runtimes;
}

// The file execvp would run for `program` (searched in $PATH unless it has a slash);
// empty if none is found (execvp then reports the error).
std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string_view dirs = path && *path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    size_t colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) return {};
    dirs.remove_prefix(colon + 1);
  }
}

// Prepends the sanitizer runtimes that `lib` needs to `preload` and, for a program that is
// not itself built with ASan, turns ASan's leak detection off: its leaks are not uroce's.
// Returns false (after saying why) if the environment cannot be set.
bool prepare_sanitizer_runtimes(const std::string& lib, const std::string& program, std::string& preload) {
  std::vector<std::string> runtimes = sanitizer_runtimes(lib);
  for (auto it = runtimes.rbegin(); it != runtimes.rend(); ++it) preload = *it + ":" + preload;
  if (runtimes.empty() || !runtimes.front().starts_with("libasan.so")) return true;

  std::string exe = resolve_program(program);
  bool instrumented = false;
  if (!exe.empty()) {
    for (const auto& soname : needed_libraries(exe)) instrumented = instrumented || soname.starts_with("libasan.so");
  }
  const char* old = std::getenv("ASAN_OPTIONS");
  std::string options = old ? old : "";
  if (instrumented || options.find("detect_leaks") != std::string::npos) return true;
  options += options.empty() ? "detect_leaks=0" : ":detect_leaks=0";
  if (setenv("ASAN_OPTIONS", options.c_str(), 1) != 0) {
    std::perror("uroce run: setenv ASAN_OPTIONS");
    return false;
  }
  return true;
}

int cmd_run(std::span<char*> args) {
  if (!args.empty() && std::string_view(args[0]) == "--") args = args.subspan(1);
  if (args.empty()) {
    std::fputs("uroce run: missing PROGRAM\n\n", stderr);
    usage(stderr);
    return kExitUsage;
  }
  std::string lib = library_path();
  if (lib.empty()) return kExitNotFound;

  // Prepend: our definitions must come before anything else that is preloaded (except a
  // sanitizer runtime liburoce needs, which must come first of all).
  std::string preload = lib;
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;
  if (!prepare_sanitizer_runtimes(lib, args[0], preload)) return kExitCannotRun;
  if (setenv("LD_PRELOAD", preload.c_str(), 1) != 0) {
    std::perror("uroce run: setenv LD_PRELOAD");
    return kExitCannotRun;
  }

  std::vector<char*> argv(args.begin(), args.end());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());  // returns only on failure

  int err = errno;
  if (err == ENOENT) {
    std::fprintf(stderr, "uroce run: %s: command not found\n", argv[0]);
    return kExitNotFound;
  }
  std::fprintf(stderr, "uroce run: cannot execute %s: %s\n", argv[0], std::strerror(err));
  return kExitCannotRun;
}

// Prints `text` word-wrapped to 80 columns, each line indented by `indent` spaces.
void print_wrapped(std::string_view text, size_t indent) {
  constexpr size_t kWidth = 80;
  size_t col = 0;
  while (!text.empty()) {
    size_t word_end = text.find(' ');
    std::string_view word = text.substr(0, word_end);
    text = word_end == std::string_view::npos ? std::string_view{} : text.substr(word_end + 1);
    if (word.empty()) continue;
    if (col > indent && col + 1 + word.size() > kWidth) {
      std::putchar('\n');
      col = 0;
    }
    if (col == 0) {
      std::printf("%*s", int(indent), "");
      col = indent;
    } else {
      std::putchar(' ');
      ++col;
    }
    std::fwrite(word.data(), 1, word.size(), stdout);
    col += word.size();
  }
  std::putchar('\n');
}

int cmd_help_env() {
  std::puts(
      "uroce's environment variables (uroce run passes the environment through, so\n"
      "set them in front of the command, e.g. UROCE_LOG=debug uroce run PROGRAM):\n");
  bool lists_lib = false;
  for (const auto& v : uroce::core::env_var_docs()) {
    std::printf("  %s\n", v.name);
    print_wrapped(v.meaning, 6);
    std::printf("      default: %s\n", v.default_value && *v.default_value ? v.default_value : "(unset)");
    lists_lib = lists_lib || std::string_view(v.name) == "UROCE_LIB";
  }
  if (!lists_lib) {
    std::puts(
        "  UROCE_LIB\n"
        "      Path of the library that `uroce run` preloads.\n"
        "      default: ../lib/liburoce.so relative to the uroce executable");
  }
  return 0;
}

std::string gid_text(const ibv_gid& gid) {
  static constexpr unsigned char kV4Mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char buf[INET6_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET6, gid.raw, buf, sizeof buf);
  std::string text = buf;
  if (std::memcmp(gid.raw, kV4Mapped, sizeof kV4Mapped) == 0) {
    char v4[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, gid.raw + 12, v4, sizeof v4);
    text += std::string(" (IPv4 ") + v4 + ")";
  }
  return text;
}

const char* gid_type_text(ibv_gid_type t) {
  switch (t) {
    case IBV_GID_TYPE_IB:
      return "IB/RoCE v1";
    case IBV_GID_TYPE_ROCE_V1:
      return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2:
      return "RoCE v2";
  }
  return "unknown type";
}

int mtu_bytes(ibv_mtu mtu) { return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128 << mtu : 0; }

void print_port(ibv_context* ctx, uint8_t port) {
  ibv_port_attr attr{};
  if (int rc = ibv_query_port(ctx, port, &attr); rc != 0) {
    std::printf("  port %u: ibv_query_port failed: %s\n", port, std::strerror(rc));
    return;
  }
  std::printf("  port %u: %s, link layer %s, active MTU %d, UDP port (LID) %u\n", port, ibv_port_state_str(attr.state),
              attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand", mtu_bytes(attr.active_mtu),
              attr.lid);
  for (int i = 0; i < attr.gid_tbl_len; ++i) {
    ibv_gid gid{};
    if (ibv_query_gid(ctx, port, i, &gid) != 0) break;
    static constexpr ibv_gid kZero{};
    if (std::memcmp(&gid, &kZero, sizeof gid) == 0) continue;
    ibv_gid_entry entry{};
    const char* type = ibv_query_gid_ex(ctx, port, i, &entry, 0) == 0
                           ? gid_type_text(static_cast<ibv_gid_type>(entry.gid_type))
                           : "type unknown";
    std::printf("    GID[%d] %s, %s\n", i, gid_text(gid).c_str(), type);
  }
}

int cmd_devices() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    std::perror("uroce devices: ibv_get_device_list");
    return 1;
  }
  if (n == 0) std::puts("no uroce devices");
  int status = 0;
  for (int d = 0; d < n; ++d) {
    const char* name = ibv_get_device_name(list[d]);
    ibv_context* ctx = ibv_open_device(list[d]);
    if (!ctx) {
      std::printf("%s: cannot open: %s\n", name, std::strerror(errno));
      status = 1;
      continue;
    }
    ibv_device_attr attr{};
    if (ibv_query_device(ctx, &attr) == 0) {
      uint64_t guid = be64toh(ibv_get_device_guid(list[d]));
      std::printf("%s: node GUID %04x:%04x:%04x:%04x, %u port(s)\n", name, unsigned(guid >> 48),
                  unsigned(guid >> 32) & 0xffff, unsigned(guid >> 16) & 0xffff, unsigned(guid) & 0xffff,
                  attr.phys_port_cnt);
      for (uint8_t p = 1; p <= attr.phys_port_cnt; ++p) print_port(ctx, p);
    } else {
      std::printf("%s: ibv_query_device failed\n", name);
      status = 1;
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  if (n > 0) {
    std::printf(
        "\nThe UDP port (the LID) is this process's private port: every process that\n"
        "opens a device gets its own. Every process also shares the host's RoCE port\n"
        "%u (UROCE_PORT), where any QP of the host is reachable by GID and QP number\n"
        "(dlid 0).\n",
        unsigned(uroce::core::config().udp_port));
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  std::span<char*> args(argv + 1, static_cast<size_t>(argc > 0 ? argc - 1 : 0));
  if (args.empty()) {
    usage(stdout);
    return 0;
  }
  std::string_view cmd = args[0];
  args = args.subspan(1);
  if (cmd == "run") return cmd_run(args);
  if (cmd == "devices") return cmd_devices();
  if (cmd == "stats") return cmd_stats(args);
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    if (!args.empty() && std::string_view(args[0]) == "env") return cmd_help_env();
    if (!args.empty()) {
      std::fprintf(stderr, "uroce help: unknown topic '%s'\n\n", args[0]);
      usage(stderr);
      return kExitUsage;
    }
    usage(stdout);
    return 0;
  }
  std::fprintf(stderr, "uroce: unknown command '%.*s'\n\n", int(cmd.size()), cmd.data());
  usage(stderr);
  return kExitUsage;
}
