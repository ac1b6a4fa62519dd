# Installs headers, the library and a CMake package so that downstream projects can do
#   find_package(quintet) and target_link_libraries(app quintet::quintet).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# quintet_api (quintet::api) carries the include folder and the public dependencies of quintet.
set(_quintet_exported quintet quintet_api)
if(QUINTET_HAS_NCCL)
  list(APPEND _quintet_exported quintet_nccl)
endif()
install(TARGETS ${_quintet_exported} EXPORT quintetTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/quintet DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/include/quintet/core/config.hpp
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/quintet/core)
install(EXPORT quintetTargets NAMESPACE quintet:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/quintet)
install(FILES cmake/FindNCCL.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/quintet)

configure_package_config_file(cmake/quintetConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/quintetConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/quintet)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/quintetConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/quintetConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/quintetConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/quintet)
