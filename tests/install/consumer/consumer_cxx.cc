// The C++ API through the installed CMake package (uroce::cxx): <uroce/uroce.hpp> compiles
// on its own in a consumer's project, and the program links and finds uroce0.
#include <infiniband/verbs.h>

#include <cstdio>
#include <cstring>
#include <uroce/uroce.hpp>

int main() {
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  bool found = false;
  for (int i = 0; list && i < num; ++i) found = found || std::strcmp(ibv_get_device_name(list[i]), "uroce0") == 0;
  if (list) ibv_free_device_list(list);
  std::printf("consumer_cxx: uroce0 %s\n", found ? "found" : "missing");
  return found ? 0 : 1;
}
