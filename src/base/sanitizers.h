// Which sanitizer this translation unit is built with, for code that must
// tell it what it cannot see (a futex lock, an eventfd hand-off). GCC says
// so with __SANITIZE_THREAD__, clang with __has_feature.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define UROCE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UROCE_TSAN 1
#endif
#endif
