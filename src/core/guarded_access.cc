#include "core/guarded_access.h"

#include <ucontext.h>

#include <iterator>
#include <mutex>

namespace uroce::core {

#if defined(__x86_64__)

// Each routine's one instruction that may fault (label *_fault) and where it
// goes on instead (*_fixup). Leaf functions of the System V ABI: arguments in
// rdi, rsi, rdx, rcx; the direction flag is clear on entry, as rep movsb
// needs. A fault inside rep movsb leaves rcx at the bytes not yet copied.
asm(R"(
  .pushsection .text, "ax", @progbits

  .p2align 4
  .globl uroce_guarded_copy, uroce_guarded_copy_fault, uroce_guarded_copy_fixup
  .hidden uroce_guarded_copy, uroce_guarded_copy_fault, uroce_guarded_copy_fixup
  .type uroce_guarded_copy, @function
uroce_guarded_copy:
  .cfi_startproc
  endbr64
  movq %rdx, %rcx
uroce_guarded_copy_fault:
  rep movsb
uroce_guarded_copy_fixup:
  movq %rcx, %rax
  ret
  .cfi_endproc
  .size uroce_guarded_copy, . - uroce_guarded_copy

  .p2align 4
  .globl uroce_guarded_readable, uroce_guarded_readable_fault, uroce_guarded_readable_fixup
  .hidden uroce_guarded_readable, uroce_guarded_readable_fault, uroce_guarded_readable_fixup
  .type uroce_guarded_readable, @function
uroce_guarded_readable:
  .cfi_startproc
  endbr64
  leaq -1(%rdi,%rsi), %rsi
1:
uroce_guarded_readable_fault:
  movb (%rdi), %al
  orq $4095, %rdi
  addq $1, %rdi
  cmpq %rsi, %rdi
  jbe 1b
  movl $1, %eax
  ret
uroce_guarded_readable_fixup:
  xorl %eax, %eax
  ret
  .cfi_endproc
  .size uroce_guarded_readable, . - uroce_guarded_readable

  .p2align 4
  .globl uroce_guarded_fetch_add, uroce_guarded_fetch_add_fault, uroce_guarded_fetch_add_fixup
  .hidden uroce_guarded_fetch_add, uroce_guarded_fetch_add_fault, uroce_guarded_fetch_add_fixup
  .type uroce_guarded_fetch_add, @function
uroce_guarded_fetch_add:
  .cfi_startproc
  endbr64
  movq %rsi, %rax
uroce_guarded_fetch_add_fault:
  lock xaddq %rax, (%rdi)
  movq %rax, (%rdx)
  movl $1, %eax
  ret
uroce_guarded_fetch_add_fixup:
  xorl %eax, %eax
  ret
  .cfi_endproc
  .size uroce_guarded_fetch_add, . - uroce_guarded_fetch_add

  .p2align 4
  .globl uroce_guarded_compare_swap, uroce_guarded_compare_swap_fault, uroce_guarded_compare_swap_fixup
  .hidden uroce_guarded_compare_swap, uroce_guarded_compare_swap_fault, uroce_guarded_compare_swap_fixup
  .type uroce_guarded_compare_swap, @function
uroce_guarded_compare_swap:
  .cfi_startproc
  endbr64
  movq %rsi, %rax
uroce_guarded_compare_swap_fault:
  lock cmpxchgq %rdx, (%rdi)
  movq %rax, (%rcx)
  movl $1, %eax
  ret
uroce_guarded_compare_swap_fixup:
  xorl %eax, %eax
  ret
  .cfi_endproc
  .size uroce_guarded_compare_swap, . - uroce_guarded_compare_swap

  .p2align 4
  .globl uroce_guarded_load64, uroce_guarded_load64_fault, uroce_guarded_load64_fixup
  .hidden uroce_guarded_load64, uroce_guarded_load64_fault, uroce_guarded_load64_fixup
  .type uroce_guarded_load64, @function
uroce_guarded_load64:
  .cfi_startproc
  endbr64
uroce_guarded_load64_fault:
  movq (%rdi), %rax
  movq %rax, (%rsi)
  movl $1, %eax
  ret
uroce_guarded_load64_fixup:
  xorl %eax, %eax
  ret
  .cfi_endproc
  .size uroce_guarded_load64, . - uroce_guarded_load64

  .p2align 4
  .globl uroce_guarded_load32, uroce_guarded_load32_fault, uroce_guarded_load32_fixup
  .hidden uroce_guarded_load32, uroce_guarded_load32_fault, uroce_guarded_load32_fixup
  .type uroce_guarded_load32, @function
uroce_guarded_load32:
  .cfi_startproc
  endbr64
uroce_guarded_load32_fault:
  movl (%rdi), %eax
  movl %eax, (%rsi)
  movl $1, %eax
  ret
uroce_guarded_load32_fixup:
  xorl %eax, %eax
  ret
  .cfi_endproc
  .size uroce_guarded_load32, . - uroce_guarded_load32

  .p2align 4
  .globl uroce_guarded_store64, uroce_guarded_store64_fault, uroce_guarded_store64_fixup
  .hidden uroce_guarded_store64, uroce_guarded_store64_fault, uroce_guarded_store64_fixup
  .type uroce_guarded_store64, @function
uroce_guarded_store64:
  .cfi_startproc
  endbr64
uroce_guarded_store64_fault:
  movq %rsi, (%rdi)
  movl $1, %eax
  ret
uroce_guarded_store64_fixup:
  xorl %eax, %eax
  ret
  .cfi_endproc
  .size uroce_guarded_store64, . - uroce_guarded_store64

  .popsection
)");

extern "C" {
[[gnu::visibility("hidden")]] extern const char uroce_guarded_copy_fault[], uroce_guarded_copy_fixup[];
[[gnu::visibility("hidden")]] extern const char uroce_guarded_readable_fault[], uroce_guarded_readable_fixup[];
[[gnu::visibility("hidden")]] extern const char uroce_guarded_fetch_add_fault[], uroce_guarded_fetch_add_fixup[];
[[gnu::visibility("hidden")]] extern const char uroce_guarded_compare_swap_fault[], uroce_guarded_compare_swap_fixup[];
[[gnu::visibility("hidden")]] extern const char uroce_guarded_load64_fault[], uroce_guarded_load64_fixup[];
[[gnu::visibility("hidden")]] extern const char uroce_guarded_load32_fault[], uroce_guarded_load32_fixup[];
[[gnu::visibility("hidden")]] extern const char uroce_guarded_store64_fault[], uroce_guarded_store64_fixup[];
}

namespace {

struct Guarded {
  const char* fault;
  const char* fixup;
};
const Guarded kGuarded[] = {{uroce_guarded_copy_fault, uroce_guarded_copy_fixup},
                            {uroce_guarded_readable_fault, uroce_guarded_readable_fixup},
                            {uroce_guarded_fetch_add_fault, uroce_guarded_fetch_add_fixup},
                            {uroce_guarded_compare_swap_fault, uroce_guarded_compare_swap_fixup},
                            {uroce_guarded_load64_fault, uroce_guarded_load64_fixup},
                            {uroce_guarded_load32_fault, uroce_guarded_load32_fixup},
                            {uroce_guarded_store64_fault, uroce_guarded_store64_fixup}};

constexpr int kSignals[] = {SIGSEGV, SIGBUS};
// The actions found before ours, by kSignals' order. Written before our
// handler is installed, only read after.
struct sigaction g_previous[std::size(kSignals)];

const struct sigaction& previous_of(int sig) { return g_previous[sig == SIGBUS ? 1 : 0]; }

// A fault of nobody's guarded instruction, passed on as if we were not there.
void pass_on(int sig, siginfo_t* info, void* context) {
  const struct sigaction& old = previous_of(sig);
  if (old.sa_flags & SA_SIGINFO) return old.sa_sigaction(sig, info, context);
  if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) return old.sa_handler(sig);
  // (si_code > 0: the kernel's, for a fault; otherwise sent, by kill and the like)
  const bool fault = info->si_code > 0;
  if (old.sa_handler == SIG_IGN && !fault) return;  // ignored, as before
  // The default action, taken by the kernel once we return: a fault runs the
  // access again (a core dump shows it as it happened), a sent signal is
  // raised again (blocked until then). An ignored fault is fatal, as the
  // kernel makes it.
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  if (!fault) raise(sig);
}

void on_fault(int sig, siginfo_t* info, void* context) {
  auto* uc = static_cast<ucontext_t*>(context);
  greg_t& ip = uc->uc_mcontext.gregs[REG_RIP];
  if (info->si_code > 0) {
    for (const Guarded& g : kGuarded) {
      if (ip == reinterpret_cast<greg_t>(g.fault)) {
        ip = reinterpret_cast<greg_t>(g.fixup);
        return;
      }
    }
  }
  pass_on(sig, info, context);
}

void install() noexcept {
  struct sigaction ours = {};
  ours.sa_sigaction = on_fault;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    // Read first, then replace: sigaction's own copy of the old action is
    // written only after ours is in place.
    sigaction(kSignals[i], nullptr, &g_previous[i]);
    sigaction(kSignals[i], &ours, nullptr);
  }
}

}  // namespace

void arm_fault_guard() noexcept {
  static std::once_flag once;
  std::call_once(once, install);
}

#else

void arm_fault_guard() noexcept {}

#endif

void blockable_signals(sigset_t* set) noexcept {
  sigfillset(set);
  sigdelset(set, SIGSEGV);
  sigdelset(set, SIGBUS);
}

}  // namespace uroce::core
