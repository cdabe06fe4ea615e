# Installation: libtdist (shared and static), the public headers, the tools, a CMake package
# (find_package(tdist) gives tdist::tdist and tdist::tdist_static) and a pkg-config file.
include(CMakePackageConfigHelpers)

install(TARGETS tdist tdist_static EXPORT tdistTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tdist DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(TDIST_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tdist)
install(EXPORT tdistTargets NAMESPACE tdist:: DESTINATION ${TDIST_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tdistConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tdistConfig.cmake INSTALL_DESTINATION ${TDIST_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tdistConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tdistConfig.cmake ${PROJECT_BINARY_DIR}/tdistConfigVersion.cmake
  DESTINATION ${TDIST_CMAKE_DIR})

file(RELATIVE_PATH TDIST_PC_TO_PREFIX "/root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/root")
# pkg-config --static: the static library's private dependencies, MPI's libraries included.
set(TDIST_PC_LIBS_PRIVATE "-lpthread -lm -lrt -ldl ${OPENSSL_CRYPTO_LIBRARY}")
if(TDIST_HAVE_MPI)
  foreach(lib IN LISTS MPI_C_LIBRARIES)
    string(APPEND TDIST_PC_LIBS_PRIVATE " ${lib}")
  endforeach()
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/tdist.pc.in ${PROJECT_BINARY_DIR}/tdist.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/tdist.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
