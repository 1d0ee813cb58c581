# What `cmake --install build --prefix P` puts into P besides the targets' own install()
# rules (liburoce in src/, the `uroce` launcher in tools/):
#   P/include/uroce/                     the C++ API headers (when include/uroce exists)
#   P/<libdir>/pkgconfig/uroce.pc        pkg-config --cflags --libs uroce
#   P/<libdir>/cmake/uroce/              find_package(uroce CONFIG): uroce::uroce, uroce::cxx
# P is the prefix given at install time, not the one configured. The installed tree can
# move afterwards (the launcher and the CMake package find their files relative to
# themselves) except uroce.pc, which names P. The static layer libraries (uroce_wire,
# uroce_core, ...) and the tests are not installed; liburoce links them in.
include(CMakePackageConfigHelpers)

set(UROCE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/uroce)

# The C++ API (include/uroce/*.hpp, written against the public C ABI only).
if(EXISTS ${PROJECT_SOURCE_DIR}/include/uroce)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/uroce DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()
# uroce::cxx: the headers plus liburoce. Exported through a target of its own, so that the
# build tree's uroce_cxx keeps pointing at the source tree's include/.
if(TARGET uroce_cxx)
  add_library(uroce_cxx_installed INTERFACE)
  set_target_properties(uroce_cxx_installed PROPERTIES EXPORT_NAME cxx)
  target_include_directories(uroce_cxx_installed INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(uroce_cxx_installed INTERFACE cxx_std_20)
  target_link_libraries(uroce_cxx_installed INTERFACE uroce)
  install(TARGETS uroce_cxx_installed EXPORT uroceTargets)
endif()

# CMake package: uroceTargets.cmake (from the EXPORT sets above and in src/), the config
# file and its version file.
install(EXPORT uroceTargets NAMESPACE uroce:: DESTINATION ${UROCE_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/uroceConfig.cmake.in
  ${PROJECT_BINARY_DIR}/uroceConfig.cmake INSTALL_DESTINATION ${UROCE_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/uroceConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/uroceConfig.cmake ${PROJECT_BINARY_DIR}/uroceConfigVersion.cmake
  DESTINATION ${UROCE_CMAKE_DIR})

# pkg-config: uroce.pc names its prefix absolutely (as Debian's .pc files do), so it is
# configured when installing, with the prefix of that install (cmake --install --prefix P,
# or /usr inside the .deb; Packaging.cmake sets CPACK_SET_DESTDIR for that).
set(UROCE_PC_FILE ${PROJECT_BINARY_DIR}/uroce.pc)
install(CODE "
  set(UROCE_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(UROCE_PC_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
  set(UROCE_PC_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
  set(UROCE_PC_VERSION \"${PROJECT_VERSION}\")
  configure_file(\"${CMAKE_CURRENT_LIST_DIR}/uroce.pc.in\" \"${UROCE_PC_FILE}\" @ONLY)")
install(FILES ${UROCE_PC_FILE} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
