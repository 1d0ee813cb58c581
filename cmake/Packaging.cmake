# `cpack -G DEB` in the build directory: one Debian package `uroce` holding what
# `cmake --install` installs (Install.cmake), under /usr. The library directory is
# GNUInstallDirs' for the configured prefix: lib/ by default, lib/x86_64-linux-gnu/ (Debian
# multiarch) when configured with -DCMAKE_INSTALL_PREFIX=/usr.
set(CPACK_PACKAGE_NAME uroce)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "uroce maintainers <uroce@example.invalid>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "RDMA verbs (RoCEv2 over UDP) without RDMA hardware")
set(CPACK_PACKAGE_DESCRIPTION
  "uroce implements the libibverbs and librdmacm C ABIs in userspace and speaks RoCEv2 over
UDP, so unmodified verbs programs run without an RDMA NIC, kernel module or root:
`uroce run -- PROGRAM` preloads liburoce; programs can also link it (pkg-config uroce,
CMake find_package(uroce)).")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# uroce.pc is configured at install time with the install prefix; DESTDIR staging makes
# that prefix /usr rather than CPack's staging directory.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
# Stripped, as Debian packages are (the build tree keeps the debug information).
set(CPACK_STRIP_FILES ON)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.invalid/uroce")
# Compiling against liburoce needs rdma-core's headers; ibverbs-utils has programs to run.
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "libibverbs-dev, librdmacm-dev, ibverbs-utils")
# Depends: computed by dpkg-shlibdeps (libc6, libstdc++6, libgcc-s1, zlib1g) when it is
# installed, else this list.
find_program(UROCE_DPKG_SHLIBDEPS dpkg-shlibdeps)
if(UROCE_DPKG_SHLIBDEPS)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
else()
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6 (>= 2.34), libgcc-s1, libstdc++6 (>= 12), zlib1g")
endif()
# liburoce.so.0 is the package's own library: list it in the package's shlibs file and
# run ldconfig on install/removal.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)

include(CPack)
